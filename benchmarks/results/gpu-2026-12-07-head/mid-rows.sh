#!/usr/bin/env bash
# The next device call (under 10 minutes): mla-moe-16b's 257-token tree verify through the grouped MoE kernels at 16, 32
# and 64 rows per block (issue 20). 1) the tile sweep at 257 tokens (within SWEEP_S, 170 s), the tiles swept again at
# each rows per block (`moe_tile_sweep.py --block-rows 16,32`, or ROWS); 2) the engine's AR and DDTree-256 steps, the
# head's tiling (A) against the sweep's fastest through `with_moe_one_token.py mid:...` (B), A B and, if BUDGET_S (560
# s) leaves time, A B again, each a process of its own; 3) if time is left, the kernel profile of DDTree-256 at the
# head's tiling. Run from the repository root with specdeploy importable and OUT and COMMIT set; everything is packed
# into $OUT/results.tgz after each step.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
R="${RAW:-$OUT/r}"; mkdir -p "$R"  # RAW: the raw files' folder, which both.sh keeps out of $OUT
T0=$(date +%s)
pack() { sed -i "s#$PWD/##g; s#$OUT/##g; s#$R/##g" "$R"/*.txt "$R"/*.json 2>/dev/null; tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$R/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
timeout "${SWEEP_S:-170}" python3 benchmarks/moe_tile_sweep.py --shapes mla-moe-16b --tokens 257 --block-rows "${ROWS:-16,32}" \
  --out "$R/moe_sweep_257.json" > "$R/moe_sweep_257.txt" 2>&1; cat "$R/moe_sweep_257.txt"; pack
MID=$(python3 - "$R/moe_sweep_257.json" <<'PY'
import json, sys
entry = json.load(open(sys.argv[1]))["shapes"]["mla-moe-16b"]["tokens"]["257"]
options = {entry["block_m"]: (entry["tuned_ms"], entry["tuned"])}
options.update({int(m): (s["tuned_ms"], s["tuned"]) for m, s in entry["swept_at_block_m"].items()})
rows, (ms, tiles) = min(options.items(), key=lambda item: item[1][0])
print(f"mid:{rows}x" + "/".join("x".join(str(v) for v in t) for t in tiles))
PY
)
echo "fastest at 257 tokens: $MID"; echo "$MID" > "$R/mid_setting.txt"
engine() {  # $1: label, then with_moe_one_token settings or nothing
    local label=$1; shift
    local cmd=(benchmarks/ddtree_side_by_side.py --engine-only --shape mla-moe-16b --modes ar,ddtree-256
               --commit "$COMMIT" --out "$R/engine_$label.json")
    if [ $# -gt 0 ]; then cmd=(benchmarks/with_moe_one_token.py "$1" "${cmd[@]}"); fi
    # 100 s: on 2026-12-07, with 75 s, the call's first engine process printed its AR step only
    timeout 100 python3 "${cmd[@]}" > "$R/engine_$label.txt" 2>&1
    grep -E "^engine" "$R/engine_$label.txt" | sed "s/^/$label /"; pack
}
left() { echo $((${BUDGET_S:-560} - $(date +%s) + T0)); }
if [ -n "$MID" ]; then
    engine head_1; engine mid_1 "$MID"
    if [ "$(left)" -gt 160 ]; then engine head_2; engine mid_2 "$MID"; fi
fi
left=$(left)
if [ "$left" -gt 60 ]; then
    timeout "$left" python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ddtree-256 --steps 4 \
      --out "$R/profile_ddtree-256_$COMMIT.json" > "$R/profile_ddtree-256_$COMMIT.txt" 2>&1
    grep -v -i warn "$R/profile_ddtree-256_$COMMIT.txt" | head -40; pack
fi
