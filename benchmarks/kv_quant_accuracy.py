"""Logit error of the quantized KV cache (fp8, int8, int4) against the full-precision cache.

    .venv/bin/python benchmarks/kv_quant_accuracy.py [--tokens 120] [--decode 20] [--seeds 3]

Builds the tiny checkpoints the model tests use (our `init-model tiny` Llama, and Qwen2,
Mixtral and Qwen2-MoE made by transformers with random weights), then for each runs a
prompt of ``--tokens`` tokens through our paged model on the CPU (float32, torch attention,
block size 16): a prefill in two chunks, then ``--decode`` one-token decode steps, once with
a float32 cache and once per quantized cache. Errors are over every position's logits:
mean and max |Δlogit|, the mean relative to the full-precision logits' standard deviation,
and how often the arg-max token agrees. Averaged over ``--seeds`` prompts. Also prints the
bytes per token of each cache for a Llama-3-8B layout (bf16, 8 KV heads of 128, 32 layers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slotune.engine.kv_dtype import KV_CACHE_DTYPES, kv_block_bytes
from slotune.engine.model.init_model import init_model
from slotune.engine.model.loader import load_model
from tests.model.conftest import save_hf
from tests.model.paged import kv_logit_error
from tests.model.test_llama_vs_hf import prompt

QUANTIZED = ("int8", "fp8", "int4")


def checkpoints(root: Path) -> dict[str, Path]:
    return {
        "llama (init-model tiny)": init_model(root / "tiny", "tiny", seed=0),
        "qwen2": save_hf(root / "qwen2", "qwen2", seed=2),
        "mixtral (4 experts, top-2)": save_hf(root / "mixtral", "mixtral", seed=4),
        "qwen2-moe (6 experts, top-2, shared)": save_hf(root / "qwen2_moe", "qwen2_moe", seed=5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--decode", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    prefill = args.tokens - args.decode
    chunks = (prefill * 3 // 8, prefill)
    print("| model | kv_cache_dtype | mean abs | max abs | mean / logit std | top-1 agree |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, folder in checkpoints(Path(tmp)).items():
            model = load_model(folder, device="cpu").model
            for kv in QUANTIZED:
                runs = [
                    kv_logit_error(model, prompt(args.tokens, seed), kv, chunks=chunks)
                    for seed in range(args.seeds)
                ]
                mean = statistics.mean
                print(
                    f"| {name} | {kv} | {mean(e.mean_abs for e in runs):.4f} "
                    f"| {max(e.max_abs for e in runs):.3f} "
                    f"| {mean(e.mean_rel for e in runs):.2%} "
                    f"| {mean(e.top1_agreement for e in runs):.1%} |"
                )
    print()
    print("| kv_cache_dtype | bytes / token (Llama-3-8B, block 16) | vs auto |")
    print("|---|---:|---:|")
    auto = kv_block_bytes("auto", 16, 8, 128, 2)
    for kv in KV_CACHE_DTYPES:
        per_block = kv_block_bytes(kv, 16, 8, 128, 2)
        print(f"| {kv} | {32 * per_block / 16:,.0f} | {per_block / auto:.3f} |")


if __name__ == "__main__":
    main()
