#!/usr/bin/env bash
# Device call 5 (under 8 minutes, one H200): issue 21's Qwen3-8B part at the head (exploring beside AR steps backs
# off on a GPU: `../gpu-2026-12-05-auto-head/run.sh`, PART=qwen3-8b, AR against auto, 12 s cells, with each
# concurrency's auto / AR printed), then every mode of mla-moe-16b at the new one-token MoE tiles
# (`gpu_kimi_roofline.py --skip-tests --shapes mla-moe-16b`), then the DeepSeek and Kimi float32 greedy decoding
# tests on CUDA. Run from the repository root with the wheels of `.whl/` installed, specdeploy importable, and OUT
# and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
R="$OUT/r"; mkdir -p "$R"
pack() { sed -i "s#$PWD/##g" "$R"/*.log "$R"/*.txt "$R"/*.json "$R"/kimi/* 2>/dev/null; tar czf "$OUT/results.tgz" -C "$R" .; }
OUT="$R" PART=qwen3-8b LIMIT="${LIMIT:-260}" bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
cat "$R/log-qwen3-8b.txt"
python3 - "$R/report-qwen3-8b-random-auto.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
by = {(r["concurrency"], r["budget"] == "auto"): r for r in rows}
for c in sorted({r["concurrency"] for r in rows}):
    ar, auto = by[c, False], by[c, True]
    print(f"c={c}: AR {ar['output_tok_s']:.1f} auto {auto['output_tok_s']:.1f} tok/s, auto / AR "
          f"{auto['output_tok_s'] / ar['output_tok_s']:.3f}, paired {auto['speedup']}, AR share {auto['ar_step_share']}")
PY
pack
OUT="$R/kimi" timeout 120 python3 benchmarks/gpu_kimi_roofline.py --commit "$COMMIT" --skip-tests --shapes mla-moe-16b \
  > "$R/kimi_roofline.log" 2>&1
grep -E "^(mode|ar|dflash|ddtree)" "$R/kimi_roofline.log"; pack
timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode_gpu.py -k "fp32 and (deepseek or kimi)" \
  > "$R/gpu_decode_tests.log" 2>&1; tail -2 "$R/gpu_decode_tests.log"; pack
