#!/usr/bin/env bash
# Turns ptxas -v logs into one table: kernel, architecture, registers, spill bytes, shared
# memory, stack. Exits non-zero if any kernel spills registers.
# usage: ptx_report.sh OUTPUT LOG...
set -euo pipefail
out=$1; shift
mkdir -p "$(dirname "$out")"
awk '
  /Compiling entry function/ {
    match($0, /function .[^ ]+. for .sm_[0-9a-z]+./);
    split(substr($0, RSTART, RLENGTH), f, /\047/); kernel = f[2]; arch = f[4]; next }
  /bytes stack frame/ && kernel != "" { stack[kernel, arch] = $1; spill_st[kernel, arch] = $5; spill_ld[kernel, arch] = $9; next }
  /Used [0-9]+ registers/ && kernel != "" {
    regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs);
    smem = 0; if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
    key = kernel SUBSEP arch
    if (!(key in seen)) { seen[key] = 1; order[++n] = key }
    registers[key] = regs; shared[key] = smem; kernel = "" }
  END {
    for (i = 1; i <= n; i++) { split(order[i], k, SUBSEP);
      printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k[1], k[2], registers[order[i]], spill_st[order[i]] + 0, spill_ld[order[i]] + 0, shared[order[i]], stack[order[i]] + 0 } }
' "$@" | sort -u | c++filt | sort -t$'\t' -k1,1 -k2,2 > "$out.tsv"
{
  printf '%-90s %-7s %5s %6s %6s %7s %6s\n' kernel arch regs spillS spillL smem stack
  while IFS=$'\t' read -r kernel arch regs st ld smem stack; do
    [ ${#kernel} -gt 90 ] && kernel="${kernel:0:87}..."
    printf '%-90s %-7s %5s %6s %6s %7s %6s\n' "$kernel" "$arch" "$regs" "$st" "$ld" "$smem" "$stack"
  done < "$out.tsv"
} > "$out"
kernels=$(wc -l < "$out.tsv")
spilling=$(awk -F'\t' '$4 > 0 || $5 > 0' "$out.tsv" | wc -l)
echo "ptx-report: $kernels kernel builds (kernel × arch) → $out; $spilling spill registers"
if [ "$spilling" -gt 0 ]; then
  awk -F'\t' '$4 > 0 || $5 > 0 { print "  spills: " $1 " (" $2 "): " $4 " bytes stored, " $5 " loaded" }' "$out.tsv"
  exit 1
fi
