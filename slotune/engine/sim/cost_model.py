"""The step-time model of a named GPU and model.

Each op is a roofline: its time is an overhead plus the larger of its bytes over the
effective bandwidth and its FLOPs over the effective compute rate, with the efficiencies of
a fitted ``GpuProfile``. The op functions below take plain shapes, so calibration can
evaluate them on the reference rows; ``CostModel`` precomputes what one model on one GPU
needs, so that costing a step is a handful of arithmetic operations over aggregates of the
batch (tokens, sampled rows, requests, decode context sum, the prefill chunks).

A model's sliding-window layers (``ModelSpec.num_sliding_layers``) read at most the
window's KV: a prefill chunk's query-key pairs and KV reads are counted exactly for its
``(tokens, prior)`` (``window_pairs``); a step's decodes, known only by their number and
context sum, read ``min(context_sum, decodes × window)`` tokens in those layers — exact
when every context is at least the window, an upper bound otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

from slotune.engine.kv_dtype import kv_block_bytes
from slotune.engine.sim.hardware import GpuSpec
from slotune.engine.sim.models import ModelSpec
from slotune.engine.sim.moe import DEFAULT_IMBALANCE, MoECost
from slotune.engine.sim.precision import format_gemm_seconds, gemm_bytes, gemm_rate
from slotune.engine.sim.profile import (
    AttentionProfile,
    ElementwiseProfile,
    GpuProfile,
    LinearProfile,
    decode_calls,
)
from slotune.engine.sim.stack import StackProfile, graph_capture_sizes, graph_max_tokens

_US = 1e-6
DTYPE_BYTES = 2
KV_DEQUANT_BYTES = 0.25
"""What dequantizing one cached value costs attention, in bytes of extra read: a quantized
KV cache reads its codes and scales plus this per value (so fp8 decode attention reads
1.25 bytes' worth where bf16 reads 2). An estimate for the conversion the kernel does
between load and MMA, not fitted."""


def gemm_seconds(p: LinearProfile, bw: float, peak: float, m: int, k: int, n: int) -> float:
    """``[m, k] @ [k, n]`` in bf16: weight + activation bytes against tile-padded FLOPs
    (``p`` as ``LinearProfile.for_gpu`` gives it for the card of ``bw`` and ``peak``)."""
    if m <= 0:
        return 0.0
    tile = p.tile_tokens
    m_pad = -(-m // tile) * tile
    t_mem = gemm_bytes(m, k, n, DTYPE_BYTES) / (bw * p.mem_eff)
    t_cmp = 2.0 * (m_pad + p.ramp(n)) * k * n / (peak * p.compute_eff)
    return p.overhead_us * _US + (t_mem if t_mem > t_cmp else t_cmp)


def elementwise_bytes(op: str, m: int, hidden: int, qk_dim: int, ffn: int) -> int:
    """Bytes one memory-bound kernel moves for ``m`` tokens (per GPU shard)."""
    if op in ("norm", "embed"):
        return 2 * m * hidden * DTYPE_BYTES
    if op == "add":
        return 3 * m * hidden * DTYPE_BYTES
    if op == "rope":
        return 2 * m * qk_dim * DTYPE_BYTES
    if op == "act":
        return 3 * m * ffn * DTYPE_BYTES
    raise ValueError(f"unknown elementwise op {op!r}")


def elementwise_seconds(p: ElementwiseProfile, bw: float, nbytes: float) -> float:
    if nbytes <= 0:
        return 0.0
    return p.overhead_us * _US + nbytes / (bw * p.eff)


def attention_flops_per_pair(q_heads: int, head_dim: int) -> float:
    """FLOPs of one query-key pair in one layer: ``QKᵀ`` and ``PV``, two FMAs per head dim."""
    return 4.0 * q_heads * head_dim


def prefill_attention_seconds(
    p: AttentionProfile,
    bw: float,
    peak: float,
    chunk: int,
    prior: int,
    q_heads: int,
    head_dim: int,
    kv_bytes_per_token: int,
) -> float:
    """One chunk of ``chunk`` new tokens attending to ``prior`` cached ones and causally to
    itself, without the per-kernel overhead (paid once per step)."""
    q_pad = -(-chunk // p.q_tile) * p.q_tile
    per_pair = attention_flops_per_pair(q_heads, head_dim)
    t_cmp = per_pair * q_pad * prior / (peak * p.prefill_prefix_eff) + (
        per_pair * 0.5 * q_pad * chunk / (peak * p.prefill_causal_eff)
    )
    t_mem = (prior + chunk) * kv_bytes_per_token / bw
    return t_cmp if t_cmp > t_mem else t_mem


def window_pairs(chunk: int, prior: int, window: int) -> tuple[float, float]:
    """Query-key pairs of a prefill chunk in a layer attending to the last ``window``
    tokens: (with the ``prior`` cached tokens, within the chunk). Counted as full
    attention's ``chunk · prior`` and ``chunk² / 2`` are, query ``j`` of the chunk
    (``0 ≤ j < chunk``) seeing ``min(j, window)`` of the chunk's tokens and
    ``min(prior, max(0, window − j))`` of the prior ones; a window longer than the chunk
    and its prior context gives exactly those."""
    c, p, w = chunk, prior, window
    causal = c * c / 2 if c <= w else w * c - w * w / 2
    sees_all = min(c, max(0, w - p))  # queries whose window reaches back past the prior
    sees_some = min(c, w)  # queries whose window reaches into the prior at all
    prefix = p * sees_all + ((w - sees_all) ** 2 - (w - sees_some) ** 2) / 2
    return prefix, causal


def decode_kv_seconds_per_token(
    p: AttentionProfile, bw: float, kv_bytes_per_token: float, block_size: int
) -> float:
    """Seconds per context token read by decode attention at ``block_size``."""
    return (
        kv_bytes_per_token * (1.0 + p.block_indirection_tokens / block_size) / (bw * p.decode_eff)
    )


def decode_attention_seconds(
    p: AttentionProfile,
    bw: float,
    num_seqs: int,
    context_sum: int,
    kv_bytes_per_token: int,
    block_size: int,
) -> float:
    if num_seqs <= 0:
        return 0.0
    per_token = decode_kv_seconds_per_token(p, bw, kv_bytes_per_token, block_size)
    return (p.decode_overhead_us + p.decode_per_seq_us * num_seqs) * _US + per_token * context_sum


def kv_bytes_per_token_layer(
    kv_cache_dtype: str,
    block_size: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: int = DTYPE_BYTES,
) -> tuple[float, float]:
    """(stored, read) KV bytes per token in one layer of one GPU: the stored bytes (codes
    and scales, ``kv_dtype.kv_block_bytes``; ``auto`` in the model's ``dtype_bytes``) over
    the block, and what attention pays to read them (plus ``KV_DEQUANT_BYTES`` per value
    for a quantized cache)."""
    block = kv_block_bytes(kv_cache_dtype, block_size, kv_heads, head_dim, dtype_bytes)
    stored = block // block_size if block % block_size == 0 else block / block_size
    if kv_cache_dtype == "auto":
        return stored, stored
    return stored, stored + KV_DEQUANT_BYTES * 2 * kv_heads * head_dim


CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 1024 * 1024
"""The largest message vLLM's custom all-reduce takes (its registered buffer, ``max_size``
in ``custom_all_reduce.py``); larger ones go to NCCL."""
ONE_STAGE_MAX_BYTES = {2: CUSTOM_ALLREDUCE_MAX_BYTES, 4: 512 * 1024, 8: 256 * 1024}
"""Below these, the custom all-reduce runs in one stage on up to 2, 4 and 8 GPUs (every
rank reads every peer's buffer and sums); above, in two (reduce-scatter, all-gather), as
``csrc/custom_all_reduce.cuh`` picks its kernel."""


def custom_allreduce_applies(gpu: GpuSpec, tp: int) -> bool:
    """Whether a custom (peer-to-peer) all-reduce serves ``tp`` GPUs of ``gpu``: a GPU
    fabric (NVLink, Infinity Fabric) between them, all-to-all beyond a pair (an NVLink
    bridge joins two cards only), at most 8 GPUs. Cards on PCIe alone use NCCL's ring."""
    fabric = gpu.interconnect.startswith(("NVLink", "Infinity Fabric"))
    if not fabric or tp > 8:
        return False
    return tp == 2 or "bridge" not in gpu.interconnect


def allreduce_seconds(
    profile: GpuProfile, tp: int, nbytes: float, stack: StackProfile | None = None
) -> float:
    """One all-reduce of ``nbytes`` over ``tp`` GPUs, with the latency and link efficiency
    of ``stack`` where it sets them. ``stack.allreduce == "custom"`` (vLLM and SGLang on a
    GPU fabric, below ``CUSTOM_ALLREDUCE_MAX_BYTES``): one stage (one latency, every rank
    reading ``tp − 1`` peers' buffers) below ``ONE_STAGE_MAX_BYTES``, two stages above
    (two latencies, ``2 (tp−1)/tp`` of the bytes). Otherwise NCCL's ring in the alpha-beta
    model: ``2 (tp−1)`` hops of the latency and ``2 (tp−1)/tp`` of the bytes, all over one
    direction of the link."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    s = (stack or StackProfile()).on(profile.system)
    latency = float(s.allreduce_latency_us or 0.0) * _US
    per_dir = profile.gpu.interconnect_gbps * 1e9 / 2 * float(s.allreduce_eff or 1.0)
    if (
        s.allreduce == "custom"
        and nbytes < CUSTOM_ALLREDUCE_MAX_BYTES
        and custom_allreduce_applies(profile.gpu, tp)
    ):
        one_stage = next(v for k, v in ONE_STAGE_MAX_BYTES.items() if tp <= k)
        if nbytes < one_stage:
            return latency + (tp - 1) * nbytes / per_dir
        return 2 * latency + 2 * (tp - 1) / tp * nbytes / per_dir
    return 2 * (tp - 1) * latency + 2 * (tp - 1) / tp * nbytes / per_dir


@dataclass(frozen=True)
class Shard:
    """What one of ``tp`` GPUs holds of ``model`` (``ep`` of them expert-parallel): the
    widths its GEMMs and attention run at and the KV bytes per token and layer it stores
    and reads in ``kv_cache_dtype``. Everything ``CostModel`` and the roofline count
    comes from these, so a model run outside the simulator (the real engine's checkpoint)
    is counted by the same rules."""

    model: ModelSpec
    tp: int
    ep: int
    block_size: int
    kv_cache_dtype: str
    hidden: int
    q_heads: int
    kv_heads: int
    qkv_out: int
    attn_dim: int
    ffn: int
    vocab: int
    kv_stored_per_token_layer: float
    kv_read_per_token_layer: float

    @classmethod
    def of(
        cls,
        model: ModelSpec,
        tp: int = 1,
        ep: int = 1,
        block_size: int = 16,
        kv_cache_dtype: str = "auto",
    ) -> Shard:
        model.check_tp(tp)
        model.check_ep(tp, ep)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        qkv_out, attn_dim = model.attention_widths(tp)
        stored, read = kv_bytes_per_token_layer(
            kv_cache_dtype, block_size, *model.kv_cache_shape(tp), model.dtype_bytes
        )
        return cls(
            model,
            tp,
            ep,
            block_size,
            kv_cache_dtype,
            hidden=model.hidden_size,
            q_heads=model.num_heads // tp,
            kv_heads=model.kv_heads_per_gpu(tp),
            qkv_out=qkv_out,
            attn_dim=attn_dim,
            ffn=model.intermediate_size // tp,
            vocab=-(-model.vocab_size // tp),
            kv_stored_per_token_layer=stored,
            kv_read_per_token_layer=read,
        )

    @property
    def block_bytes(self) -> float:
        """One block's stored KV bytes, all full-attention layers (a block of the pool:
        ``capacity``)."""
        return self.block_size * self.kv_stored_per_token_layer * self.model.num_full_layers


@dataclass(frozen=True)
class _Kernels:
    """The kernel constants one step uses: eager, or replayed as a CUDA graph (every fixed
    overhead scaled)."""

    linear: LinearProfile
    linear_seconds: Callable[[int, int, int], float]
    elementwise: dict[str, ElementwiseProfile]
    decode_fixed: float
    prefill_fixed: float

    @classmethod
    def of(cls, profile: GpuProfile, model: ModelSpec, scale: float) -> _Kernels:
        """``profile``'s kernels (as ``_as_run_by``) with every fixed overhead times
        ``scale``."""
        att, layers = profile.attention, model.num_layers
        linear = replace(profile.linear, overhead_us=profile.linear.overhead_us * scale)
        return cls(
            linear,
            _linear_pricer(replace(profile, linear=linear), model),
            {
                op: replace(e, overhead_us=e.overhead_us * scale)
                for op, e in profile.elementwise.items()
            },
            layers * att.decode_overhead_us * scale * _US,
            layers * att.prefill_overhead_us * scale * _US,
        )


def _as_run_by(profile: GpuProfile, stack: StackProfile) -> GpuProfile:
    """``profile`` as ``stack``'s kernels run: bandwidth and compute rates divided by the
    stack's ``gpu_time_scale``, the GEMM ramp moved to the card's balance."""
    gpu, s = profile.gpu, stack.gpu_time_scale
    linear = profile.linear.for_gpu(gpu)
    if s != 1.0:
        gpu = replace(
            gpu,
            hbm_gbps=gpu.hbm_gbps / s,
            bf16_tflops=gpu.bf16_tflops / s,
            fp8_tflops=None if gpu.fp8_tflops is None else gpu.fp8_tflops / s,
            int8_tops=None if gpu.int8_tops is None else gpu.int8_tops / s,
        )
    return replace(profile, gpu=gpu, linear=linear)


@dataclass(frozen=True)
class StepBreakdown:
    """One step's time by op: ``per_layer`` in seconds for one layer, the rest per step."""

    per_layer: dict[str, float]
    per_step: dict[str, float]
    total: float


class CostModel:
    """Step durations of ``model`` on ``tp`` GPUs described by ``profile``, served by the
    engine that ``stack`` describes (default: slotune's eager engine as the profile
    measured it). ``max_num_seqs`` and ``max_num_batched_tokens`` set the largest CUDA-graph
    batch where the stack uses graphs (``stack.graph_max_tokens``).

    Shapes are those of one GPU's shard. Linear layers run in the model's weight format
    (``precision``); a MoE model's expert layers are priced by ``moe.MoECost`` with ``ep``
    expert-parallel GPUs and ``moe_imbalance``; ``kv_cache_dtype`` sets the KV bytes that
    attention reads and swaps move. The public costing calls are ``step_seconds``
    (any batch), ``decode_step_seconds`` (a step of decodes only) and
    ``breakdown`` (per-op detail for ``slotune estimate``).
    """

    def __init__(
        self,
        profile: GpuProfile,
        model: ModelSpec,
        tp: int = 1,
        block_size: int = 16,
        stack: StackProfile | None = None,
        max_num_seqs: int = 256,
        *,
        max_num_batched_tokens: int = 0,
        ep: int = 1,
        kv_cache_dtype: str = "auto",
        moe_imbalance: float = DEFAULT_IMBALANCE,
    ) -> None:
        self.shard = shard = Shard.of(model, tp, ep, block_size, kv_cache_dtype)
        self.stack = stack = stack or StackProfile()
        run = _as_run_by(profile, stack)
        self.profile, self.model, self.tp, self.block_size = profile, model, tp, block_size
        self.ep = ep
        gpu = run.gpu
        self.bw, self.peak = gpu.hbm_bytes_per_s, gpu.flops_per_s
        m = model
        self.hidden, self.q_heads, self.kv_heads = shard.hidden, shard.q_heads, shard.kv_heads
        self.qkv_out, self.attn_dim = shard.qkv_out, shard.attn_dim
        self.ffn, self.vocab = shard.ffn, shard.vocab
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_bytes_per_token_layer = shard.kv_read_per_token_layer
        self.block_bytes = shard.block_bytes
        self._moe = MoECost(run, model, tp, ep, moe_imbalance) if model.moe else None
        layers, full, window = m.num_layers, m.num_full_layers, m.sliding_window or 0
        sliding = m.num_sliding_layers
        self._window = window if sliding else 0
        att = run.attention
        time_scale = stack.gpu_time_scale
        self._eager = _Kernels.of(run, model, time_scale)
        self._graph = _Kernels.of(run, model, stack.graph_overhead_scale * time_scale)
        graph_max = graph_max_tokens(stack, max_num_seqs, max_num_batched_tokens)
        sizes = graph_capture_sizes(graph_max) if graph_max else ()
        self.graph_max_tokens = sizes[-1] if sizes else 0
        self._padded = [0] * (self.graph_max_tokens + 1)
        for lo, hi in zip((0, *sizes), sizes, strict=False):
            self._padded[lo + 1 : hi + 1] = [hi] * (hi - lo)
        per_seq_layer = att.decode_per_seq_us + stack.decode_seq_layer_us
        self._dec_per_seq = layers * per_seq_layer * time_scale * _US
        self._dec_per_call = layers * att.decode_per_call_us * time_scale * _US
        self._dec_ranges = att.decode_call_ranges
        per_ctx = decode_kv_seconds_per_token(
            att, self.bw, self.kv_bytes_per_token_layer, block_size
        )
        self._dec_per_ctx = full * per_ctx
        self._dec_per_window_ctx = sliding * per_ctx
        layer_pair = attention_flops_per_pair(self.q_heads, m.head_dim)
        per_pair = layer_pair * full
        self._q_tile = att.q_tile
        self._pre_prefix = per_pair / (self.peak * att.prefill_prefix_eff)
        self._pre_causal = 0.5 * per_pair / (self.peak * att.prefill_causal_eff)
        self._pre_mem = full * self.kv_bytes_per_token_layer / self.bw
        self._pre_per_chunk = layers * att.prefill_per_chunk_us * time_scale * _US
        self._win_prefix = sliding * layer_pair / (self.peak * att.prefill_prefix_eff)
        self._win_causal = sliding * layer_pair / (self.peak * att.prefill_causal_eff)
        self._win_mem = sliding * self.kv_bytes_per_token_layer / self.bw
        sysp = run.system
        self._overlap = stack.host_overlap
        host = stack.on(sysp)
        self._cpu_step = float(host.host_step_us or 0.0) * _US
        self._cpu_req = float(host.host_per_request_us or 0.0) * _US
        self._cpu_tok = stack.host_per_token_us * _US
        self._exposed = stack.host_exposed_us * _US
        host_bw = gpu.host_link_gbps * 1e9 * sysp.host_link_eff
        copy_calls = 2 * layers * sysp.copy_call_us * _US  # one K and one V copy per layer
        self._swap_per_block = self.block_bytes / host_bw + copy_calls
        self._cow_per_block = 2 * self.block_bytes / self.bw + copy_calls
        self._dense_cache: dict[int, float] = {}
        self._lm_cache: dict[int, float] = {}

    # -- per-op pieces ------------------------------------------------------------------
    def is_graph(self, num_tokens: int) -> bool:
        """Whether a step of ``num_tokens`` runs as a CUDA graph."""
        return num_tokens <= self.graph_max_tokens

    def kernels(self, num_tokens: int) -> _Kernels:
        return self._graph if num_tokens <= self.graph_max_tokens else self._eager

    def padded_tokens(self, num_tokens: int) -> int:
        """The token count the GPU computes: padded to a captured size in a graph."""
        return self._padded[num_tokens] if num_tokens <= self.graph_max_tokens else num_tokens

    def layer_ops(self, num_tokens: int) -> dict[str, float]:
        """Seconds of each token-parallel op of one layer for ``num_tokens`` tokens
        (``norms``: both RMSNorms and both residual adds; ``allreduce``: both of a layer),
        with the kernel overheads of a step of that many tokens (no padding)."""
        p, bw, h, m = self.profile, self.bw, self.hidden, num_tokens
        kern = self.kernels(num_tokens)
        ew, linear = kern.elementwise, kern.linear_seconds
        qk_dim = (self.q_heads + self.kv_heads) * self.model.head_dim

        def elem(op: str) -> float:
            return elementwise_seconds(ew[op], bw, elementwise_bytes(op, m, h, qk_dim, self.ffn))

        return {
            "qkv_proj": linear(m, h, self.qkv_out),
            "rope": elem("rope"),
            "o_proj": linear(m, self.attn_dim, h),
            "mlp_up": linear(m, h, 2 * self.ffn),
            "mlp_act": elem("act"),
            "mlp_down": linear(m, self.ffn, h),
            "norms": 2 * elem("norm") + 2 * elem("add"),
            "allreduce": 2 * allreduce_seconds(p, self.tp, m * h * DTYPE_BYTES, self.stack),
        }

    def dense_seconds(self, num_tokens: int) -> float:
        """Every token-parallel op of the whole model (all layers, embedding, final norm),
        on the padded batch of a graph step."""
        t = self._dense_cache.get(num_tokens)
        if t is None:
            if num_tokens <= 0:
                t = 0.0
            else:
                ew, h = self.kernels(num_tokens).elementwise, self.hidden
                m = self.padded_tokens(num_tokens)
                ops = self.layer_ops(m)
                if self._moe is None:
                    t = self.model.num_layers * sum(ops.values())
                else:
                    t = self._moe.layers_seconds(ops, m)
                t += elementwise_seconds(ew["embed"], self.bw, 2 * m * h * DTYPE_BYTES)
                t += elementwise_seconds(ew["norm"], self.bw, 2 * m * h * DTYPE_BYTES)
            self._dense_cache[num_tokens] = t
        return t

    def lm_head_seconds(self, num_samples: int) -> float:
        t = self._lm_cache.get(num_samples)
        if t is None:
            t = gemm_seconds(
                self.kernels(num_samples).linear,
                self.bw,
                self.peak,
                num_samples,
                self.hidden,
                self.vocab,
            )
            self._lm_cache[num_samples] = t
        return t

    def prefill_chunk_seconds(self, chunk: int, prior: int) -> float:
        """All layers' attention for one prefill chunk (without the per-step overhead)."""
        q_pad = -(-chunk // self._q_tile) * self._q_tile
        t_cmp = self._pre_prefix * q_pad * prior + self._pre_causal * q_pad * chunk
        t_mem = self._pre_mem * (prior + chunk)
        t = t_cmp if t_cmp > t_mem else t_mem
        if self._window and chunk > 0:
            w = self._window
            prefix, causal = window_pairs(chunk, prior, w)
            pad = q_pad / chunk  # padded queries, as full attention counts them
            w_cmp = (self._win_prefix * prefix + self._win_causal * causal) * pad
            w_mem = self._win_mem * (min(prior, w) + chunk)
            t += w_cmp if w_cmp > w_mem else w_mem
        if self._pre_per_chunk:
            t += self._pre_per_chunk
        return t

    def window_decode_seconds(self, num_decodes: int, context_sum: int) -> float:
        """The sliding-window layers' reads of ``num_decodes`` decodes of ``context_sum``
        tokens together: ``min(context_sum, num_decodes × window)`` tokens (0 for a model
        without such layers; their fixed and per-request costs are in the decode terms)."""
        if not self._window:
            return 0.0
        return self._dec_per_window_ctx * min(context_sum, num_decodes * self._window)

    def swap_seconds(self, num_blocks: int) -> float:
        return self._swap_per_block * num_blocks

    def copy_on_write_seconds(self, num_blocks: int) -> float:
        return self._cow_per_block * num_blocks

    # -- whole steps --------------------------------------------------------------------
    def step_seconds(
        self,
        num_tokens: int,
        num_samples: int,
        num_requests: int,
        num_decodes: int = 0,
        decode_context_sum: int = 0,
        prefill_chunks: Sequence[tuple[int, int]] = (),
        num_swapped_blocks: int = 0,
        num_cow_blocks: int = 0,
    ) -> float:
        """One step: ``num_tokens`` scheduled in all; ``num_decodes`` one-token requests
        reading ``decode_context_sum`` KV tokens together (each counts its new token);
        ``prefill_chunks`` as ``(chunk_tokens, prior_context)``; ``num_samples`` rows
        reach the LM head; ``num_requests`` requests pay the per-request host cost."""
        t = self.gpu_step_seconds(
            num_tokens,
            num_samples,
            num_decodes,
            decode_context_sum,
            prefill_chunks,
            num_swapped_blocks,
            num_cow_blocks,
        )
        return self.with_host(
            t, self._cpu_step + self._cpu_req * num_requests + self._cpu_tok * num_tokens
        )

    def gpu_step_seconds(
        self,
        num_tokens: int,
        num_samples: int,
        num_decodes: int = 0,
        decode_context_sum: int = 0,
        prefill_chunks: Sequence[tuple[int, int]] = (),
        num_swapped_blocks: int = 0,
        num_cow_blocks: int = 0,
    ) -> float:
        """``step_seconds`` on the GPU alone, without the host's share (what a forward pass
        inside a step costs, such as a draft model's)."""
        t = self.dense_seconds(num_tokens) + self.lm_head_seconds(num_samples)
        if num_decodes:
            t += (
                self.kernels(num_tokens).decode_fixed
                + self._dec_per_seq * num_decodes
                + (self._dec_per_ctx * decode_context_sum)
            )
            if self._window:
                t += self.window_decode_seconds(num_decodes, decode_context_sum)
            if self._dec_per_call:
                t += self._dec_per_call * decode_calls(num_decodes, self._dec_ranges)
        if prefill_chunks:
            t += self.kernels(num_tokens).prefill_fixed
            for chunk, prior in prefill_chunks:
                t += self.prefill_chunk_seconds(chunk, prior)
        if num_swapped_blocks:
            t += self._swap_per_block * num_swapped_blocks
        if num_cow_blocks:
            t += self._cow_per_block * num_cow_blocks
        return t

    def host_seconds(self, num_tokens: int, num_requests: int) -> float:
        """The host's hideable work of a step of ``num_tokens`` for ``num_requests`` (as
        ``step_seconds`` inlines it)."""
        return self._cpu_step + self._cpu_req * num_requests + self._cpu_tok * num_tokens

    def with_host(self, gpu: float, host: float) -> float:
        """A step of ``gpu`` seconds on the GPU and ``host`` of hideable host work,
        ``host_overlap`` of the shorter one hidden behind the longer (1: ``max(gpu, host)``,
        async scheduling; 0: their sum, a synchronous engine), plus the host work on the
        critical path (``host_exposed_us``)."""
        if self._overlap == 0.0:
            return gpu + host + self._exposed
        return gpu + host - self._overlap * (gpu if gpu < host else host) + self._exposed

    def decode_step_seconds(self, num_decodes: int, context_sum: int) -> float:
        """A step of ``num_decodes`` one-token requests only (no prefill, swap or copy)."""
        return self.step_seconds(num_decodes, num_decodes, num_decodes, num_decodes, context_sum)

    def breakdown(
        self,
        num_prefill_tokens: int,
        prior_context: int = 0,
        num_decodes: int = 0,
        decode_context: int = 0,
    ) -> StepBreakdown:
        """Per-op times of one step: one prefill chunk of ``num_prefill_tokens`` after
        ``prior_context`` cached tokens, plus ``num_decodes`` decodes each reading
        ``decode_context`` tokens."""
        num_tokens = num_prefill_tokens + num_decodes
        layers = self.model.num_layers
        per_layer = self.layer_ops(self.padded_tokens(num_tokens))
        if self._moe is not None:
            per_layer = self._moe.mean_layer_ops(per_layer, self.padded_tokens(num_tokens))
        chunks = [(num_prefill_tokens, prior_context)] if num_prefill_tokens else []
        attention = 0.0
        kern = self.kernels(num_tokens)
        if chunks:
            attention += kern.prefill_fixed + self.prefill_chunk_seconds(*chunks[0])
        if num_decodes:
            attention += self.decode_attention_seconds(
                num_tokens, num_decodes, num_decodes * decode_context
            )
        per_layer["attention"] = attention / layers
        num_samples = (1 if chunks else 0) + num_decodes
        num_requests = len(chunks) + num_decodes
        ew = kern.elementwise
        nbytes = 2 * self.padded_tokens(num_tokens) * self.hidden * DTYPE_BYTES
        per_step = {
            "layers": layers * sum(per_layer.values()),
            "embedding": elementwise_seconds(ew["embed"], self.bw, nbytes),
            "final_norm": elementwise_seconds(ew["norm"], self.bw, nbytes),
            "lm_head": self.lm_head_seconds(num_samples),
            "cpu": self.host_seconds(num_tokens, num_requests),
            "cpu_exposed": self._exposed,
        }
        total = self.step_seconds(
            num_tokens,
            num_samples,
            num_requests,
            num_decodes,
            num_decodes * decode_context,
            chunks,
        )
        return StepBreakdown(per_layer, per_step, total)

    # -- attention as one op each, for ``roofline`` (``step_seconds`` inlines the same) ----
    def decode_attention_seconds(
        self, num_tokens: int, num_decodes: int, context_sum: int
    ) -> float:
        """All layers' decode attention in a step of ``num_tokens``: ``num_decodes``
        requests reading ``context_sum`` KV tokens together."""
        if not num_decodes:
            return 0.0
        calls = self._dec_per_call * decode_calls(num_decodes, self._dec_ranges)
        return (
            self.kernels(num_tokens).decode_fixed
            + self._dec_per_seq * num_decodes
            + (self._dec_per_ctx * context_sum)
            + self.window_decode_seconds(num_decodes, context_sum)
            + calls
        )

    def prefill_attention_seconds(
        self, num_tokens: int, prefill_chunks: Sequence[tuple[int, int]]
    ) -> float:
        """All layers' prefill attention in a step of ``num_tokens`` for ``prefill_chunks``
        as ``(chunk_tokens, prior_context)``."""
        if not prefill_chunks:
            return 0.0
        t = self.kernels(num_tokens).prefill_fixed
        for chunk, prior in prefill_chunks:
            t += self.prefill_chunk_seconds(chunk, prior)
        return t


def _linear_pricer(profile: GpuProfile, model: ModelSpec) -> Callable[[int, int, int], float]:
    """``(m, k, n) -> seconds`` of one linear layer in the model's weight format: exactly
    ``gemm_seconds`` for 16-bit weights."""
    gpu, fmt = profile.gpu, model.weight_format
    if fmt.bits_per_weight == 16:
        return partial(gemm_seconds, profile.linear, gpu.hbm_bytes_per_s, gpu.flops_per_s)
    rate, weight_only = gemm_rate(fmt, gpu)
    return partial(
        format_gemm_seconds,
        profile.linear,
        gpu.hbm_bytes_per_s,
        rate,
        fmt.bytes_per_weight,
        weight_only,
    )
