#!/usr/bin/env bash
# Start-up always ends: the trainer reads only regular files where a file of flags or data is
# expected, bounds --config's size, and a stop signal interrupts a start-up read that blocks.
#   - --config a named pipe, a device (/dev/null) or a file over 1 MiB, --train-data a named pipe:
#     refused in one line at once (before: a pipe blocked forever, /dev/zero was read for ever);
#   - SIGTERM while start-up blocks reading --init-from from a named pipe whose writer stays open
#     ends the command at once: exit 0, "received SIGTERM during start-up: stopped before
#     training, nothing written", no --out-dir created;
#   - the first SIGINT there says it ends the command (not "stopping after this step") and does so.
# usage: start_up_reads.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

common=(--train-data "$ref/train.bin" --val-every 0 --batch-size 2 --seq-len 32 --max-steps 1)
# expect_refused NAME PATTERN FLAGS...: within 20 s, a non-zero exit with one line on stderr
# matching PATTERN.
expect_refused() {
  local name=$1 pattern=$2 status=0
  shift 2
  timeout -s KILL 20 "$bin" "$@" >"$tmp/refused.log" 2>"$tmp/refused.err" || status=$?
  [ "$status" -ne 137 ] || { fail "$name: still running after 20 s"; return; }
  [ "$status" -ne 0 ] || { fail "$name: exited 0"; return; }
  { [ "$(wc -l <"$tmp/refused.err")" -eq 1 ] && grep -qE "$pattern" "$tmp/refused.err"; } ||
    fail "$name: expected one line matching '$pattern', got: $(cat "$tmp/refused.err")"
}

mkfifo "$tmp/pipe"
expect_refused "--config a named pipe" "^error: --config $tmp/pipe: is a named pipe, expected a JSON file" \
  --config "$tmp/pipe" --init-from "$ref/model.bin" "${common[@]}" --out-dir "$tmp/out"
expect_refused "--config /dev/null" "^error: --config /dev/null: is not a regular file, expected a JSON file" \
  --config /dev/null --init-from "$ref/model.bin" "${common[@]}" --out-dir "$tmp/out"
truncate -s 2M "$tmp/big.json"
expect_refused "--config of 2 MiB" "^error: --config $tmp/big.json: 2097152 bytes, more than the 1048576" \
  --config "$tmp/big.json" --init-from "$ref/model.bin" "${common[@]}" --out-dir "$tmp/out"
with_flags common --train-data "$tmp/pipe"
expect_refused "--train-data a named pipe" "^error: --train-data: $tmp/pipe: not a regular file" \
  --init-from "$ref/model.bin" "${flags[@]}" --out-dir "$tmp/out"
[ ! -e "$tmp/out" ] || fail "a refused run created --out-dir"

# signal_while_blocked NAME SIGNAL: the trainer blocks reading --init-from from the named pipe,
# whose writer (this script) stays open and writes nothing; SIGNAL must end it. Sets status.
signal_while_blocked() {
  local name=$1 signal=$2 pid
  "$bin" --init-from "$tmp/pipe" "${common[@]}" --out-dir "$tmp/$name" >"$tmp/$name.log" 2>"$tmp/$name.err" &
  pid=$!
  exec 3>"$tmp/pipe"  # returns once the trainer has opened the pipe: it is in start-up
  sleep 0.5           # and reading from it
  kill "-$signal" "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null && fail "$name: SIG$signal did not end a start-up blocked on a read within 10 s"
  status=0
  wait "$pid" || status=$?
  exec 3>&-
  [ ! -e "$tmp/$name" ] || fail "$name: --out-dir was created"
}

signal_while_blocked term TERM
[ "$status" -eq 0 ] || fail "SIGTERM while blocked: exit status $status, expected 0"
grep -qx "received SIGTERM during start-up: stopped before training, nothing written" "$tmp/term.log" ||
  fail "SIGTERM while blocked: $(tail -n 1 "$tmp/term.log")"

signal_while_blocked int INT
[ "$status" -eq 0 ] || fail "SIGINT while blocked: exit status $status, expected 0"
grep -q "^SIGINT: ending the command during its start-up, nothing written" "$tmp/int.err" ||
  fail "SIGINT during start-up said: $(grep SIGINT "$tmp/int.err")"
grep -qx "received SIGINT during start-up: stopped before training, nothing written" "$tmp/int.log" ||
  fail "SIGINT while blocked: $(tail -n 1 "$tmp/int.log")"

[ "$failures" -eq 0 ] && echo "start_up_reads: all checks passed"
[ "$failures" -eq 0 ]
