"""The price of a mixture-of-experts layer: router, grouped expert GEMMs, shared expert,
routing passes and the expert-parallel all-to-all.

With ``T`` tokens each picking ``k`` of ``E`` experts, an expert is untouched with
probability ``(1 − k/E)^T`` (routing taken as uniform and independent), so
``E·(1 − (1 − k/E)^T)`` experts are touched on average and only their weights are read:
at one decoding token Mixtral reads 2 of its 8 experts, at 64 tokens all of them. The
FLOPs are those of the ``T·k`` routed rows, spread over the touched experts (each
expert's rows padded to ``MOE_TILE``).

Expert parallelism (``ep`` of the ``tp`` GPUs) gives each GPU ``E/ep`` whole experts
(each sharded ``tp/ep`` ways). The token batch is then dispatched to the experts' owners
and combined back (DeepEP-style all-to-alls, the batch split over the ``ep`` ranks), on
top of the tensor-parallel all-reduces priced with the dense layer, and the step waits
for the busiest rank: its rows are the mean times the imbalance of random routing at that
batch (``busiest_rank_load``) times the routing skew ``imbalance``. With ``ep = 1`` every
GPU holds a ``1/tp`` slice of every expert and imbalance does not change the grouped
GEMM (one kernel runs all experts' tiles), so it is not applied.
"""

from __future__ import annotations

import math
from functools import cache

from slotune.engine.sim.models import ModelSpec
from slotune.engine.sim.precision import format_gemm_seconds, gemm_rate
from slotune.engine.sim.profile import GpuProfile

DEFAULT_IMBALANCE = 1.25
"""Routing skew: the busiest expert-parallel rank's share of a large batch's routed rows
over the mean, from expert popularity rather than chance (``busiest_rank_load`` adds the
chance part). Not measurable here without real router weights; the published figures
bracket it: Mixtral's routing is close to uniform across domains (Jiang et al. 2024,
section 5), the Switch Transformer sized its expert capacity at 1.25x the mean (Fedus et
al. 2021), and on DeepSeek-style fine-grained experts rebalancing the experts (EPLB)
raised 8-way expert-parallel prefill throughput by 34% (ROCm/ATOM PR 1210, 8192-token
batches, where chance adds under 2%): had only the MoE layers sped up, the busiest rank
carried at least 1.34x the mean there. Persistent hot ranks without EPLB also show in
NVIDIA's TensorRT-LLM large-scale EP blog (part 1) for DeepSeek-R1. Pass ``imbalance``
to refit it from a real run's per-expert token counts."""


