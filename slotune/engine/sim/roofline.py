"""A step read against the GPU: FLOPs, bytes and time per op, bandwidth and compute use.

The cost model prices each op as a roofline; this module groups its ops into the ones a
user can act on and counts what each moves and computes, with the cost model's own
formulas (``precision.gemm_bytes``/``gemm_flops``, ``cost_model.elementwise_bytes`` and
``attention_flops_per_pair``, ``moe``'s routing bytes):

- ``weights``: every linear layer (attention projections, MLP or experts, router, LM head);
- ``kv_read``: decode attention (the KV cache the decodes read);
- ``attention``: prefill attention (chunks against their prior context and themselves);
- ``elementwise``: norms, residual adds, RoPE, activations, embedding, routing passes;
- ``allreduce``: tensor-parallel all-reduces and expert-parallel all-to-alls (link bytes);
- ``host``: what the host adds to the step, as the stack prices it (the step's time past
  the GPU's, so the ops sum to the step).

FLOPs are the useful ones (no tile or CUDA-graph padding), so padding shows as lost MFU;
bytes are HBM bytes (stored KV bytes, not the dequantization the cost model adds to a
quantized cache's read). MBU and MFU are against the datasheet (HBM bandwidth; the
tensor-core rate of the model's weight format) and against the fitted GEMM ceilings of the
GPU profile (``mem_eff``, ``compute_eff``, over the stack's ``gpu_time_scale``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slotune.engine.sim.cost_model import (
    DTYPE_BYTES,
    CostModel,
    Shard,
    attention_flops_per_pair,
    elementwise_bytes,
)
from slotune.engine.sim.models import ModelSpec
from slotune.engine.sim.moe import (
    act_bytes,
    alltoall_bytes,
    experts_touched,
    gather_bytes,
    router_scores_bytes,
)
from slotune.engine.sim.precision import gemm_bytes, gemm_flops, gemm_rate

OPS = ("weights", "kv_read", "attention", "elementwise", "allreduce", "host")
_LINEAR = ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "router", "moe_up", "moe_down")
_ELEMENTWISE = ("rope", "mlp_act", "norms", "moe_act", "moe_route")
_LINK = ("allreduce", "alltoall")


@dataclass(frozen=True)
class OpCost:
    """An op's seconds, FLOPs, HBM bytes and GPU-link bytes (numbers, or arrays of one per
    step from ``step_work`` on arrays)."""

    seconds: Any
    flops: Any = 0.0
    hbm_bytes: Any = 0.0
    link_bytes: Any = 0.0


@dataclass(frozen=True)
class Ceilings:
    """Bandwidth and compute a step is measured against."""

    hbm_bytes_per_s: float
    flops_per_s: float

    @property
    def ridge(self) -> float:
        """FLOPs per byte where a kernel turns from bandwidth- to compute-bound."""
        return self.flops_per_s / self.hbm_bytes_per_s


@dataclass(frozen=True)
class StepRoofline:
    ops: dict[str, OpCost]
    seconds: float
    datasheet: Ceilings
    fitted: Ceilings
    shape: dict[str, int] = field(default_factory=dict)

    @property
    def flops(self) -> float:
        return sum(o.flops for o in self.ops.values())

    @property
    def hbm_bytes(self) -> float:
        return sum(o.hbm_bytes for o in self.ops.values())

    @property
    def intensity(self) -> float:
        """FLOPs per HBM byte of the whole step."""
        return self.flops / self.hbm_bytes if self.hbm_bytes else 0.0

    def mbu(self, ceilings: Ceilings | None = None) -> float:
        """Achieved HBM bandwidth over the ceiling's (the datasheet's by default)."""
        c = ceilings or self.datasheet
        return self.hbm_bytes / self.seconds / c.hbm_bytes_per_s if self.seconds else 0.0

    def mfu(self, ceilings: Ceilings | None = None) -> float:
        """Achieved FLOP/s over the ceiling's (the datasheet's by default)."""
        c = ceilings or self.datasheet
        return self.flops / self.seconds / c.flops_per_s if self.seconds else 0.0

    @property
    def bound_op(self) -> str:
        """The op that takes most of the step's time."""
        return max(self.ops, key=lambda k: self.ops[k].seconds)

    def limit(self, op: str) -> str:
        """What bounds ``op``: ``memory`` or ``compute`` (its intensity against the
        datasheet ridge), ``link`` or ``host``."""
        o = self.ops[op]
        if op == "host":
            return "host"
        if op == "allreduce":
            return "link"
        if not o.hbm_bytes:
            return "compute" if o.flops else "-"
        return "compute" if o.flops / o.hbm_bytes >= self.datasheet.ridge else "memory"


