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
