"""The GPU checks of the real executor, as one script for a machine with a CUDA card.

    .venv/bin/python benchmarks/gpu_check.py --out gpu_check.json
    TRITON_INTERPRET=1 .venv/bin/python benchmarks/gpu_check.py --device cpu --smoke  # dry run

1. The Triton paged-attention kernel against the torch backend in bfloat16 on random
   mixed prefill/decode batches (block sizes 16, 32 and 256), and flash-attn too when it is
   installed (block size 256).
2. The Triton decode kernel timed on a Llama-3-8B-shaped KV read (32 query heads, 8 KV
   heads, head dim 128, 64 sequences × 4,096 tokens, block sizes 16 and 256) against the
   HBM floor:
   KV bytes / datasheet bandwidth, and / the copy bandwidth measured here.
3. ``benchmarks/gpu_run.sh`` runs this script and ``sim_fidelity.py --device cuda`` together.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from slotune.engine.model.attention import AttentionMetadata, select_backend
from slotune.engine.model.attention.torch_backend import TorchAttention

DATASHEET_GBPS = {"H100": 3350, "H200": 4800, "A100": 2039, "L40S": 864, "L4": 300, "B200": 7700}


def batch(
    q_lens: list[int], ctx_lens: list[int], block_size: int, num_blocks: int, device: torch.device
) -> AttentionMetadata:
    free = list(range(num_blocks))
    random.Random(0).shuffle(free)
    tables = [[free.pop() for _ in range(-(-c // block_size))] for c in ctx_lens]
    width = max(map(len, tables))

    def t(x: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor(x, dtype=dtype, device=device)

    cu_q, cu_k = [0], [0]
    for q, c in zip(q_lens, ctx_lens, strict=True):
        cu_q.append(cu_q[-1] + q)
        cu_k.append(cu_k[-1] + c)
    return AttentionMetadata(
        cu_seqlens_q=t(cu_q),
        cu_seqlens_k=t(cu_k),
        seq_lens_k=t(ctx_lens),
        block_tables=t([x + [0] * (width - len(x)) for x in tables]),
        slot_mapping=t([0] * sum(q_lens), torch.int64),
        max_seqlen_q=max(q_lens),
        max_seqlen_k=max(ctx_lens),
        query_lens=tuple(q_lens),
        context_lens=tuple(ctx_lens),
    )


def check_against_torch(device: torch.device, dtype: torch.dtype, smoke: bool) -> list[dict]:
    rng = random.Random(1)
    heads, kv_heads, dim = (4, 2, 16) if smoke else (32, 8, 128)
    rows = []
    for block_size in (16, 32, 256):
        names = ["triton"] + (["flash"] if block_size % 256 == 0 else [])
        for trial in range(2 if smoke else 6):
            seqs = rng.randint(1, 4 if smoke else 16)
            q_lens = [1 if rng.random() < 0.5 else rng.randint(2, 64 if smoke else 700)
                      for _ in range(seqs)]  # fmt: skip
            ctx = [q + rng.randint(0, 100 if smoke else 3000) for q in q_lens]
            blocks = sum(-(-c // block_size) for c in ctx) + 4
            meta = batch(q_lens, ctx, block_size, blocks, device)
            gen = torch.Generator(device=device).manual_seed(trial)
            shape = (blocks, block_size, kv_heads, dim)
            k = torch.randn(shape, generator=gen, device=device).to(dtype)
            v = torch.randn(shape, generator=gen, device=device).to(dtype)
            q = torch.randn(sum(q_lens), heads, dim, generator=gen, device=device).to(dtype)
            want = TorchAttention().forward(q.float(), k.float(), v.float(), meta, dim**-0.5)
            for name in names:
                backend = select_backend(name, device, block_size, dtype)
                if backend.name != name:
                    continue
                got = backend.forward(q, k, v, meta, dim**-0.5).float()
                err = (got - want).abs().max().item()
                rows.append({"backend": name, "block_size": block_size, "trial": trial,
                             "max_abs_err": err, "q_lens": q_lens[:4], "ctx": ctx[:4]})  # fmt: skip
                print(f"{name:6s} bs={block_size:3d} trial {trial}: max|err| {err:.3e}")
    return rows


def copy_gbps(device: torch.device) -> float:
    x = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (start.elapsed_time(end) / 1e3) / 1e9


def decode_bandwidth(device: torch.device, dtype: torch.dtype, block_size: int) -> dict:
    seqs, ctx, heads, kv_heads, dim = 64, 4096, 32, 8, 128
    blocks = seqs * ctx // block_size
    meta = batch([1] * seqs, [ctx] * seqs, block_size, blocks, device)
    k = torch.randn(blocks, block_size, kv_heads, dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(seqs, heads, dim, device=device, dtype=dtype)
    backend = select_backend("triton", device, block_size, dtype)
    for _ in range(3):
        backend.forward(q, k, v, meta, dim**-0.5)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    start.record()
    for _ in range(iters):
        backend.forward(q, k, v, meta, dim**-0.5)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / iters
    kv_bytes = 2 * seqs * ctx * kv_heads * dim * k.element_size()
    name = torch.cuda.get_device_name(device)
    sheet = next((g for key, g in DATASHEET_GBPS.items() if key in name), None)
    measured = copy_gbps(device)
    achieved = kv_bytes / seconds / 1e9
    out = {
        "gpu": name,
        "block_size": block_size,
        "kv_bytes": kv_bytes,
        "kernel_ms": seconds * 1e3,
        "achieved_gbps": achieved,
        "copy_gbps": measured,
        "fraction_of_copy": achieved / measured,
        "datasheet_gbps": sheet,
        "fraction_of_datasheet": achieved / sheet if sheet else None,
    }
    print(json.dumps(out, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, float32, no timing")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    result: dict = {"accuracy": check_against_torch(device, dtype, args.smoke)}
    if device.type == "cuda":
        result["decode_bandwidth"] = [decode_bandwidth(device, dtype, bs) for bs in (16, 256)]
    worst = max(r["max_abs_err"] for r in result["accuracy"])
    print(f"worst max|err| against torch: {worst:.3e}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
