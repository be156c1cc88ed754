#!/usr/bin/env bash
# Device call 1 (about 7 minutes): issue 21's tiny-code campaign,
# `../gpu-2026-12-05-auto-head/run.sh` with PART=tiny-code (HumanEval, AR and DDTree 16 / 64 / auto at c = 1, 16,
# 64, 5 s cells, two rounds). Run from the repository root with the wheels of `.whl/` installed, specdeploy
# importable and OUT set.
set -u
: "${OUT:?set OUT}"
OUT="$OUT" PART=tiny-code LIMIT="${LIMIT:-470}" bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
cat "$OUT/log-tiny-code.txt"; tail -5 "$OUT/campaign-tiny-code.log"
sed -i "s#$PWD/##g" "$OUT"/*.log 2>/dev/null
