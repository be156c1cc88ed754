"""Child process of `sglang_check`: runs SGLang's `ServerArgs.resolve_once()` on each request from stdin.

Reads a JSON list of {argv, gpu, models}; writes one JSON line per request: {"accepted", "message"}.
Everything here patches the process it runs in; `sglang_check` is the module to import.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import pkgutil
import sys
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

UNPINNED_SNAPSHOT = "0" * 40  # the snapshot `main` points to when the plan pins no revision
# SGLang modules the resolution pipeline imports lazily; imported up front, while the process is still a CPU
# machine, so that none of them reaches for CUDA-only kernels (sgl_kernel) once the GPU is simulated.
LAZY_IMPORTS = (
    "sglang.srt.speculative.dflash_utils",
    "sglang.srt.kernel_plugins.nvidia.binding",
    "sglang.srt.kernel_plugins.amd.binding",
)


class _Inert(type):
    """Any attribute of a stand-in is another inert class: enough for module-level names and subclassing."""

    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(name, (), {})


class _InertModule(types.ModuleType):
    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert(name, (), {})


class _TorchvisionForSglang(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an inert torchvision to imports made by SGLang's own modules, and to nobody else."""

    def find_spec(self, name: str, path=None, target=None):  # noqa: ANN001 (importlib's signature)
        if name.split(".")[0] != "torchvision" or not _imported_by_sglang():
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _imported_by_sglang() -> bool:
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
        frame = frame.f_back
    return frame is not None and str(frame.f_globals.get("__name__", "")).startswith("sglang.")


def _write_hub(root: Path, models: dict) -> None:
    """An offline Hugging Face cache holding each model's config.json under the revision the argv names."""
    for repo, model in models.items():
        folder = root / ("models--" + repo.replace("/", "--"))
        snapshot = model["revision"] or UNPINNED_SNAPSHOT
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(snapshot)
        (folder / "snapshots" / snapshot).mkdir(parents=True, exist_ok=True)
        (folder / "snapshots" / snapshot / "config.json").write_text(json.dumps(model["config"]))


def _import_on_cpu() -> types.ModuleType:
    sys.meta_path.insert(0, _TorchvisionForSglang())
    server_args = importlib.import_module("sglang.srt.server_args")
    groups = importlib.import_module("sglang.srt.arg_groups")
    for module in pkgutil.iter_modules(groups.__path__):
        importlib.import_module(f"sglang.srt.arg_groups.{module.name}")
    for name in LAZY_IMPORTS:
        importlib.import_module(name)
    return server_args


def _simulate_gpu(gpu: dict) -> None:
    """Answer SGLang's GPU probes from the hardware profile, and forget what they answered before."""
    import torch
    from sglang.srt import platforms
    from sglang.srt.utils import common

    major, minor = gpu["capability"]
    properties = SimpleNamespace(
        name=gpu["name"], total_memory=gpu["memory_mib"] << 20, major=major, minor=minor
    )
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: gpu["count"]
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    torch.cuda.get_device_name = lambda device=None: gpu["name"]
    torch.cuda.get_device_properties = lambda device=None: properties
    torch.version.cuda = "13.0"
    # nvidia-smi's memory.total, in MiB (sglang/srt/utils/common.py:802)
    common.get_nvgpu_memory_capacity = lambda: float(gpu["memory_mib"])
    for probe in vars(common).values():
        if hasattr(probe, "cache_clear"):  # is_cuda, is_sm100_supported, get_device_sm, ... are lru_cached
            probe.cache_clear()
    platforms._current_platform = None  # resolved again, now as CUDA


def _resolve(server_args: types.ModuleType, request: dict) -> dict:
    _simulate_gpu(request["gpu"])
    parser_errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(parser_errors):
            args = server_args.prepare_server_args(request["argv"])
    except SystemExit:
        return {"accepted": False, "message": "argument parser: " + parser_errors.getvalue().strip()}
    try:
        args.resolve_once()
    except (
        Exception
    ) as exc:  # SGLang raises ValueError, AssertionError, RuntimeError, ...: all are its verdict
        return {"accepted": False, "message": f"{type(exc).__name__}: {exc}"}
    from sglang.srt.arg_groups.model_override_base import resolved_view

    view = resolved_view(args)  # the record keeps what was given; resolution's values are declared over it
    resolved = {
        "max_running_requests": view.max_running_requests,
        "attention_backend": view.attention_backend,
        "speculative_draft_attention_backend": view.speculative_draft_attention_backend,
        "mem_fraction_static": view.mem_fraction_static,
    }
    return {"accepted": True, "message": ", ".join(f"{k} {v}" for k, v in resolved.items())}


def main() -> None:
    requests = json.loads(sys.stdin.read())
    hub = Path(tempfile.mkdtemp(prefix="specdeploy-sglang-check-")) / "hub"
    for request in requests:
        _write_hub(hub, request["models"])
    os.environ.update(HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    server_args = _import_on_cpu()
    out = sys.stdout
    for request in requests:
        with contextlib.redirect_stdout(sys.stderr):  # SGLang's logging stays out of the answer lines
            verdict = _resolve(server_args, request)
        out.write(json.dumps(verdict) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
