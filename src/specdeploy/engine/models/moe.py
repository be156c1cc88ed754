"""Routed experts with stacked weights, run as grouped matrix products over tokens sorted by expert.

Checkpoints name each expert's projections `experts.N.{gate,up,down}_proj.weight`; the module keeps them
stacked ([experts, 2 * intermediate, hidden] and [experts, hidden, intermediate]) and maps the names both ways (`load_checkpoint_state` loads them),
so one grouped GEMM per projection serves every expert with no host synchronisation: the step stays
capturable in a CUDA graph, and experts no token picked are never read. On CUDA the Triton kernels of
`triton_moe` do it (gate and up in one pass with the activation, the shared experts folded in as one more
expert); elsewhere torch's grouped GEMM.
"""

from __future__ import annotations

import torch
from torch import nn

from specdeploy.engine import ops
from specdeploy.engine.models.layers import SwiGLU

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def grouped_mm_supported(x: torch.Tensor) -> bool:
    """torch's grouped GEMM runs on the CPU and, on CUDA, in bfloat16 only."""
    return hasattr(torch, "_grouped_mm") and (not x.is_cuda or x.dtype == torch.bfloat16)


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.register_state_dict_post_hook(Experts._split)

    def _split(self, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        w13, w2 = state_dict.pop(prefix + "w13"), state_dict.pop(prefix + "w2")
        inter = self.intermediate_size
        for e in range(self.num_experts):
            state_dict[f"{prefix}{e}.gate_proj.weight"] = w13[e, :inter]
            state_dict[f"{prefix}{e}.up_proj.weight"] = w13[e, inter:]
            state_dict[f"{prefix}{e}.down_proj.weight"] = w2[e]

    def merge_parts(self, state_dict: dict, prefix: str) -> None:
        """Replace the experts' tensors in a checkpoint-named `state_dict` by the stacked ones."""
        keys = {p: [f"{prefix}{e}.{p}.weight" for e in range(self.num_experts)] for p in PROJECTIONS}
        if all(k in state_dict for names in keys.values() for k in names):
            gate_up = [
                torch.cat([state_dict.pop(g), state_dict.pop(u)])
                for g, u in zip(keys["gate_proj"], keys["up_proj"], strict=True)
            ]
            state_dict[prefix + "w13"] = torch.stack(gate_up)
            state_dict[prefix + "w2"] = torch.stack([state_dict.pop(k) for k in keys["down_proj"]])

    def forward(
        self, x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, shared: SwiGLU | None = None
    ) -> torch.Tensor:
        """Sum over each token's chosen experts of weight * expert(token), plus shared(token) when given:
        x [N, H], weights/indices [N, k]."""
        if ops.triton_kernels_for(x) is not None:
            from specdeploy.engine.triton_moe import fused_moe

            if shared is None:
                return fused_moe(x, self.w13, self.w2, weights, indices)
            return fused_moe(
                x, self.w13, self.w2, weights, indices, shared.gate_up_proj.weight, shared.down_proj.weight
            )
        routed = self.grouped(x, weights, indices)
        return routed if shared is None else routed + shared(x)

    def grouped(self, x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The routed experts with torch's grouped GEMM (per expert where it does not run)."""
        picks = indices.flatten()
        order = torch.argsort(picks, stable=True)
        token = order // indices.shape[1]
        counts = torch.zeros(self.num_experts, dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, picks, torch.ones_like(picks, dtype=torch.int32))
        ends = torch.cumsum(counts, 0, dtype=torch.int32)
        rows = x[token]
        if grouped_mm_supported(x):
            hidden = ops.silu_mul(torch._grouped_mm(rows, self.w13.transpose(1, 2), offs=ends))
            out = torch._grouped_mm(hidden, self.w2.transpose(1, 2), offs=ends)
        else:
            out = self._per_expert(rows, ends)
        out = out * weights.flatten()[order, None]
        return torch.zeros_like(x).index_add_(0, token, out.to(x.dtype))

    def _per_expert(self, rows: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """The same products one expert at a time (synchronises with the host for the group bounds)."""
        out = torch.empty(rows.shape[0], self.w2.shape[1], dtype=rows.dtype, device=rows.device)
        start = 0
        for expert, end in enumerate(ends.tolist()):
            if end > start:
                hidden = ops.silu_mul(rows[start:end] @ self.w13[expert].t())
                out[start:end] = hidden @ self.w2[expert].t()
            start = end
        return out