def ceilings(cm: CostModel) -> tuple[Ceilings, Ceilings]:
    """(datasheet, fitted) ceilings of ``cm``'s GPU for its model's weight format."""
    gpu = cm.profile.gpu
    rate, _ = gemm_rate(cm.model.weight_format, gpu)
    scale = cm.stack.gpu_time_scale
    lin = cm.profile.linear
    datasheet = Ceilings(gpu.hbm_bytes_per_s, rate)
    fitted = Ceilings(gpu.hbm_bytes_per_s * lin.mem_eff / scale, rate * lin.compute_eff / scale)
    return datasheet, fitted


def prefill_pairs(chunks: Sequence[tuple[int, int]]) -> float:
    """Query-key pairs of prefill chunks ``(tokens, prior)``: each token against the prior
    context and, causally, half of its own chunk."""
    return sum(c * (p + 0.5 * c) for c, p in chunks)


def step_work(
    shard: Shard,
    num_tokens: Any,
    num_samples: Any,
    decode_context: Any,
    prefill_pairs: Any,
    prefill_context: Any,
) -> dict[str, OpCost]:
    """FLOPs and bytes per op of one step on one GPU's ``shard`` (numbers or numpy arrays
    alike; ``seconds`` left 0): ``num_tokens`` scheduled, ``num_samples`` reaching the LM
    head, decodes reading ``decode_context`` KV tokens, prefill chunks of ``prefill_pairs``
    query-key pairs attending to ``prefill_context`` KV tokens.

    The cost model's formulas count 16-bit weights and activations (``DTYPE_BYTES``); a
    model in another dtype (``ModelSpec.dtype_bytes``: the real engine's float32 on a CPU)
    moves ``dtype_bytes / DTYPE_BYTES`` times their bytes, which is exact for its 16-bit
    formats (a quantized one must be 16-bit otherwise). Router scores stay fp32 and the KV
    cache is the shard's own (``kv_cache_dtype``, in the model's dtype for ``auto``)."""
    m, model, h, layers = num_tokens, shard.model, shard.hidden, shard.model.num_layers
    scale = _dtype_scale(model)
    bpw = model.weight_format.bytes_per_weight
    dense_layers, moe_layers = model.num_dense_layers, layers - model.num_dense_layers
    attn = ((h, shard.qkv_out), (shard.attn_dim, h))
    mlp = ((h, 2 * shard.ffn), (shard.ffn, h))
    w_bytes = layers * sum(gemm_bytes(m, k, n, bpw) for k, n in attn)
    w_bytes += dense_layers * sum(gemm_bytes(m, k, n, bpw) for k, n in mlp)
    w_bytes += gemm_bytes(num_samples, h, shard.vocab, DTYPE_BYTES)
    w_flops = layers * sum(gemm_flops(m, k, n) for k, n in attn)
    w_flops += dense_layers * sum(gemm_flops(m, k, n) for k, n in mlp)
    w_flops += gemm_flops(num_samples, h, shard.vocab)
    qk_dim = (shard.q_heads + shard.kv_heads) * model.head_dim
    ffn = shard.ffn
    ew = 2 * elementwise_bytes("norm", m, h, qk_dim, ffn) + 2 * elementwise_bytes(
        "add", m, h, qk_dim, ffn
    )
    ew_bytes: Any = layers * (ew + elementwise_bytes("rope", m, h, qk_dim, ffn))
    ew_bytes += dense_layers * elementwise_bytes("act", m, h, qk_dim, ffn)
    ew_bytes += elementwise_bytes("embed", m, h, qk_dim, ffn) + elementwise_bytes(
        "norm", m, h, qk_dim, ffn
    )
    link = layers * 2 * m * h * DTYPE_BYTES if shard.tp > 1 else 0.0 * m
    router_bytes = 0.0 * m
    moe = model.moe
    if moe is not None:
        ep = shard.ep
        e_bpw = model.expert_weight_format.bytes_per_weight
        rows = m * moe.top_k / ep
        groups = _experts_touched(moe.num_experts, moe.top_k, m) / ep
        e_ffn = moe.expert_ffn * ep // shard.tp
        shared = moe.shared_ffn // shard.tp
        experts = ((h, 2 * e_ffn), (e_ffn, h))
        per_layer_bytes = gemm_bytes(m, h, moe.num_experts, DTYPE_BYTES) + sum(
            gemm_bytes(rows, k, n, e_bpw, groups) for k, n in experts
        )
        per_layer_flops = gemm_flops(m, h, moe.num_experts) + sum(
            gemm_flops(rows, k, n) for k, n in experts
        )
        ew_moe = gather_bytes(m, rows, h) + act_bytes(rows, e_ffn)
        if shared:
            shared_gemms = ((h, 2 * shared), (shared, h))
            per_layer_bytes += sum(gemm_bytes(m, k, n, e_bpw) for k, n in shared_gemms)
            per_layer_flops += sum(gemm_flops(m, k, n) for k, n in shared_gemms)
            ew_moe += act_bytes(m, shared)
        w_bytes += moe_layers * per_layer_bytes
        w_flops += moe_layers * per_layer_flops
        ew_bytes += moe_layers * ew_moe
        router_bytes = moe_layers * router_scores_bytes(m, moe.num_experts)
        if ep > 1:
            link += moe_layers * 2 * alltoall_bytes(m, moe.top_k, h, ep)
    # every layer's block over its tokens: sliding-window layers counted as full (an
    # upper bound on what they store and read)
    kv_stored = shard.block_size * shard.kv_stored_per_token_layer * layers / shard.block_size
    pair_flops = attention_flops_per_pair(shard.q_heads, model.head_dim) * layers
    zero = 0.0 * m  # a number or an array of zeros, like the inputs
    return {
        "weights": OpCost(zero, w_flops, scale * w_bytes, zero),
        "kv_read": OpCost(zero, pair_flops * decode_context, kv_stored * decode_context, zero),
        "attention": OpCost(zero, pair_flops * prefill_pairs, kv_stored * prefill_context, zero),
        "elementwise": OpCost(zero, zero, scale * ew_bytes + router_bytes, zero),
        "allreduce": OpCost(zero, zero, zero, scale * link),
        "host": OpCost(zero, zero, zero, zero),
    }


