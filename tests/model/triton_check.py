"""Run with TRITON_INTERPRET=1 (set by test_triton_kernel.py): the interpreted Triton kernel
against the torch backend on random mixed batches. Exits non-zero on the first mismatch."""

from __future__ import annotations

import os
import random
import sys

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("triton_check.py needs TRITON_INTERPRET=1 in its environment")

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))

import torch

from slotune.engine.hf_config import ModelConfig
from slotune.engine.model.attention import AttentionMetadata, select_backend
from slotune.engine.model.attention.torch_backend import TorchAttention
from slotune.engine.model.attention.triton_backend import TritonAttention
from slotune.engine.model.llama import LlamaForCausalLM
from tests.model.paged import PagedRunner

ATOL = 1e-5


def random_batch(rng: random.Random, block_size: int, num_blocks: int, decode_only: bool):
    seqs = rng.randint(1, 5)
    q_lens, ctx_lens = [], []
    for _ in range(seqs):
        q = 1 if decode_only or rng.random() < 0.4 else rng.randint(2, 70)
        cached = rng.choice([0, rng.randint(0, 90), block_size, 2 * block_size - 1])
        q_lens.append(q)
        ctx_lens.append(cached + q)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-c // block_size))] for c in ctx_lens]
    width = max(map(len, tables))
    return AttentionMetadata(
        cu_seqlens_q=torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32),
        cu_seqlens_k=torch.tensor([0, *ctx_lens]).cumsum(0).to(torch.int32),
        seq_lens_k=torch.tensor(ctx_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.zeros(sum(q_lens), dtype=torch.int64),
        max_seqlen_q=max(q_lens),
        max_seqlen_k=max(ctx_lens),
        query_lens=tuple(q_lens),
        context_lens=tuple(ctx_lens),
    )


def check_kernel(trials: int) -> None:
    rng = random.Random(0)
    shapes = [(4, 2, 16), (8, 8, 32), (6, 2, 24), (8, 1, 64)]  # q heads, kv heads, head dim
    for trial in range(trials):
        block_size = [16, 32, 128][trial % 3]  # 64-key tiles: 4 or 2 blocks, half a block
        q_heads, kv_heads, head_dim = shapes[trial % len(shapes)]
        meta = random_batch(rng, block_size, num_blocks=48, decode_only=trial % 5 == 4)
        gen = torch.Generator().manual_seed(trial)
        k = torch.randn(48, block_size, kv_heads, head_dim, generator=gen)
        v = torch.randn(48, block_size, kv_heads, head_dim, generator=gen)
        q = torch.randn(sum(meta.query_lens), q_heads, head_dim, generator=gen)
        want = TorchAttention().forward(q, k, v, meta, head_dim**-0.5)
        got = TritonAttention().forward(q, k, v, meta, head_dim**-0.5)
        err = (want - got).abs().max().item()
        print(
            f"trial {trial}: bs={block_size} heads={q_heads}/{kv_heads} d={head_dim} "
            f"q={meta.query_lens} ctx={meta.context_lens} max|err|={err:.2e}"
        )
        if not err < ATOL:
            sys.exit(f"trial {trial}: triton differs from torch by {err}")


def check_model() -> None:
    """The whole tiny model, prefill chunks then mixed decodes, with either backend."""
    config = ModelConfig(
        model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.1)
    ids = torch.randint(0, 128, (2, 50)).tolist()
    schedule = [[("a", ids[0][:20])], [("a", ids[0][20:45]), ("b", ids[1][:33])]]
    schedule += [[("a", [ids[0][i]]), ("b", [ids[1][i - 12]])] for i in range(45, 50)]
    backends = [TorchAttention(), TritonAttention()]
    runners = [PagedRunner(model, 16, backend=b, seed=i) for i, b in enumerate(backends)]
    for step in schedule:
        want, got = (torch.cat(r.step(step)) for r in runners)
        err = (want - got).abs().max().item()
        print(f"model step {[(rid, len(t)) for rid, t in step]}: max|err|={err:.2e}")
        if not err < ATOL:
            sys.exit(f"model logits with triton differ from torch by {err}")


def check_selection() -> None:
    backend = select_backend("triton", torch.device("cpu"), 16, torch.float32)
    if backend.name != "triton":
        sys.exit(f"select_backend('triton') under the interpreter chose {backend.name}")


if __name__ == "__main__":
    check_selection()
    check_kernel(int(sys.argv[1]) if len(sys.argv) > 1 else 12)
    check_model()
    print("ok")
