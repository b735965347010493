"""Feed-forward layers: the dense SwiGLU MLP and the routed mixture of experts built from it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from slotune.engine.hf_config import MoEConfig


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, gate and up fused in one matrix."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class SparseMoE(nn.Module):
    """Top-k routed SwiGLU experts (Mixtral, Qwen2-MoE), plus Qwen2-MoE's gated shared expert.

    The experts' weights are stacked: ``experts_gate_up`` [experts, 2·ffn, hidden] and
    ``experts_down`` [experts, hidden, ffn]. Each expert runs once per step on the tokens
    routed to it, so the work is ``tokens × top_k`` expert rows, not ``tokens × experts``.
    """

    def __init__(self, hidden_size: int, moe: MoEConfig) -> None:
        super().__init__()
        self.top_k = moe.num_experts_per_tok
        self.norm_topk_prob = moe.norm_topk_prob
        ffn = moe.moe_intermediate_size
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts_gate_up = nn.Parameter(torch.empty(moe.num_experts, 2 * ffn, hidden_size))
        self.experts_down = nn.Parameter(torch.empty(moe.num_experts, hidden_size, ffn))
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = MLP(hidden_size, moe.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's experts [tokens, top_k] and their weights, softmax taken in float32."""
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(x)
        out = torch.zeros_like(x)
        for e in experts.unique().tolist():
            token, slot = torch.where(experts == e)
            gate, up = F.linear(x[token], self.experts_gate_up[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.experts_down[e])
            out.index_add_(0, token, y * weights[token, slot, None])
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