def _dtype_scale(model: ModelSpec) -> float:
    """How many times the 16-bit formulas' bytes a model in ``model.dtype_bytes`` moves."""
    if model.dtype_bytes == DTYPE_BYTES:
        return 1.0
    if model.weight_format.bits_per_weight < 16 or model.expert_weight_format.bits_per_weight < 16:
        raise ValueError(
            f"{model.name}: quantized weights ({model.weight_dtype}) are counted in a 16-bit "
            f"model only, not in one of {model.dtype_bytes}-byte values"
        )
    return model.dtype_bytes / DTYPE_BYTES


def _experts_touched(num_experts: int, top_k: int, num_tokens: Any) -> Any:
    """``moe.experts_touched`` of a number or of each element of an array."""
    if isinstance(num_tokens, (int, float)):
        return experts_touched(num_experts, top_k, num_tokens)
    import numpy as np

    return np.array([experts_touched(num_experts, top_k, float(t)) for t in num_tokens])


class _OpTimes:
    """Seconds per op of steps on one cost model; the token-parallel ops cached by the
    step's token count (they depend on nothing else)."""

    def __init__(self, cm: CostModel) -> None:
        self.cm = cm
        self._dense: dict[int, tuple[float, float, float]] = {}

    def dense(self, num_tokens: int) -> tuple[float, float, float]:
        """(linear, elementwise, link) seconds of every token-parallel op but the LM head."""
        got = self._dense.get(num_tokens)
        if got is None:
            cm = self.cm
            b = cm.breakdown(num_tokens)  # one chunk: its attention is dropped below
            layers = cm.model.num_layers
            per_layer = b.per_layer
            linear = layers * sum(per_layer.get(k, 0.0) for k in _LINEAR)
            linear += layers * per_layer.get("shared_expert", 0.0)
            elem = layers * sum(per_layer.get(k, 0.0) for k in _ELEMENTWISE)
            elem += b.per_step["embedding"] + b.per_step["final_norm"]
            link = layers * sum(per_layer.get(k, 0.0) for k in _LINK)
            got = self._dense[num_tokens] = (linear, elem, link)
        return got

    def __call__(
        self,
        num_tokens: int,
        num_samples: int,
        num_requests: int,
        num_decodes: int,
        context_sum: int,
        chunks: Sequence[tuple[int, int]],
    ) -> tuple[dict[str, float], float]:
        """Seconds per op (``OPS``) and the step's time (``CostModel.step_seconds``)."""
        cm = self.cm
        linear, elem, link = self.dense(num_tokens)
        ops = {
            "weights": linear + cm.lm_head_seconds(num_samples),
            "kv_read": cm.decode_attention_seconds(num_tokens, num_decodes, context_sum),
            "attention": cm.prefill_attention_seconds(num_tokens, chunks),
            "elementwise": elem,
            "allreduce": link,
        }
        total = cm.step_seconds(
            num_tokens, num_samples, num_requests, num_decodes, context_sum, chunks
        )
        ops["host"] = max(0.0, total - sum(ops.values()))
        return ops, total


