"""Reference kernel times measured here, in Vidur's ``*_mlp.csv`` format, and the shipped
profiles' error against them: a check of a GPU profile on the card itself.

    python3 benchmarks/kernel_reference.py --out DIR --check h200 h100      # on a GPU
    .venv/bin/python benchmarks/kernel_reference.py --device cpu --tokens 1 8 --tp 1 --check h200

Times the four linear ops of a Llama layer (``F.linear`` in bfloat16 on random data, cuBLAS
as in vLLM) for the shapes of Llama-2-7B and Llama-3-8B, every tensor-parallel shard width
(the shard's GEMM alone: no communication), over token counts 1 – 4,096; on a GPU as CUDA
graph replays (``time_ms``), so that no launch gap is counted. The elementwise columns are
left at zero (slotune's own torch ops are not vLLM's fused kernels), so the error tables
cover the linear ops and their sum. The CSVs are a check of the profiles, never fitted on
(see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

MODELS = {  # n_head, n_kv_head, n_embd, n_expanded_embd, vocab
    "llama-2-7b": (32, 32, 4096, 11008, 32000),
    "llama-3-8b": (32, 8, 4096, 14336, 128256),
}
TOKENS = [1, 2, 4, *range(8, 129, 8), *range(160, 4097, 32)]
STATS = ("min", "max", "mean", "median", "std")
GRAPH_LAUNCHES = 10


def gemm_shapes(model: tuple[int, ...], tp: int) -> dict[str, tuple[int, int]]:
    """``(k, n)`` of each linear column on one shard, by the rule the error tables read the
    reference files with (``readers.mlp_shapes``, ``readers.gemm_dims``)."""
    import pandas as pd

    from slotune.calibration.readers import LINEAR_OPS, gemm_dims, mlp_shapes

    heads, kv_heads, hidden, ffn, _ = model
    row = pd.DataFrame({"n_head": [heads], "n_kv_head": [kv_heads], "n_embd": [hidden],
                        "n_expanded_embd": [ffn], "num_tokens": [1],
                        "num_tensor_parallel_workers": [tp]})  # fmt: skip
    shapes = mlp_shapes(row)
    out = {}
    for column, op in LINEAR_OPS.items():
        k, n = gemm_dims(shapes, op)
        out[column] = (int(k[0]), int(n[0]))
    return out


def time_ms(device: torch.device, m: int, k: int, n: int, repeats: int) -> list[float]:
    """Milliseconds of one ``F.linear``, ``repeats`` times. On a GPU each time is one replay
    of a CUDA graph of ``GRAPH_LAUNCHES`` launches, divided by them: events around single
    launches measured the host's launch rate instead (a 30 – 40 µs floor on an H200 host,
    above every GEMM of fewer than ~1,000 tokens)."""
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    if device.type != "cuda":
        F.linear(x, w)
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            F.linear(x, w)
            out.append((time.perf_counter() - t) * 1e3)
        return out
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graph asks
        for _ in range(3):
            F.linear(x, w)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_LAUNCHES):
            F.linear(x, w)
    graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]  # fmt: skip
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) / GRAPH_LAUNCHES for start, end in events]


def measure(device: torch.device, name: str, tps: list[int], tokens: list[int], repeats: int):  # type: ignore[no-untyped-def]
    from slotune.calibration.readers import ELEMENTWISE_COLUMNS, LINEAR_OPS

    model = MODELS[name]
    heads, kv_heads, hidden, ffn, vocab = model
    rows = []
    for tp in tps:
        shapes = gemm_shapes(model, tp)
        for m in tokens:
            row: dict[str, float | int | bool] = {}
            for column in (*ELEMENTWISE_COLUMNS, *LINEAR_OPS):
                times = time_ms(device, m, *shapes[column], repeats) if column in shapes else [0.0]
                values = (min(times), max(times), statistics.fmean(times),
                          statistics.median(times), statistics.pstdev(times))  # fmt: skip
                row |= {f"time_stats.{column}.{s}": v for s, v in zip(STATS, values, strict=True)}
            row |= {"n_head": heads, "n_kv_head": kv_heads, "n_embd": hidden,
                    "n_expanded_embd": ffn, "vocab_size": vocab, "use_gated_mlp": True,
                    "num_tokens": m, "num_tensor_parallel_workers": tp}  # fmt: skip
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("kernel-reference"))
    parser.add_argument("--tokens", type=int, nargs="*", default=TOKENS)
    parser.add_argument("--tp", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--check", nargs="*", default=[], help="profiles to check against them")
    args = parser.parse_args()
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    tag = gpu.split()[-1].lower()
    args.out.mkdir(parents=True, exist_ok=True)
    files = []
    for name in MODELS:
        rows = measure(device, name, args.tp, args.tokens, args.repeats)
        path = args.out / f"{tag}_{name}_mlp.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        files.append(path)
        print(f"{path}: {len(rows)} rows ({gpu})")

    from slotune.calibration.errors import mlp_errors
    from slotune.calibration.tables import errors_markdown
    from slotune.engine.sim.profile import load_profile

    for profile_name in args.check:
        profile = load_profile(profile_name)
        print(f"\nprofile {profile_name} against {gpu}\n")
        print(errors_markdown([row for p in files for row in mlp_errors(profile, p)]))
        print(signed_errors(profile, files))


def signed_errors(profile, files: list[Path]) -> str:  # type: ignore[no-untyped-def]
    """Median of predicted / measured − 1 per op and token range: too fast or too slow."""
    from slotune.calibration.errors import TOKEN_RANGES
    from slotune.calibration.readers import (
        LINEAR_OPS,
        gemm_dims,
        median_seconds,
        mlp_shapes,
        read_reference,
    )
    from slotune.engine.sim.cost_model import gemm_seconds

    bw, peak = profile.gpu.hbm_bytes_per_s, profile.gpu.flops_per_s
    ranges = [r for r in TOKEN_RANGES if r[0] <= max(TOKENS)]
    head = " | ".join(f"{lo}–{hi} tokens" for lo, hi in ranges)
    lines = [
        f"| file | op (signed median error, %) | {head} |",
        "|---|---|" + "---:|" * len(ranges),
    ]
    for path in files:
        df = read_reference(path)
        shapes = mlp_shapes(df)
        for column, op in LINEAR_OPS.items():
            meas = median_seconds(df, column)
            k_all, n_all = gemm_dims(shapes, op)
            cells = []
            for lo, hi in ranges:
                errs = [gemm_seconds(profile.linear, bw, peak, int(m), int(k), int(n)) / t - 1
                        for m, k, n, t in zip(shapes["m"], k_all, n_all, meas, strict=True)
                        if lo <= m <= hi and t > 0]  # fmt: skip
                cells.append(f"{100 * statistics.median(errs):+.1f}" if errs else "")
            lines.append(f"| {path.name} | {column} | {' | '.join(cells)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
