#!/usr/bin/env bash
# --recompute end to end: the setting reaches the model (the start-up summary reports the
# activation bytes of the chosen setting, which shrink from 0 to 3), every setting trains to
# bit-identical step lines, metrics and model.bin (bf16 and fp32, with gradient accumulation),
# with two ranks at ZeRO 1 and 2 the settings 0 and 3 train to the same model.bin and metrics,
# and bad values fail with one line naming the flag.
# usage: cli_recompute.sh cpu|gpu   (uses the tiny reference that `make test` builds)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"

# Step and validation lines without the timing fields (ms, tok/s, ETA).
steps() { grep -E '^step ' "$1" | cut -d'|' -f1-4; }
# From the summary line "activations at --recompute R: blocks X MiB, logits and buffers Y MiB;
# blocks at --recompute 0: A MiB, 1: B MiB, 2: C MiB, 3: D MiB":
summary() { grep -E '^activations at --recompute ' "$1"; }
run_setting() { summary "$1" | sed -E 's/^activations at --recompute ([0-9]+):.*/\1/'; }
run_blocks() { summary "$1" | sed -E 's/^[^;]*: blocks ([0-9.]+) MiB,.*/\1/'; }
listed_blocks() { summary "$1" | sed -E 's/.*; blocks at --recompute //' | tr ',' '\n' | sed -nE "s/^ ?$2: ([0-9.]+) MiB$/\1/p"; }

for dtype in bf16 fp32; do
  for r in 0 1 2 3; do
    out=$tmp/$dtype$r
    if ! "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --dtype "$dtype" \
        --batch-size 2 --seq-len 32 --total-batch-tokens 128 --max-steps 2 --warmup-steps 1 --lr 1e-3 \
        --val-every 2 --val-steps 1 --recompute "$r" --out-dir "$out" >"$out.log" 2>&1; then
      fail "$dtype --recompute $r exited non-zero"; cat "$out.log"; continue
    fi
    grep -qE "^  recompute +$r\$" "$out.log" || fail "$dtype --recompute $r: not in the config summary"
    [ "$(run_setting "$out.log")" = "$r" ] || fail "$dtype --recompute $r: summary: $(summary "$out.log")"
    blocks=$(run_blocks "$out.log")
    [[ -n $blocks && $blocks = "$(listed_blocks "$out.log" "$r")" ]] ||
      fail "$dtype --recompute $r: the run's blocks are not its setting's entry: $(summary "$out.log")"
    [ "$(steps "$out.log" | wc -l)" -eq 3 ] || fail "$dtype --recompute $r: expected 2 step lines and 1 validation line"
    if [ "$r" -gt 0 ]; then
      base=$tmp/${dtype}0
      [ "$(steps "$out.log")" = "$(steps "$base.log")" ] || fail "$dtype --recompute $r: step lines differ from 0"
      diff <(cut -d, -f1-4 "$out/metrics.jsonl") <(cut -d, -f1-4 "$base/metrics.jsonl") >/dev/null ||
        fail "$dtype --recompute $r: metrics.jsonl losses/norms differ from 0"
      cmp -s "$out/model.bin" "$base/model.bin" || fail "$dtype --recompute $r: model.bin differs from --recompute 0"
    fi
  done
  # Fewer bytes at 3 than at 0 (MiB with one decimal: too coarse to order 1 and 2 on the tiny model).
  b0=$(run_blocks "$tmp/${dtype}0.log"); b3=$(run_blocks "$tmp/${dtype}3.log")
  awk -v a="$b0" -v b="$b3" 'BEGIN { exit !(b < a) }' || fail "$dtype: blocks at 3 ($b3 MiB) not below 0 ($b0 MiB)"
done

# Data parallel (CPU build under mpirun): recomputation leaves ZeRO's sharded gradients and
# updates bit-identical, with gradient accumulation (2 ranks x 1 row x 2 micro-steps).
if [ "$mode" = cpu ] && command -v mpirun >/dev/null; then
  mpi_opts=(--oversubscribe -x SIMT_THREADS=1)
  [ "$(id -u)" -eq 0 ] && mpi_opts+=(--allow-run-as-root)
  for zero in 1 2; do
    failures_before=$failures
    for r in 0 3; do
      mpirun "${mpi_opts[@]}" -np 2 "$bin" --init-from "$ref/model.bin" --train-data "$ref/train.bin" \
        --val-data "$ref/train.bin" --batch-size 1 --seq-len 32 --total-batch-tokens 128 --max-steps 4 \
        --val-every 2 --val-steps 1 --zero "$zero" --recompute "$r" --out-dir "$tmp/zero${zero}_$r" \
        >"$tmp/zero${zero}_$r.log" 2>&1 || fail "zero $zero, recompute $r: run failed (see $tmp/zero${zero}_$r.log)"
    done
    cmp -s "$tmp/zero${zero}_0/model.bin" "$tmp/zero${zero}_3/model.bin" || fail "zero $zero: model.bin differs between 0 and 3"
    diff -q <(cut -d, -f1-4 "$tmp/zero${zero}_0/metrics.jsonl") <(cut -d, -f1-4 "$tmp/zero${zero}_3/metrics.jsonl") \
      >/dev/null || fail "zero $zero: metrics differ between 0 and 3"
    [ "$failures" -eq "$failures_before" ] &&
      echo "ok: 2 ranks, ZeRO $zero: recompute 0 and 3 give the same model.bin and metrics"
  done
fi

# Bad values: one line naming the flag and the allowed range; nothing runs.
bad() {
  local what=$1; shift
  if "$bin" "$@" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --out-dir "$tmp/bad" \
      >"$tmp/bad.out" 2>"$tmp/bad.err"; then
    fail "$what: exit status 0"; return
  fi
  [ "$(grep -c . "$tmp/bad.err")" -eq 1 ] || { fail "$what: expected one line, got: $(cat "$tmp/bad.err")"; return; }
  grep -qF "expected an integer in [0, 3]" "$tmp/bad.err" || fail "$what: message lacks the range: $(cat "$tmp/bad.err")"
  grep -qF "recompute" "$tmp/bad.err" || fail "$what: message does not name the flag: $(cat "$tmp/bad.err")"
  [ -e "$tmp/bad" ] && fail "$what: created --out-dir"
  echo "ok: $what: $(cat "$tmp/bad.err")"
}
bad "--recompute 4" --recompute 4
bad "--recompute -1" --recompute -1
bad "--recompute two" --recompute two
printf '{"recompute": 1.5}\n' >"$tmp/bad.json"
bad "JSON recompute 1.5" --config "$tmp/bad.json"

[ "$failures" -eq 0 ] && echo "cli_recompute: all checks passed"
[ "$failures" -eq 0 ]