@cache
def expected_max_std_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals] (0 for one, 1/√π for two, 1.42 for
    eight), by quadrature of ``∫ x · n φ(x) Φ(x)^(n−1) dx``."""
    if n <= 1:
        return 0.0
    step, total = 0.002, 0.0
    for i in range(-6000, 6001):  # x in [-12, 12]
        x = i * step
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        total += x * n * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * cdf ** (n - 1)
    return total * step


SMALL_BATCH_ROWS = 4
"""Expected rows per rank below which ``busiest_rank_load`` counts exactly instead of
using its normal approximation."""


def busiest_rank_load(num_tokens: float, num_experts: int, top_k: int, ep: int) -> float:
    """Expected rows of the busiest of ``ep`` ranks over the mean ``T·k/ep`` when ``T``
    tokens each pick ``k`` distinct experts uniformly at random, ``E/ep`` experts per rank:
    the imbalance that chance alone gives, falling to 1 as batches grow.

    A rank's rows over one token are hypergeometric (variance
    ``k·(1/ep)(1−1/ep)(E−k)/(E−1)``), over ``T`` tokens close to normal, and the ranks'
    rows sum to ``T·k``: they are independent normals less their mean, whose largest
    exceeds the mean by ``e_ep / √(1 − 1/ep)`` standard deviations (``e_ep``:
    ``expected_max_std_normal``). So

        1 + e_ep · √(ep · (E − k) / ((E − 1) · T · k)).

    Below ``SMALL_BATCH_ROWS`` rows per rank, where that is too coarse, the busiest of
    ``T·k`` rows dealt to ``ep`` ranks uniformly (``_busiest_of_dealt_rows``: exact for
    ``k = 1``, and a little high otherwise, as it lets a token pick an expert twice).
    Either is capped at ``ep · min(k, E/ep) / k``: a rank holds at most ``E/ep`` of a
    token's ``k`` experts. Against a Monte Carlo of the routing (``tests/sim/test_moe.py``):
    within 3% from 16 rows per rank, 5% from 4 for up to 8 ranks, and within 6% below 4
    for ``E ≥ 64``; up to 14% high where a rank holds one or two experts (Mixtral's 8 on
    4 or 8 ranks)."""
    if ep <= 1 or num_tokens <= 0:
        return 1.0
    e, k = num_experts, top_k
    if num_tokens * k / ep < SMALL_BATCH_ROWS:
        chance = _busiest_of_dealt_rows(math.ceil(num_tokens) * k, ep)
    else:
        chance = 1.0 + expected_max_std_normal(ep) * math.sqrt(
            ep * (e - k) / ((e - 1) * num_tokens * k)
        )
    return min(chance, ep * min(k, e / ep) / k)


@cache
def _busiest_of_dealt_rows(rows: int, ep: int) -> float:
    """E[largest count] / mean when ``rows`` rows go to ``ep`` ranks independently and
    uniformly: ``E[max] = Σ_m (1 − P(max ≤ m))``, with ``P(max ≤ m) = rows! / ep^rows ·
    [z^rows] (Σ_{j≤m} z^j / j!)^ep`` (the multinomial counted by its generating function)."""
    import numpy as np

    log_fact = np.array([math.lgamma(j + 1) for j in range(rows + 1)])
    scale = math.exp(log_fact[rows] - rows * math.log(ep))
    busiest = 0.0
    for m in range(rows):
        power, base, n = np.ones(1), np.exp(-log_fact[: m + 1]), ep
        while n:  # (Σ_{j≤m} z^j / j!)^ep by squaring, truncated past z^rows
            if n & 1:
                power = np.convolve(power, base)[: rows + 1]
            base, n = np.convolve(base, base)[: rows + 1], n >> 1
        above_m = 1.0 - min(scale * power[rows], 1.0) if len(power) > rows else 1.0
        if above_m < 1e-12:
            break
        busiest += above_m
    return busiest / (rows / ep)


MOE_TILE = 16
"""Rows each expert's share is padded to: the smallest ``BLOCK_SIZE_M`` of vLLM's fused-MoE
kernel configurations (it picks 16 for small batches)."""

MLP_OPS = ("mlp_up", "mlp_act", "mlp_down")
"""The dense-layer ops (``CostModel.layer_ops``) a MoE layer replaces by its own."""

_US = 1e-6
_ACT_BYTES = 2  # activations in bf16
_ROUTER_BYTES = 4  # router logits and scores in fp32


def experts_touched(num_experts: float, top_k: int, num_tokens: float) -> float:
    """Expected distinct experts that ``num_tokens`` tokens routed top-``top_k`` reach."""
    if num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def router_scores_bytes(num_tokens: float, num_experts: int) -> float:
    """Softmax and top-k over the router's fp32 logits."""
    return _ROUTER_BYTES * num_tokens * num_experts


def gather_bytes(num_tokens: float, rows: float, hidden: int) -> float:
    """Gathering ``rows`` routed rows to their experts and summing them back per token."""
    return _ACT_BYTES * (2 * rows + num_tokens) * hidden


def act_bytes(rows: float, ffn: int) -> float:
    """SwiGLU over ``rows`` rows of an expert of width ``ffn``: gate and up read, one written."""
    return 3 * rows * ffn * _ACT_BYTES


def alltoall_bytes(num_tokens: float, top_k: int, hidden: int, ep: int) -> float:
    """One dispatch (or combine) on one rank: its ``T/ep`` tokens' ``k`` rows, the
    ``(ep−1)/ep`` of them owned elsewhere."""
    return (ep - 1) / ep * (num_tokens / ep * top_k * hidden * _ACT_BYTES)