def step_roofline(
    cm: CostModel,
    num_tokens: int,
    num_samples: int,
    num_requests: int,
    num_decodes: int = 0,
    context_sum: int = 0,
    chunks: Sequence[tuple[int, int]] = (),
    times: _OpTimes | None = None,
) -> StepRoofline:
    """One step, in ``CostModel.step_seconds``'s terms, read against the GPU."""
    seconds, total = (times or _OpTimes(cm))(
        num_tokens, num_samples, num_requests, num_decodes, context_sum, chunks
    )
    work = step_work(
        cm.shard,
        num_tokens,
        num_samples,
        context_sum,
        prefill_pairs(chunks),
        sum(c + p for c, p in chunks),
    )
    ops = {k: OpCost(seconds[k], w.flops, w.hbm_bytes, w.link_bytes) for k, w in work.items()}
    datasheet, fitted = ceilings(cm)
    shape = {
        "num_tokens": num_tokens,
        "num_samples": num_samples,
        "num_decodes": num_decodes,
        "decode_context": context_sum,
        "prefill_tokens": sum(c for c, _ in chunks),
    }
    return StepRoofline(ops, total, datasheet, fitted, shape)


def estimate_roofline(
    cm: CostModel,
    num_prefill_tokens: int,
    prior_context: int = 0,
    num_decodes: int = 0,
    decode_context: int = 0,
) -> StepRoofline:
    """The step ``CostModel.breakdown`` prices (``slotune estimate``): one prefill chunk
    after ``prior_context`` cached tokens plus ``num_decodes`` decodes of
    ``decode_context`` tokens each."""
    chunks = [(num_prefill_tokens, prior_context)] if num_prefill_tokens else []
    n = len(chunks) + num_decodes
    return step_roofline(
        cm,
        num_prefill_tokens + num_decodes,
        n,
        n,
        num_decodes,
        num_decodes * decode_context,
        chunks,
    )


RUN_COLUMNS = ("flops", "hbm_bytes", "intensity", "achieved_flops", "mbu", "mfu", "prefill_share")


def steps_work(shard: Shard, steps: Any) -> dict[str, OpCost]:
    """``step_work`` of every step of a run's steps frame (``StepStats`` columns), arrays
    of one value per step. Prefill chunks are taken as one chunk per step (their query-key
    pairs are exact for one chunk, an upper bound for more); a step samples its decodes
    plus one row for its prefill."""
    import numpy as np

    tokens = steps["num_scheduled_tokens"].to_numpy(float)
    prefill = steps["num_prefill_tokens"].to_numpy(float)
    decodes = steps["num_decode_tokens"].to_numpy(float)
    dec_ctx = _column(steps, "decode_context_sum")
    pre_ctx = np.maximum(_column(steps, "prefill_context_sum"), prefill)
    samples = decodes + (prefill > 0)
    return step_work(shard, tokens, samples, dec_ctx, prefill * (pre_ctx - 0.5 * prefill), pre_ctx)


