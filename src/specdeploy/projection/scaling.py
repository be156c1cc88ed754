"""Moving a fitted step from the measured machine to another: memory-bound terms by HBM bandwidth,
compute-bound terms by BF16 FLOP/s, and the tensor-parallel all-reduces by the interconnect."""

from __future__ import annotations

from dataclasses import dataclass

from specdeploy.errors import SpecdeployError
from specdeploy.recipes.schema import HardwareProfile

NEEDED = ("hbm_gb_s", "bf16_dense_tflops")
NEEDED_TP = ("interconnect_gb_s", "allreduce_latency_us")
ALLREDUCES_PER_LAYER = 2  # tensor parallelism reduces after attention and after the MLP / MoE block
ACTIVATION_BYTES = 2  # bf16 hidden states


def _require(profile: HardwareProfile, tp: int) -> None:
    missing = [f for f in NEEDED + (NEEDED_TP if tp > 1 else ()) if getattr(profile, f) is None]
    if missing:
        raise SpecdeployError(
            f"hardware profile {profile.name} lacks {', '.join(missing)}, which scaling needs: add them to a "
            "copy of the profile and pass its .toml path (--hardware, or --source-hardware for the measured one)"
        )


@dataclass(frozen=True)
class AllReduce:
    """Per step: ALLREDUCES_PER_LAYER ring all-reduces per layer of every token's hidden state."""

    tp: int
    layers: int
    hidden: int

    def latency_ms(self, profile: HardwareProfile) -> float:
        if self.tp == 1:
            return 0.0
        return self.layers * ALLREDUCES_PER_LAYER * (profile.allreduce_latency_us or 0.0) / 1e3

    def transfer_ms(self, profile: HardwareProfile, tokens: float) -> float:
        """A ring moves 2 (p - 1) / p of the message through each GPU's link."""
        if self.tp == 1:
            return 0.0
        message = tokens * self.hidden * ACTIVATION_BYTES
        per_link = 2 * (self.tp - 1) / self.tp * message
        seconds = per_link / ((profile.interconnect_gb_s or 0.0) * 1e9)
        return self.layers * ALLREDUCES_PER_LAYER * seconds * 1e3


@dataclass(frozen=True)
class HardwareScale:
    source: HardwareProfile
    target: HardwareProfile
    allreduce: AllReduce
    moe: bool  # an MoE's per-token term reads experts' weights (memory-bound); a dense one's is compute

    def __post_init__(self) -> None:
        if self.allreduce.tp > self.target.gpu_count:
            raise SpecdeployError(
                f"the runs used TP {self.allreduce.tp} but {self.target.name} has {self.target.gpu_count} GPUs"
            )
        _require(self.source, self.allreduce.tp)
        _require(self.target, self.allreduce.tp)

    @property
    def memory_ratio(self) -> float:
        return self.source.hbm_gb_s / self.target.hbm_gb_s  # type: ignore[operator]

    @property
    def compute_ratio(self) -> float:
        return self.source.bf16_dense_tflops / self.target.bf16_dense_tflops  # type: ignore[operator]

    @property
    def token_ratio(self) -> float:
        return self.memory_ratio if self.moe else self.compute_ratio

    def step_ms(self, terms: dict[str, float], tokens: float) -> tuple[float, list[str]]:
        """The step on the target machine, and what had to be clamped (an all-reduce larger than its term)."""
        ar = self.allreduce
        clamped = []
        fixed = terms["fixed"] - ar.latency_ms(self.source)
        per_token = terms["per_token"] - ar.transfer_ms(self.source, tokens)
        if fixed < 0:
            clamped.append("fixed cost smaller than the source's all-reduce latency: counted as 0")
        if per_token < 0:
            clamped.append("per-token cost smaller than the source's all-reduce transfer: counted as 0")
        step = (
            max(fixed, 0.0) * self.memory_ratio
            + terms["per_row"] * self.memory_ratio
            + max(per_token, 0.0) * self.token_ratio
            + ar.latency_ms(self.target)
            + ar.transfer_ms(self.target, tokens)
        )
        return step, clamped

    def assumptions(self) -> list[str]:
        s, t, ar = self.source, self.target, self.allreduce
        lines = [
            f"{s.name} -> {t.name}: the fixed cost per step (weights read once per step) and the cost per running "
            f"request (its KV cache) are memory-bound: x {self.memory_ratio:.3g} (HBM {s.hbm_gb_s:g} -> "
            f"{t.hbm_gb_s:g} GB/s)",
            (
                f"the per-verified-token cost reads routed experts' weights (MoE): memory-bound, x "
                f"{self.memory_ratio:.3g}"
                if self.moe
                else f"the per-verified-token cost is compute-bound: x {self.compute_ratio:.3g} (BF16 dense "
                f"{s.bf16_dense_tflops:g} -> {t.bf16_dense_tflops:g} TFLOP/s)"
            ),
            "peaks scale alike: both machines reach the same fraction of their datasheet bandwidth and FLOP/s",
            f"TP {ar.tp} on both machines, CUDA graphs and kernels behave alike",
        ]
        if ar.tp > 1:
            lines.append(
                f"all-reduce per step: {ar.layers} layers x {ALLREDUCES_PER_LAYER} ring all-reduces of each token's "
                f"hidden state ({ar.hidden} x {ACTIVATION_BYTES} B), 2(p-1)/p of it through each link; latency "
                f"{s.allreduce_latency_us:g} -> {t.allreduce_latency_us:g} us each, link {s.interconnect_gb_s:g} "
                f"({s.interconnect}) -> {t.interconnect_gb_s:g} ({t.interconnect}) GB/s; it is taken out of the "
                "fitted terms on the source and added back at the target's figures"
            )
        lines.append(
            "the profiles' bandwidth, FLOP/s and link figures are datasheet peaks and the all-reduce latencies "
            "typical figures, none measured on these machines"
        )
        return lines
