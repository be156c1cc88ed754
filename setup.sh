#!/usr/bin/env bash
# Creates .venv with specdeploy and its pinned dependencies (CPU torch), idempotently.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build first, so that nothing pulls a multi-GB CUDA wheel.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
# Oracles and SGLang's own argument parser, without their heavy GPU dependencies.
.venv/bin/python -m pip install -q --no-deps -c constraints.txt dflash==0.1.0
# SGLang's own argument parser checks every plan (tests/test_plan_sglang_parser.py): the cp311 wheel without
# its CUDA stack, plus the pure-Python modules `sglang.srt.server_args` imports (triton installs without a GPU).
if .venv/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    .venv/bin/python -m pip install -q --no-deps "sglang==0.5.23"
    .venv/bin/python -m pip install -q "orjson==3.13.0" "psutil==7.2.2" "pybase64==1.5.1" "requests==2.34.2" \
        "msgspec==0.23.0" "pyzmq==27.3.0" "ipython==9.18.1" "triton==3.9.0"
fi
