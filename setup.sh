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
    # What SGLang's start-up resolution (`plan --check`, ServerArgs.resolve_once) imports beyond its parser.
    # Not torchvision: the PyPI wheel for torch 2.13 is CUDA-linked and does not load beside the CPU torch;
    # the check gives SGLang's image-preprocessing modules an inert stand-in instead (deploy/sglang_resolve.py).
    .venv/bin/python -m pip install -q --no-deps "apache-tvm-ffi==0.1.15.post2" "compressed-tensors==0.20.1" \
        "dill==0.4.1" "einops==0.8.2" "gguf==0.19.0" "loguru==0.7.3" "openai==3.60.0" \
        "partial-json-parser==0.2.1.1.post7" "sentencepiece==0.2.3" "sniffio==1.3.1"
fi
