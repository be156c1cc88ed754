"""`specdeploy --help` and every command's `--help` stay light: no torch, transformers, fastapi or matplotlib.

Those imports cost seconds; a command that needs one imports it inside its function. Checked in a fresh
interpreter through `sys.modules`, so a module-level import added anywhere below cli.py fails here.
"""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "fastapi", "matplotlib", "uvicorn", "safetensors")

# Renders the root help and every leaf command's help in one interpreter, then lists what got imported.
SCRIPT = """
import json, sys
import typer
from specdeploy.cli import app

def leaves(command, path=()):
    children = getattr(command, "commands", None)
    if children is None:
        yield list(path)
        return
    for name, child in children.items():
        yield from leaves(child, (*path, name))

root = typer.main.get_command(app)
helped = []
for args in [[], *leaves(root)]:
    try:
        root.main([*args, "--help"], prog_name="specdeploy", standalone_mode=False)
    except SystemExit:
        pass
    helped.append(" ".join(args))
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
engine = sorted(name for name in sys.modules if name.startswith("specdeploy.engine."))
print(json.dumps({"helped": helped, "heavy": heavy, "engine": engine}))
"""


def test_help_imports_no_heavy_library_or_engine():
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{SCRIPT}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"", "bench", "campaign", "serve", "zoo list", "plan", "report"} <= set(result["helped"])
    assert result["heavy"] == []
    # The drafter's config.json layout is plain data; nothing that runs a model may load for --help.
    assert result["engine"] in ([], ["specdeploy.engine.drafter_config"])
