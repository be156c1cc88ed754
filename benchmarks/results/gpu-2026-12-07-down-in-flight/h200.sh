#!/usr/bin/env bash
# Issue 20's H200 call (under 10 minutes), which does nothing on any other card: on an H100 both changes were measured
# (`../gpu-2026-12-07-h100-both/`), and its bars name the H200. 1) `run.sh` (the patched one-token down kernel against
# this tree's, the AR step before and after) within half of BUDGET_S (560 s), into $OUT/down; 2) every mode of
# mla-moe-16b at this tree, then of the Kimi shape the card holds, within what is left, into $OUT/head. Run from the
# repository root with specdeploy importable and OUT and COMMIT set; $OUT receives down/results.tgz and head/*.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
T0=$(date +%s)
left() { echo $((${BUDGET_S:-560} - $(date +%s) + T0)); }
card=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case "$card" in *H200*) ;; *) echo "$card is not an H200: nothing run"; exit 0 ;; esac
mkdir -p "$OUT/down" "$OUT/head"
RAW=$(mktemp -d) OUT="$OUT/down" BUDGET_S=$(( $(left) / 2 )) SWEEP_S=100 bash benchmarks/results/gpu-2026-12-07-down-in-flight/run.sh
shape=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from gpu_kimi_roofline import kimi_shape; print(kimi_shape())")
for s in mla-moe-16b "$shape"; do
    [ "$(left)" -gt 40 ] || break
    timeout "$(left)" python3 benchmarks/ddtree_side_by_side.py --engine-only --shape "$s" \
      --modes ar,dflash,ddtree-16,ddtree-64,ddtree-256 --commit "$COMMIT" --out "$OUT/head/engine_$s.json" \
      > "$OUT/head/engine_$s.txt" 2>&1
    tail -7 "$OUT/head/engine_$s.txt"
done
sed -i "s#$OUT/##g" "$OUT"/head/* 2>/dev/null
echo "seconds used in all: $(( $(date +%s) - T0 ))"
