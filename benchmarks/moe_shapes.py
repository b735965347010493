"""MoE models in the simulator: what it reads from each hand-written HF config.json
(``tests/sim/hf_configs``) against the published sizes, and the expert-parallel load
imbalance that random top-k routing gives at each batch against a Monte Carlo.

    PYTHONPATH=. .venv/bin/python benchmarks/moe_shapes.py      # about 20 s

1. Shapes: total and active parameters, KV bytes per token and checkpoint bytes of each
   file's model, beside the model card's figures (``PUBLISHED``). DeepSeek and OpenAI
   count active parameters without the vocabulary matrix (marked ``*``); Llama 4's totals
   include a vision encoder of about 1 B that the simulator does not price.
2. Imbalance: ``moe.busiest_rank_load`` (busiest rank's rows over the mean) for a few
   (experts, top-k, ranks) at 1 to 4,096 tokens, and the mean of 2,000 routings of uniformly
   random distinct top-k experts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from slotune.engine.sim import get_model
from slotune.engine.sim.moe import busiest_rank_load

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "sim" / "hf_configs"
# (total B, active B, active counted without the vocabulary matrix)
PUBLISHED = {
    "mixtral-8x7b": (46.7, 12.9, False),
    "qwen3-30b-a3b": (30.5, 3.3, False),
    "deepseek-v2-lite": (15.7, 2.4, True),
    "deepseek-v3": (671.0, 37.0, False),
    "gpt-oss-20b": (20.9, 3.6, True),
    "gpt-oss-120b": (116.8, 5.1, True),
    "llama-4-scout": (109.0, 17.0, False),
    "llama-4-maverick": (400.0, 17.0, False),
    "llama-4-scout-fp8": (109.0, 17.0, False),
}
ROUTINGS = (("mixtral-8x7b", 8, 2, 2), ("qwen3-30b-a3b", 128, 8, 8), ("deepseek-v3", 256, 8, 32))
TOKENS = (1, 4, 16, 64, 256, 1024, 4096)


def shape_rows() -> None:
    print(
        "| config.json | total B (published) | active B (published) | KV KiB/token | weights GB |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, (total, active, no_embed) in PUBLISHED.items():
        m = get_model(str(CONFIGS / name / "config.json"))
        embed = m.vocab_size * m.hidden_size if no_embed else 0
        star = "*" if no_embed else ""
        weights = m.weight_dtype + (f"/{m.expert_weight_dtype}" if m.expert_weight_dtype else "")
        print(
            f"| {name} | {m.num_params / 1e9:.2f} ({total:g}) "
            f"| {(m.active_params - embed) / 1e9:.2f}{star} ({active:g}) "
            f"| {m.kv_bytes_per_token / 1024:g} | {m.weight_bytes / 1e9:.1f} {weights} |"
        )


def monte_carlo(tokens: int, experts: int, k: int, ep: int, runs: int = 2000) -> float:
    """Each token's rows per rank: ``k`` distinct experts of ``E``, ``E/ep`` per rank."""
    rng = np.random.default_rng(0)
    per_token = rng.multivariate_hypergeometric(
        [experts // ep] * ep, k, size=(runs, tokens), method="count"
    )
    busiest = per_token.sum(axis=1).max(axis=1)
    return float(busiest.mean()) / (tokens * k / ep)


def imbalance_rows() -> None:
    print("| routing (E, k, ep) | " + " | ".join(f"{t} tok" for t in TOKENS) + " |")
    print("|---|" + "---:|" * len(TOKENS))
    for name, experts, k, ep in ROUTINGS:
        cells = [
            f"{busiest_rank_load(t, experts, k, ep):.3f} / {monte_carlo(t, experts, k, ep):.3f}"
            for t in TOKENS
        ]
        print(f"| {name} ({experts}, {k}, {ep}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    shape_rows()
    print()
    imbalance_rows()