def steps_roofline(shard: Shard, peak: Ceilings, steps: Any) -> Any:
    """Per step of a run's steps frame (``steps_work``): FLOPs, HBM bytes, arithmetic
    intensity, achieved FLOP/s, MBU and MFU against ``peak`` (the datasheet's, or the
    ceilings measured where a real engine ran) and the prefill share of the step's tokens,
    at the step's recorded duration."""
    import numpy as np
    import pandas as pd

    work = steps_work(shard, steps)
    tokens = steps["num_scheduled_tokens"].to_numpy(float)
    prefill = steps["num_prefill_tokens"].to_numpy(float)
    flops = sum(w.flops for w in work.values())
    nbytes = sum(w.hbm_bytes for w in work.values())
    seconds = steps["duration_s"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        achieved = np.where(seconds > 0, flops / seconds, 0.0)
        out = pd.DataFrame(
            {
                "flops": flops,
                "hbm_bytes": nbytes,
                "intensity": np.where(nbytes > 0, flops / nbytes, 0.0),
                "achieved_flops": achieved,
                "mbu": np.where(seconds > 0, nbytes / seconds, 0.0) / peak.hbm_bytes_per_s,
                "mfu": achieved / peak.flops_per_s,
                "prefill_share": np.where(tokens > 0, prefill / tokens, 0.0),
            },
            index=steps.index,
        )
    return out


def run_floor_seconds(shard: Shard, peak: Ceilings, steps: Any) -> dict[str, float]:
    """Seconds per op (``OPS``) over a measured run's steps at their roofline floors (an
    op's bytes over the bandwidth or its FLOPs over the peak, whichever is longer); under
    ``host`` the rest of the measured time (Python, dispatch, kernels short of the
    ceilings), so the ops sum to the run's step time as ``run_op_seconds``'s do."""
    import numpy as np

    work = steps_work(shard, steps)
    totals = {
        op: float(
            np.sum(np.maximum(w.hbm_bytes / peak.hbm_bytes_per_s, w.flops / peak.flops_per_s))
        )
        for op, w in work.items()
    }
    measured = float(steps["duration_s"].to_numpy(float).sum())
    totals["host"] = max(0.0, measured - sum(totals.values()))
    return totals


def run_op_seconds(cm: CostModel, steps: Any, max_steps: int = 20000) -> dict[str, float]:
    """Seconds per op (``OPS``) summed over a run's steps as the cost model prices each
    (its prefill as one chunk per step; swaps and copy-on-write, which the frame does not
    record, left out); runs of more than ``max_steps`` steps are priced on that many evenly
    spaced steps, scaled up."""
    import numpy as np

    n = len(steps)
    totals = dict.fromkeys(OPS, 0.0)
    if n == 0:
        return totals
    pick = np.linspace(0, n - 1, min(n, max_steps)).round().astype(int)
    times = _OpTimes(cm)
    cols = [
        steps[c].to_numpy()[pick]
        for c in ("num_scheduled_tokens", "num_prefill_tokens", "num_decode_tokens")
    ]
    dec_ctx = _column(steps, "decode_context_sum")[pick]
    pre_ctx = _column(steps, "prefill_context_sum")[pick]
    for tokens, prefill, decodes, dctx, pctx in zip(*cols, dec_ctx, pre_ctx, strict=True):
        t, p, d = int(tokens), int(prefill), int(decodes)
        if t <= 0:
            continue
        chunks = [(p, max(0, int(pctx) - p))] if p else []
        rows = d + (1 if p else 0)
        seconds, _ = times(t, rows, rows, d, int(dctx), chunks)
        for k, v in seconds.items():
            totals[k] += v
    scale = n / len(pick)
    return {k: v * scale for k, v in totals.items()}


def _column(steps: Any, name: str) -> Any:
    import numpy as np

    if name in steps:
        return steps[name].fillna(0).to_numpy(float)
    return np.zeros(len(steps))


def roofline_dict(r: StepRoofline) -> dict[str, Any]:
    """``r`` as JSON-ready numbers (ms, FLOPs, bytes, shares)."""
    return {
        "step_ms": r.seconds * 1e3,
        "bound_op": r.bound_op,
        "bound_by": r.limit(r.bound_op),
        "flops": r.flops,
        "hbm_bytes": r.hbm_bytes,
        "intensity": r.intensity,
        "ridge": r.datasheet.ridge,
        "mbu": r.mbu(),
        "mfu": r.mfu(),
        "mbu_fitted": r.mbu(r.fitted),
        "mfu_fitted": r.mfu(r.fitted),
        "ops": {
            op: {
                "ms": o.seconds * 1e3,
                "flops": o.flops,
                "hbm_bytes": o.hbm_bytes,
                "link_bytes": o.link_bytes,
                "bound_by": r.limit(op),
            }
            for op, o in r.ops.items()
        },
    }