class MoECost:
    """One MoE layer's ops on one GPU of ``tp`` (``ep`` of them expert-parallel)."""

    def __init__(
        self,
        profile: GpuProfile,
        model: ModelSpec,
        tp: int = 1,
        ep: int = 1,
        imbalance: float = DEFAULT_IMBALANCE,
    ) -> None:
        if model.moe is None:
            raise ValueError(f"{model.name} has no experts to price")
        model.check_ep(tp, ep)
        if imbalance < 1:
            raise ValueError(f"MoE load imbalance must be >= 1 (busiest / mean), got {imbalance}")
        self.profile, self.model, self.moe = profile, model, model.moe
        self.tp, self.ep, self.imbalance = tp, ep, imbalance
        self.bw = profile.gpu.hbm_bytes_per_s
        fmt = model.expert_weight_format
        self.rate, self.weight_only = gemm_rate(fmt, profile.gpu)
        self.weight_bytes = fmt.bytes_per_weight
        self.local_experts = self.moe.num_experts // ep
        self.expert_ffn = self.moe.expert_ffn * ep // tp
        self.shared_ffn = self.moe.shared_ffn // tp
        self._cache: dict[int, float] = {}

    def _gemm(self, rows: float, k: int, n: int, groups: float = 1.0, tile: int = 0) -> float:
        return format_gemm_seconds(
            self.profile.linear,
            self.bw,
            self.rate,
            self.weight_bytes,
            self.weight_only,
            rows,
            k,
            n,
            groups,
            tile,
        )

    def _pass(self, op: str, nbytes: float) -> float:
        e = self.profile.elementwise[op]
        return 0.0 if nbytes <= 0 else e.overhead_us * _US + nbytes / (self.bw * e.eff)

    def rows_per_gpu(self, num_tokens: int) -> float:
        """Routed rows the busiest GPU runs: all ``T·k`` without expert parallelism."""
        moe, ep = self.moe, self.ep
        rows = num_tokens * moe.top_k / ep
        if ep == 1:
            return rows
        chance = busiest_rank_load(num_tokens, moe.num_experts, moe.top_k, ep)
        most = num_tokens * min(moe.top_k, moe.num_experts / ep)
        return min(rows * chance * self.imbalance, most)

    def layer_ops(self, num_tokens: int) -> dict[str, float]:
        """Seconds of each op of one MoE layer for ``num_tokens`` tokens (its attention
        side is the dense layer's)."""
        t, h, moe = num_tokens, self.model.hidden_size, self.moe
        if t <= 0:
            return dict.fromkeys(
                ("router", "moe_route", "moe_up", "moe_act", "moe_down", "shared_expert"), 0.0
            )
        rows = self.rows_per_gpu(t)
        groups = experts_touched(moe.num_experts, moe.top_k, t) / self.ep
        ffn = self.expert_ffn
        bf16 = self.profile.gpu.flops_per_s
        ops = {
            "router": format_gemm_seconds(
                self.profile.linear, self.bw, bf16, _ACT_BYTES, False, t, h, moe.num_experts
            ),
            # softmax/top-k over the logits, then gathering rows to experts and summing back
            "moe_route": self._pass("act", router_scores_bytes(t, moe.num_experts))
            + self._pass("add", gather_bytes(t, rows, h)),
            "moe_up": self._gemm(rows, h, 2 * ffn, groups, MOE_TILE),
            "moe_act": self._pass("act", act_bytes(rows, ffn)),
            "moe_down": self._gemm(rows, ffn, h, groups, MOE_TILE),
            "shared_expert": 0.0,
        }
        if self.shared_ffn:
            s = self.shared_ffn
            ops["shared_expert"] = (
                self._gemm(t, h, 2 * s) + self._pass("act", act_bytes(t, s)) + self._gemm(t, s, h)
            )
        if self.ep > 1:
            ops["alltoall"] = 2 * self.alltoall_seconds(t)
        return ops

    def alltoall_seconds(self, num_tokens: int) -> float:
        """One dispatch (or combine): each rank's ``T/ep`` tokens send their ``k`` rows,
        the ``(ep−1)/ep`` of them owned elsewhere, over one direction of the link."""
        sysp, ep = self.profile.system, self.ep
        nbytes = alltoall_bytes(num_tokens, self.moe.top_k, self.model.hidden_size, ep)
        per_dir = self.profile.gpu.interconnect_gbps * 1e9 / 2
        return sysp.allreduce_latency_us * _US + nbytes / (per_dir * sysp.allreduce_eff)

    def layers_seconds(self, dense_ops: dict[str, float], num_tokens: int) -> float:
        """All layers of the model for ``num_tokens`` tokens, given the dense layer's ops:
        every layer's attention side, the dense MLP of the non-MoE layers, the MoE ops of
        the others."""
        t = self._cache.get(num_tokens)
        if t is None:
            mlp = sum(dense_ops[op] for op in MLP_OPS)
            attention = sum(dense_ops.values()) - mlp
            t = (
                self.model.num_layers * attention
                + self.model.num_dense_layers * mlp
                + self.moe.num_moe_layers * sum(self.layer_ops(num_tokens).values())
            )
            self._cache[num_tokens] = t
        return t

    def mean_layer_ops(self, dense_ops: dict[str, float], num_tokens: int) -> dict[str, float]:
        """Per-layer ops averaged over the model's layers (dense and MoE), so that
        ``num_layers × sum`` is ``layers_seconds``: for a per-op breakdown."""
        layers = self.model.num_layers
        dense_share = self.model.num_dense_layers / layers
        moe_share = self.moe.num_moe_layers / layers
        out = {
            k: v * dense_share if k in MLP_OPS else v
            for k, v in dense_ops.items()
            if dense_share or k not in MLP_OPS
        }
        out.update({k: v * moe_share for k, v in self.layer_ops(num_tokens).items()})
        return out
