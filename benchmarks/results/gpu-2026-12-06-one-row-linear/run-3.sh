#!/usr/bin/env bash
# Device call (about 9 minutes): this work against $BEFORE (this tree with ab_before/ laid over it: the files of src
# that differ at $BEFORE, in their $BEFORE version): mla-moe-16b's AR step of each tree in turn, twice, each a
# process of its own; every mode's step at $COMMIT (DFlash, DDTree-64 and DDTree-256 verify many rows: their
# projections stay cuBLAS's); the one-row projection's tile sweep, then the AR step at its fastest tiles for
# mla-moe-16b. Run from the repository root with OUT, COMMIT and BEFORE set; $OUT/results.tgz is packed after each
# step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
mkdir -p /tmp/before && cp -r src benchmarks /tmp/before/ && cp -r ab_before/. /tmp/before/
side() {  # $1 tree, $2 label, $3 setting (or - for the defaults), $4 modes, $5 time limit
  local run=(python3 benchmarks/ddtree_side_by_side.py)
  [ "$3" != - ] && run=(python3 benchmarks/with_moe_one_token.py "$3" benchmarks/ddtree_side_by_side.py)
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$5" "${run[@]}" --engine-only --shape mla-moe-16b \
    --modes "$4" --commit "$2" --out "$R/engine_mla-moe-16b_$2.json" > "$R/engine_mla-moe-16b_$2.log" 2>&1)
  echo "$2:"; grep -E "^engine |^(ar|dflash|ddtree)" "$R/engine_mla-moe-16b_$2.log" || tail -1 "$R/engine_mla-moe-16b_$2.log"
  pack
}
side /tmp/before "$BEFORE-1" - ar 75
side . "$COMMIT-1" - ar 75
side /tmp/before "$BEFORE-2" - ar 45
side . "$COMMIT-2" - ar 45
side . "$COMMIT-modes" - ar,dflash,ddtree-64,ddtree-256 110
timeout 140 python3 benchmarks/one_row_linear_sweep.py --shapes mla-moe-16b,kimi --out "$R/linear_sweep.json" \
  > "$R/linear_sweep.log" 2>&1
cat "$R/linear_sweep.log"; pack
best=$(python3 -c "import json; t=min(json.load(open('$R/linear_sweep.json'))['shapes']['mla-moe-16b']['tiles'], key=lambda r: r['us'])['tiles']; print('linear' + 'x'.join(map(str, t)))")
[ -n "$best" ] && side . "$COMMIT-$best" "$best" ar 45
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log; pack
