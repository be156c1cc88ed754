"""Checkpoint directories: targets from Hugging Face's layout, DFlash drafters in z-lab's (read and written).

A target's family comes from config.json's `architectures`. Models are built on the meta device and their
parameters then taken straight from the safetensors files (read onto `device`, cast to `dtype`) by one
reader that checks every name and shape, so no memory is spent on a random initialisation.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.drafter_config import ARCHITECTURE
from specdeploy.engine.models.base import TargetConfig, TargetModel
from specdeploy.engine.models.deepseek_v3 import DeepseekV3ForCausalLM
from specdeploy.engine.models.layers import load_checkpoint_state
from specdeploy.engine.models.qwen3 import Qwen3ForCausalLM
from specdeploy.engine.models.qwen3_moe import Qwen3MoeForCausalLM
from specdeploy.engine.models.qwen3_next import Qwen3_5ForCausalLM, Qwen3NextForCausalLM
from specdeploy.errors import SpecdeployError

FAMILIES: dict[str, type[TargetModel]] = {
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM,
}


@dataclass(frozen=True)
class TextWrapper:
    """A multimodal architecture whose text model is one of FAMILIES."""

    family: type[TargetModel]
    model_types: tuple[str, ...]  # accepted text_config.model_type values
    weight_prefix: str  # of the text model's tensors inside the wrapper's checkpoint


# Kimi K2.5/K2.6: the DeepseekV3 text model under `text_config`, its weights under `language_model.`.
WRAPPERS = {
    "KimiK25ForConditionalGeneration": TextWrapper(
        DeepseekV3ForCausalLM, ("deepseek_v3", "kimi_k2"), "language_model."
    ),
}

SUPPORTED = ", ".join([*FAMILIES, *WRAPPERS])
EXTRA_LAYER = re.compile(r"layers\.(\d+)\.")


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device without their parameter initialisers (`torch.nn.init`'s in-place
    functions, as transformers' `no_init_weights` does): on meta they make no values, yet the first one imports
    torch._dynamo, 1-2 s of every process's start-up (a server's two processes included). Not thread-safe:
    the functions are swapped for the block's duration."""
    initialisers = {
        name: function
        for name, function in vars(torch.nn.init).items()
        if name.endswith("_") and not name.startswith("_") and callable(function)
    }
    for name in initialisers:
        setattr(torch.nn.init, name, _keep)
    try:
        with torch.device("meta"):
            yield
    finally:
        for name, function in initialisers.items():
            setattr(torch.nn.init, name, function)


