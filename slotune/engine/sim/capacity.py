"""How many KV blocks fit: the GPU's share of memory less weights and activation workspace.

As in vLLM's memory profiling, the pool is what is left of ``gpu_memory_utilization`` of
the card after the weights, a fixed runtime reserve (CUDA context, cuBLAS and NCCL
workspaces) and the activations of the largest forward pass, which grow with
``max_num_batched_tokens``. A bigger token budget therefore costs KV space. The weights
are those of the model's weight format, every expert of a MoE model included; a block's
bytes are those of ``config.kv_cache_dtype`` (``kv_dtype.kv_block_bytes``).

A model with sliding-window layers (gpt-oss) is sized as vLLM V1's hybrid KV cache manager
sizes it (``kv_cache_planning._get_kv_cache_groups_uniform_page_size`` and
``get_kv_cache_config_from_groups``): its full-attention and its sliding-window layers form
KV cache groups of equally many layers, every group's blocks drawn from one pool of blocks
of one group's bytes, and ``SlidingWindowManager`` frees a request's blocks behind its
window. A request's full-attention KV therefore holds one block per ``block_size`` tokens
of ``num_full_layers`` layers' bytes, and slotune's block is exactly that: the pool holds
``layers / full layers`` times the tokens of all-full pricing (twice, for gpt-oss). The
sliding layers' own pages — the ``window − 1`` tokens before the next one and that one, at
most ``ceil((window − 1) / block) + 1`` blocks a running request (9 for gpt-oss's 128
tokens in blocks of 16), plus a prefilling chunk's — come from the same pool in vLLM, but
slotune's one-pool block manager cannot charge a request a fixed number of blocks, and a
static reserve would have to guess how many requests run (``max_num_seqs`` of them would
take over half of gpt-oss-120b's pool on one H100). They are left out: the pool is
overstated by them, ``(sliding / full layers) · 9 · 16 / context`` of what requests of a
mean ``context`` hold (3.6 % for gpt-oss at 4000 tokens, 7 % at 2000), up to twice at
contexts within the window. vLLM pads groups to equal sizes (none for gpt-oss's 12 + 12 or
18 + 18 layers); that padding is not priced.
"""

from __future__ import annotations

from slotune.engine.config import EngineConfig
from slotune.engine.executor import KVCacheCapacity
from slotune.engine.kv_dtype import kv_block_bytes as kv_layer_block_bytes
from slotune.engine.sim.models import ModelSpec
from slotune.engine.sim.profile import GpuProfile

GIB = 1 << 30
LOGIT_BYTES = 4  # logits are kept in fp32 for sampling


def activation_bytes_per_token(model: ModelSpec, tp: int) -> int:
    """Live activations per batched token at the peak of a layer (per GPU, bf16):
    residual, normed input and attention output (3 × hidden), the QKV output, and the
    gate/up output with the activated half (3 × FFN shard). A MoE layer holds, per token,
    ``top_k`` routed rows of those and their outputs (as vLLM's fused-MoE caches do), plus
    the shared expert's; the larger of its and the dense MLP's peak counts."""
    qkv, _ = model.attention_widths(tp)
    ffn = 3 * model.intermediate_size // tp
    if model.moe is not None:
        moe = model.moe
        routed = moe.top_k * (3 * moe.expert_ffn // tp + model.hidden_size)
        ffn = max(ffn, routed + 3 * moe.shared_ffn // tp)
    return model.dtype_bytes * (3 * model.hidden_size + qkv + ffn)


def activation_workspace_bytes(
    model: ModelSpec, tp: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """Activations of a full-budget step plus the fp32 logits of the rows that sample."""
    sampled = min(max_num_seqs, max_num_batched_tokens)
    vocab = -(-model.vocab_size // tp)
    return (
        max_num_batched_tokens * activation_bytes_per_token(model, tp)
        + sampled * vocab * LOGIT_BYTES
    )


def layer_block_bytes(
    model: ModelSpec, tp: int, block_size: int, kv_cache_dtype: str = "auto"
) -> int:
    """Bytes of one layer's KV block on one GPU (its shard of the KV heads, or MLA's
    latent)."""
    return kv_layer_block_bytes(
        kv_cache_dtype, block_size, *model.kv_cache_shape(tp), model.dtype_bytes
    )


def kv_block_bytes(model: ModelSpec, tp: int, block_size: int, kv_cache_dtype: str = "auto") -> int:
    """Bytes of one block of the pool on one GPU: every full-attention layer's (every
    layer's, for a model without sliding-window layers)."""
    return model.num_full_layers * layer_block_bytes(model, tp, block_size, kv_cache_dtype)


def kv_bytes(
    model: ModelSpec, num_tokens: int, block_size: int, kv_cache_dtype: str = "auto"
) -> float:
    """The KV cache of ``num_tokens`` tokens, all TP ranks together (MLA's latent once): a
    full block's bytes per token (``ModelSpec.kv_bytes_per_token`` at the model's dtype)
    in the full-attention layers, and in the sliding-window ones for the last
    ``sliding_window`` tokens only."""
    full = kv_block_bytes(model, 1, block_size, kv_cache_dtype) * num_tokens / block_size
    if not model.num_sliding_layers:
        return full
    window = min(num_tokens, model.sliding_window or 0)
    layer = layer_block_bytes(model, 1, block_size, kv_cache_dtype)
    return full + model.num_sliding_layers * layer * window / block_size


def determine_capacity(
    profile: GpuProfile,
    model: ModelSpec,
    tp: int,
    config: EngineConfig,
    draft: ModelSpec | None = None,
) -> KVCacheCapacity:
    """Blocks on the GPU and in ``swap_space_gb`` of host memory. A model that leaves no room
    is an error unless ``config.num_gpu_blocks`` overrides the pool size. A ``draft`` model's
    weights take GPU memory too, and its KV is in every block (its own tensors on the
    target's block ids, as the engine's ``model.draft`` keeps it)."""
    usable = config.gpu_memory_utilization * profile.gpu.memory_bytes
    weights = model.weight_bytes_per_gpu(tp)
    reserved = profile.system.reserved_gib * GIB
    workspace = activation_workspace_bytes(
        model, tp, config.max_num_batched_tokens, config.max_num_seqs
    )
    block = kv_block_bytes(model, tp, config.block_size, config.kv_cache_dtype)
    if draft is not None:
        weights += draft.weight_bytes_per_gpu(tp)
        block += kv_block_bytes(draft, tp, config.block_size, config.kv_cache_dtype)
    free = usable - weights - reserved - workspace
    num_gpu_blocks = int(free // block)
    if num_gpu_blocks < 1 and config.num_gpu_blocks is None:
        raise ValueError(
            f"{model.name} does not fit on {tp} × {profile.gpu.name}: "
            f"{usable / GIB:.1f} GiB usable (gpu_memory_utilization="
            f"{config.gpu_memory_utilization}) < {weights / GIB:.1f} GiB weights + "
            f"{(reserved + workspace) / GIB:.1f} GiB runtime and activations; "
            "raise tensor parallelism or gpu_memory_utilization, or lower max_num_batched_tokens"
        )
    num_cpu_blocks = int(config.swap_space_gb * GIB // block)
    return KVCacheCapacity(num_gpu_blocks=max(num_gpu_blocks, 0), num_cpu_blocks=num_cpu_blocks)
