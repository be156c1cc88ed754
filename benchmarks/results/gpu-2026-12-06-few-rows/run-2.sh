#!/usr/bin/env bash
# Device call (about 9 minutes): issue 21's tiny-code campaign at the head (`../gpu-2026-12-05-auto-head/run.sh`,
# PART=tiny-code: AR and DDTree 16 / 64 / auto at c = 1, 16, 64, HumanEval, 128 new tokens, 5 s cells, two rounds).
# Run from the repository root with OUT set; the files land in $OUT/c.
set -u
OUT=$OUT/c PART=tiny-code LIMIT=545 bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
sed -i "s#$PWD/##g" "$OUT"/c/*.log
tail -30 "$OUT/c/campaign-tiny-code.log"
