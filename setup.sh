#!/usr/bin/env bash
# Creates .venv with specdeploy and its pinned dependencies (CPU torch), idempotently.
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build first, so that nothing pulls a multi-GB CUDA wheel.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
is_py311() { .venv/bin/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; }
# SGLang's own argument parser checks every plan (tests/test_plan_sglang_parser.py): the pure-Python modules
# `sglang.srt.server_args` imports (triton installs without a GPU), resolved with everything above.
if is_py311; then
    .venv/bin/python -m pip install -q "orjson==3.13.0" "psutil==7.2.2" "pybase64==1.5.1" "requests==2.34.2" \
        "msgspec==0.23.0" "pyzmq==27.3.0" "ipython==9.18.1" "triton==3.9.0"
fi
# Last, and without their dependencies: the oracles whose own pins this environment does not meet on purpose.
# dflash's model code is the DFlash reference (it pins tqdm and datasets exactly, which its model code does not
# import); the cp311 SGLang wheel is only here for its argument parser (it pins a CUDA torch and stack).
# --no-deps installs them as they are, and pip then does not list every such pin as a conflict.
.venv/bin/python -m pip install -q --no-deps -c constraints.txt dflash==0.1.0
if is_py311; then
    .venv/bin/python -m pip install -q --no-deps "sglang==0.5.23"
fi
