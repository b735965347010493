"""The reference kernel times: per-layer CUDA kernel times in Vidur's profiling format
(see ``shared/reference/gpu-profiles/README.md``), read into the shapes the cost model
prices. Which files feed which shipped profile is stated here, once."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

# The shared data folder beside the checkout.
DEFAULT_REFERENCE = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / ("gpu-profiles")
)

# Which reference files feed which shipped profile.
FIT_SOURCES: dict[str, dict[str, list[str]]] = {
    "h100": {"mlp": ["h100_llama-2-7b_mlp.csv"], "attention": []},
    "a100-80g": {
        "mlp": ["a100_llama-2-7b_mlp.csv", "a100_llama-3-8b_mlp.csv"],
        "attention": ["a100_llama-2-70b-tp2_attention.csv"],
    },
}
# Profiles without measurements: the base profile's efficiencies on the new datasheet.
DERIVED_FROM = {
    "h100-pcie": "h100",
    "h200": "h100",
    "b200": "h100",
    "a100-40g": "a100-80g",
    "l40s": "a100-80g",
    "a10g": "a100-80g",
    "l4": "a100-80g",
    "mi300x": "a100-80g",
    "rtx4090": "a100-80g",
}

# Reference column -> the cost model's op.
LINEAR_OPS = {
    "attn_pre_proj": "qkv_proj",
    "attn_post_proj": "o_proj",
    "mlp_up_proj": "mlp_up",
    "mlp_down_proj": "mlp_down",
}
ELEMENTWISE_COLUMNS = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "attn_rope": "rope",
    "mlp_act": "act",
    "add": "add",
    "emb": "embed",
}


def read_reference(path: Path) -> pd.DataFrame:
    import pandas as pd

    return pd.read_csv(path)


def median_seconds(df: pd.DataFrame, column: str) -> np.ndarray:
    """The median time of the kernel ``column`` in each row, in seconds."""
    return df[f"time_stats.{column}.median"].to_numpy(dtype=float) * 1e-3


def mlp_shapes(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per row of an ``*_mlp.csv``: tokens and the per-shard dimensions of the layer."""
    import numpy as np

    tp = df["num_tensor_parallel_workers"].to_numpy()
    heads = df["n_head"].to_numpy()
    hidden = df["n_embd"].to_numpy()
    hd = hidden // heads
    q = heads // tp
    kv = np.maximum(1, df["n_kv_head"].to_numpy() // tp)
    return {
        "m": df["num_tokens"].to_numpy(),
        "hidden": hidden,
        "qkv_out": (q + 2 * kv) * hd,
        "attn_dim": q * hd,
        "qk_dim": (q + kv) * hd,
        "ffn": df["n_expanded_embd"].to_numpy() // tp,
    }


def gemm_dims(shapes: dict[str, np.ndarray], op: str) -> tuple[np.ndarray, np.ndarray]:
    """``(k, n)`` of the linear op ``op`` (its ``m`` is the token count)."""
    h = shapes["hidden"]
    if op == "qkv_proj":
        return h, shapes["qkv_out"]
    if op == "o_proj":
        return shapes["attn_dim"], h
    if op == "mlp_up":
        return h, 2 * shapes["ffn"]
    return shapes["ffn"], h


def attention_frame(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per row of an ``*_attention.csv``: the per-shard heads, KV bytes and batch shape."""
    import numpy as np

    tp = df["num_tensor_parallel_workers"].to_numpy()
    q = df["n_q_head"].to_numpy() // tp
    kv = np.maximum(1, df["n_kv_head"].to_numpy() // tp)
    hd = df["n_embd"].to_numpy() // df["n_q_head"].to_numpy()
    return {
        "q_heads": q,
        "head_dim": hd,
        "kv_bytes": 2 * kv * hd * 2,
        "batch": df["batch_size"].to_numpy(),
        "chunk": df["prefill_chunk_size"].to_numpy(),
        "prior": df["kv_cache_size"].to_numpy(),
        "block_size": df["block_size"].to_numpy(),
        "prefill": df["is_prefill"].to_numpy(dtype=bool),
    }