def _keep(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


def load_target(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> TargetModel:
    """The target model stored at `path`, in inference mode, with parameters on `device` in `dtype` (on the
    meta device, no weights are read: its configuration and shapes alone)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise SpecdeployError(
            f"target checkpoint {root} is not a directory: give a Hugging Face model directory"
        )
    raw = read_json(root / "config.json", "the model configuration")
    family, text_raw, prefix = resolve_family(raw)
    config = target_config(raw, text_raw, root)
    try:
        with on_meta():
            model = family(config)
    except KeyError as missing:
        raise SpecdeployError(
            f"{root / 'config.json'} lacks {missing}, which {family.__name__} needs"
        ) from None
    device = torch.device(device)
    if device.type == "meta":
        return model.eval().requires_grad_(False)
    expected = expected_shapes(model)
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")  # tied to the embedding after loading
    state = read_weights(
        root,
        expected,
        device,
        dtype_of=lambda name: torch.float32 if name.endswith(model.keep_fp32) else dtype,
        prefix=prefix,
        ignorable=lambda name: is_ignorable(name, model),
    )
    # Not strict: read_weights has checked every name and shape, and a tied lm_head is not stored.
    load_checkpoint_state(model, state, strict=False)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.to(device).eval().requires_grad_(False)


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise SpecdeployError(f"{path} is missing: a checkpoint directory needs {path.name} ({what})")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecdeployError(f"{path} is not valid JSON ({exc}): re-download or fix the file") from None
    if not isinstance(data, dict):
        raise SpecdeployError(f"{path} must hold a JSON object, found {type(data).__name__}")
    return data


def resolve_family(raw: dict[str, Any]) -> tuple[type[TargetModel], dict[str, Any], str]:
    """(model class, config dict of the text model, weight-name prefix of the text model)."""
    architectures = raw.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise SpecdeployError(
            f"config.json names no architectures, so the model family is unknown (supported: {SUPPORTED})"
        )
    architecture = architectures[0]
    quantization = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config")
    if quantization:
        method = (
            quantization.get("quant_method", "unknown") if isinstance(quantization, dict) else quantization
        )
        raise SpecdeployError(
            f"quantized checkpoints ({method}) are not supported by the reference engine: "
            "give an unquantized (bf16/fp32) checkpoint"
        )
    if architecture in FAMILIES:
        return FAMILIES[architecture], raw, ""
    wrapper = WRAPPERS.get(architecture)
    if wrapper is None:
        raise SpecdeployError(
            f"architecture {architecture} is not supported by the reference engine (supported: {SUPPORTED})"
        )
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise SpecdeployError(
            f"{architecture} config.json has no text_config object describing its text model"
        )
    if text.get("model_type") not in wrapper.model_types:
        raise SpecdeployError(
            f"{architecture} with a {text.get('model_type')} text model is not supported: "
            f"expected text_config.model_type {' or '.join(wrapper.model_types)}"
        )
    return wrapper.family, text, wrapper.weight_prefix


def token_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else [int(v) for v in value]


def target_config(raw: dict[str, Any], text: dict[str, Any], root: Path | None) -> TargetConfig:
    """The engine's view of a config.json (`raw`; `text` is its text model's part); `root`, when given, is the
    checkpoint directory, whose generation_config.json may add EOS tokens."""
    required = ("hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings")
    missing = [key for key in required if not isinstance(text.get(key), int)]
    if missing:
        where = root / "config.json" if root is not None else "the model configuration"
        raise SpecdeployError(f"{where} lacks integer {', '.join(missing)}")
    eos = token_ids(text.get("eos_token_id")) + token_ids(raw.get("eos_token_id"))
    generation = root / "generation_config.json" if root is not None else None
    if generation is not None and generation.is_file():
        # Chat checkpoints often list their end-of-turn token only here.
        eos += token_ids(read_json(generation, "generation defaults").get("eos_token_id"))
    return TargetConfig(
        architecture=raw["architectures"][0],
        hidden_size=text["hidden_size"],
        num_hidden_layers=text["num_hidden_layers"],
        vocab_size=text["vocab_size"],
        max_position_embeddings=text["max_position_embeddings"],
        eos_token_ids=list(dict.fromkeys(eos)),
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        raw=text,
    )


def weight_files(root: Path) -> dict[str, Path]:
    """Checkpoint tensor name -> the safetensors file holding it (one file, or shards with an index)."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "the shard index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise SpecdeployError(f"{index} has no weight_map object")
        files = {name: root / shard for name, shard in weight_map.items()}
        absent = sorted({path.name for path in files.values() if not path.is_file()})
        if absent:
            raise SpecdeployError(f"{index} lists shards missing from {root}: {', '.join(absent[:3])}")
        return files
    single = root / "model.safetensors"
    if single.is_file():
        with safe_open(single, framework="pt") as handle:
            return dict.fromkeys(handle.keys(), single)
    hint = " (found PyTorch .bin weights: convert them to safetensors)" if any(root.glob("*.bin")) else ""
    raise SpecdeployError(
        f"no weights in {root}: expected model.safetensors or model.safetensors.index.json{hint}"
    )


def read_weights(
    root: Path,
    expected: dict[str, tuple[int, ...]],
    device: torch.device,
    dtype_of: Callable[[str], torch.dtype],
    prefix: str = "",
    ignorable: Callable[[str], bool] = lambda name: False,
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under the model's parameter names, checked against the `expected` shapes.

    Stored names lose `prefix` (skipping other prefixes: a wrapper's other parts) and a leading `model.`;
    stored tensors the model has no place for are an error unless `ignorable`.
    """
    located: dict[str, tuple[str, Path]] = {}
    unexpected = []
    for stored, path in weight_files(root).items():
        if not stored.startswith(prefix):
            continue  # another part of a wrapper (vision tower, projector)
        name = stored[len(prefix) :].removeprefix("model.")
        if name in expected:
            located[name] = (stored, path)
        elif not ignorable(name):
            unexpected.append(stored)
    absent = sorted(set(expected) - set(located))
    if absent:
        raise SpecdeployError(
            f"weights in {root} lack {len(absent)} tensors the config implies, e.g. {', '.join(absent[:3])}: "
            "the checkpoint is incomplete or does not match config.json"
        )
    if unexpected:
        raise SpecdeployError(
            f"weights in {root} hold {len(unexpected)} tensors this model has no place for, "
            f"e.g. {', '.join(unexpected[:3])}: config.json does not describe these weights"
        )
    state = {}
    by_file: dict[Path, list[str]] = {}
    for name, (_, path) in located.items():
        by_file.setdefault(path, []).append(name)
    for path, names in by_file.items():
        with safe_open(path, framework="pt", device=str(device)) as handle:
            for name in names:
                stored = located[name][0]
                shape = tuple(handle.get_slice(stored).get_shape())
                if shape != expected[name]:
                    raise SpecdeployError(
                        f"{stored} in {path.name} has shape {list(shape)} but config.json implies "
                        f"{list(expected[name])}: the weights do not match the config"
                    )
                state[name] = handle.get_tensor(stored).to(dtype_of(name))
    return state


def expected_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of a model (built on the meta device)."""
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def is_ignorable(name: str, model: TargetModel) -> bool:
    """Stored tensors the reference engine deliberately leaves out."""
    if name == "lm_head.weight" and model.config.tie_word_embeddings:
        return True
    if name.endswith("rotary_emb.inv_freq"):
        return True  # recomputed from the config
    # DeepSeek-V3 checkpoints append their multi-token-prediction modules as extra layers.
    extra = EXTRA_LAYER.match(name)
    layers = model.config.num_hidden_layers
    prediction_layers = model.config.raw.get("num_nextn_predict_layers") or 0
    return extra is not None and layers <= int(extra.group(1)) < layers + prediction_layers


# ------------------------------------------------------------------------------------------ drafters

WEIGHTS_FILE = "model.safetensors"


def read_drafter_config(path: Path) -> dict[str, Any]:
    if not path.is_dir():
        raise SpecdeployError(f"drafter path {path} is not a directory: download the checkpoint there first")
    config = read_json(path / "config.json", "the drafter configuration")
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise SpecdeployError(
            f"{path / 'config.json'} declares architectures {architectures}, not [{ARCHITECTURE!r}]: "
            "pass a DFlash drafter checkpoint (DFlash2 drafters are not supported)"
        )
    return config


def load_drafter(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> DFlashDrafter:
    """Load a z-lab DFlash checkpoint directory (config.json + safetensors), ready for inference (on the meta
    device, no weights are read)."""
    path = Path(path).expanduser()
    config = read_drafter_config(path)
    with on_meta():
        drafter = DFlashDrafter(config)
    device = torch.device(device)
    if device.type == "meta":
        return drafter.eval().requires_grad_(False)
    state = read_weights(path, expected_shapes(drafter), device, dtype_of=lambda name: dtype)
    load_checkpoint_state(drafter, state)
    # frozen like the target: outside inference mode (a CUDA graph's capture, say) autograd would otherwise
    # decompose the drafter's operations differently
    return drafter.to(device).eval().requires_grad_(False)


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> None:
    """Write config.json + model.safetensors in z-lab's format (dflash's from_pretrained loads it too)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = next(drafter.parameters()).dtype
    config = {**drafter.config, "architectures": [ARCHITECTURE], "dtype": str(dtype).removeprefix("torch.")}
    config.setdefault("model_type", "qwen3")
    if "torch_dtype" in config:
        config["torch_dtype"] = config["dtype"]
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {name: t.detach().contiguous().cpu() for name, t in drafter.state_dict().items()}
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
