#!/usr/bin/env bash
# Device call 2: run-3.sh's Qwen3-8B part resumed on the same warm machine (its campaign skips finished cells), then
# its summary lines. Run from the repository root with specdeploy importable and OUT set.
set -u
: "${OUT:?set OUT}"
R=$OUT/r; mkdir -p "$R"
OUT=$R PART=qwen3-8b LIMIT=400 bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
cat "$R/log-qwen3-8b.txt"; tail -5 "$R/campaign-qwen3-8b.log"
python3 - "$R/report-qwen3-8b-random-auto.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
by = {(r["concurrency"], r["budget"] == "auto"): r for r in rows}
for c in sorted({r["concurrency"] for r in rows}):
    ar, auto = by[c, False], by[c, True]
    print(f"c={c}: AR {ar['output_tok_s']:.1f} auto {auto['output_tok_s']:.1f} tok/s, auto / AR "
          f"{auto['output_tok_s'] / ar['output_tok_s']:.3f}, paired {auto['speedup']}, AR share {auto['ar_step_share']}")
PY
sed -i "s#$PWD/##g" "$R"/*.txt "$R"/*.json "$R"/*.log; tar czf "$OUT/results.tgz" -C "$R" .
