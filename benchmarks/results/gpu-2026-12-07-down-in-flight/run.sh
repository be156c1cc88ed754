#!/usr/bin/env bash
# Device call (under 10 minutes): one token's down kernel with every expert pair's tile, and the shared expert's as
# segments of one expert's width, in one load each (`down-in-flight.patch`, issue 20), against this tree's kernel, which
# loops over the pairs. The patch is laid over a copy of the tree (/tmp/after). 1) the one-token sweep of the patched
# down kernel's tiles on mla-moe-16b, gate|up fixed at the default (within SWEEP_S, 120 s); 2) mla-moe-16b's AR step,
# before (this tree) and after (the patch, at the sweep's fastest down tiles), B A, each a process of its own; 3) the
# patched tree's GPU tests of the kernel and of fp32 decoding in the DeepSeek family, if more than 60 s of BUDGET_S (560
# s) are left; B A again if it leaves time; 4) the Kimi shape the card holds (`gpu_kimi_roofline.kimi_shape`), its AR
# step before and after, if time is left. Run from the repository root with specdeploy importable and OUT and COMMIT
# set; everything is packed into $OUT/results.tgz after each step.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
R="${RAW:-$OUT/r}"; mkdir -p "$R"  # RAW: the raw files' folder, which both.sh and h200.sh keep out of $OUT
T0=$(date +%s)
HERE=benchmarks/results/gpu-2026-12-07-down-in-flight
pack() { sed -i "s#$PWD/##g; s#$OUT/##g; s#$R/##g; s#/tmp/after/##g" "$R"/*.txt "$R"/*.json 2>/dev/null; tar czf "$OUT/results.tgz" -C "$R" .; }
left() { echo $((${BUDGET_S:-560} - $(date +%s) + T0)); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$R/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
PATCH="$PWD/$HERE/down-in-flight.patch"
mkdir -p /tmp/after && cp -r src tests benchmarks /tmp/after/ || exit 1
(cd /tmp/after && { patch -p1 < "$PATCH" || git apply "$PATCH"; }) || { echo "the patch did not apply"; exit 1; }
GATE_UP=$(python3 -c "from specdeploy.engine import triton_moe; print('x'.join(map(str, triton_moe.ONE_TOKEN[0])))")
(cd /tmp/after && PYTHONPATH="/tmp/site:$PWD/src" timeout "${SWEEP_S:-120}" python3 benchmarks/moe_tile_sweep.py \
  --one-token --shapes mla-moe-16b --gate-up "$GATE_UP" --out "$R/down_sweep.json" > "$R/down_sweep.txt" 2>&1)
grep -E "one token:|bandwidth" "$R/down_sweep.txt" || tail -5 "$R/down_sweep.txt"; pack
BEST=$(grep -o "settings [^ ,]*" "$R/down_sweep.txt" | tail -1 | cut -d' ' -f2)
echo "fastest: $BEST" | tee "$R/best_setting.txt"
engine() {  # $1 tree, $2 label, $3 shape, $4 time limit, then with_moe_one_token settings or nothing
    local tree=$1 label=$2 shape=$3 limit=$4; shift 4
    local cmd=(benchmarks/ddtree_side_by_side.py --engine-only --shape "$shape" --modes ar --commit "$label"
               --out "$R/engine_${shape}_$label.json")
    if [ $# -gt 0 ] && [ -n "$1" ]; then cmd=(benchmarks/with_moe_one_token.py "$1" "${cmd[@]}"); fi
    (cd "$tree" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$limit" python3 "${cmd[@]}" > "$R/engine_${shape}_$label.txt" 2>&1)
    echo "$shape $label:"; grep -E "^(engine|ar) " "$R/engine_${shape}_$label.txt" || tail -3 "$R/engine_${shape}_$label.txt"; pack
}
engine . "before-1" mla-moe-16b 50
engine /tmp/after "after-1" mla-moe-16b 50 "$BEST"
if [ "$(left)" -gt 60 ]; then
    (cd /tmp/after && PYTHONPATH="/tmp/site:$PWD/src" timeout "$(( $(left) < 100 ? $(left) : 100 ))" python3 -m pytest \
      -q -m gpu -p no:cacheprovider tests/test_gpu_fastpath.py tests/test_decode_gpu.py \
      -k "one_token or (fp32 and (deepseek or kimi))" > "$R/gpu_tests_after.txt" 2>&1)
    tail -3 "$R/gpu_tests_after.txt"; pack
fi
if [ "$(left)" -gt 100 ]; then
    engine . "before-2" mla-moe-16b 50
    engine /tmp/after "after-2" mla-moe-16b 50 "$BEST"
fi
shape=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from gpu_kimi_roofline import kimi_shape; print(kimi_shape())")
if [ "$(left)" -gt 190 ]; then
    engine . "before-1" "$shape" 90
    engine /tmp/after "after-1" "$shape" 90 "$BEST"
fi
echo "seconds used: $(( $(date +%s) - T0 ))"; pack
