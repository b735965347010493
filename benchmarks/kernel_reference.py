"""Reference kernel times measured here, in Vidur's ``*_mlp.csv`` format, and the shipped
profiles' error against them: a check of a GPU profile on the card itself.

    python3 benchmarks/kernel_reference.py --out DIR --check h200 h100      # on a GPU
    .venv/bin/python benchmarks/kernel_reference.py --from DIR --check h200 --stack vllm-0.15
    .venv/bin/python benchmarks/kernel_reference.py --device cpu --tokens 1 8 --tp 1 --check h200

Times the four linear ops of a Llama layer (``F.linear`` in bfloat16 on random data, cuBLAS
as in vLLM) for the shapes of Llama-2-7B and Llama-3-8B, every tensor-parallel shard width
(the shard's GEMM alone: no communication), over token counts 1 – 4,096; on a GPU as CUDA
graph replays (``time_ms``), so that no launch gap is counted. The elementwise columns are
left at zero (slotune's own torch ops are not vLLM's fused kernels), so the error tables
cover the linear ops and their sum. ``--stack`` adds the signed errors of each op as that
engine stack runs it (``CostModel``: a step of up to its largest CUDA-graph size replayed
in a graph, every fixed overhead scaled). ``--from`` reads CSVs written before instead of
measuring. The CSVs are a check of the profiles, never fitted on (see docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
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
    parser.add_argument("--stack", help="also price each op as this engine stack runs it")
    parser.add_argument("--from", dest="source", type=Path, help="read these CSVs, not measure")
    args = parser.parse_args()
    if args.source:
        files = sorted(args.source.glob("*_mlp.csv"))
        gpu = files[0].name.split("_")[0] if files else "nothing"
        print(f"{len(files)} files from {args.source}")
    else:
        gpu, files = measure_files(torch.device(args.device), args)

    from slotune.calibration.errors import mlp_errors
    from slotune.calibration.tables import errors_markdown
    from slotune.engine.sim.profile import load_profile
    from slotune.engine.sim.stack import load_stack

    stack = load_stack(args.stack) if args.stack else None
    for profile_name in args.check:
        profile = load_profile(profile_name)
        print(f"\nprofile {profile_name} against {gpu}\n")
        print(errors_markdown([row for p in files for row in mlp_errors(profile, p)]))
        print(signed_errors(files, lambda name, pr=profile: eager_pricer(pr)))
        if stack is not None:
            print(f"\nprofile {profile_name} as stack {args.stack} runs it\n")
            print(signed_errors(files, lambda name, pr=profile: stack_pricer(pr, name, stack)))
            print(graph_scale_table(profile, files, stack))


def measure_files(device: torch.device, args: argparse.Namespace) -> tuple[str, list[Path]]:
    """Time every model's ops and write one ``*_mlp.csv`` each under ``args.out``."""
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
    return gpu, files


Pricer = Callable[[int, int, int], float]


def eager_pricer(profile) -> Pricer:  # type: ignore[no-untyped-def]
    """The profile's own GEMM time, as the error tables read it: one eager launch."""
    from functools import partial

    from slotune.engine.sim.cost_model import gemm_seconds

    return partial(gemm_seconds, profile.linear, profile.gpu.hbm_bytes_per_s,
                   profile.gpu.flops_per_s)  # fmt: skip


def model_of(path: Path) -> str:
    """The model a ``*_mlp.csv`` of this script holds (its name is in the file's)."""
    return next(name for name in MODELS if f"_{name}_" in path.name)


def stack_pricer(profile, model: str, stack) -> Pricer:  # type: ignore[no-untyped-def]
    """One linear op of ``model`` as ``CostModel`` prices it under ``stack``
    (``max_num_seqs`` 256, no token budget): in a CUDA graph up to its largest size."""
    from slotune.engine.sim import get_model
    from slotune.engine.sim.cost_model import CostModel

    cost = CostModel(profile, get_model(model), stack=stack)
    return lambda m, k, n: cost.kernels(m).linear_seconds(m, k, n)


@dataclass(frozen=True)
class LayerRow:
    """A layer's four linear ops at one model, TP and token count: their shapes and
    measured time together."""

    model: str
    tp: int
    m: int
    dims: tuple[tuple[int, int], ...]
    measured: float


def layer_rows(files: list[Path]) -> list[LayerRow]:
    """Every row of the CSVs as a ``LayerRow``."""
    from slotune.calibration.readers import (
        LINEAR_OPS,
        gemm_dims,
        median_seconds,
        mlp_shapes,
        read_reference,
    )

    rows = []
    for path in files:
        df = read_reference(path)
        shapes = mlp_shapes(df)
        dims = [gemm_dims(shapes, op) for op in LINEAR_OPS.values()]
        meas = [median_seconds(df, column) for column in LINEAR_OPS]
        for i, (m, tp) in enumerate(zip(shapes["m"], df["num_tensor_parallel_workers"],
                                        strict=True)):  # fmt: skip
            rows.append(LayerRow(model_of(path), int(tp), int(m),
                                 tuple((int(k[i]), int(n[i])) for k, n in dims),
                                 sum(float(t[i]) for t in meas)))  # fmt: skip
    return rows


def graph_errors(profile, rows: list[LayerRow], stack, scale: float) -> dict[int, list[float]]:  # type: ignore[no-untyped-def]
    """``{tp: [log(priced / measured)]}`` of the rows a CUDA graph replays, priced by
    ``CostModel`` under ``stack`` with ``graph_overhead_scale`` = ``scale``."""
    from dataclasses import replace

    from slotune.engine.sim import get_model
    from slotune.engine.sim.cost_model import CostModel

    scaled = replace(stack, graph_overhead_scale=scale)
    costs = {model: CostModel(profile, get_model(model), stack=scaled) for model in MODELS}
    out: dict[int, list[float]] = {}
    for row in rows:
        cost = costs[row.model]
        if cost.is_graph(row.m):
            kernels = cost.kernels(row.m)
            priced = sum(kernels.linear_seconds(row.m, k, n) for k, n in row.dims)
            out.setdefault(row.tp, []).append(math.log(priced / row.measured))
    return out


def rms(errors: dict[int, list[float]]) -> float:
    values = [e for v in errors.values() for e in v]
    return (sum(e * e for e in values) / len(values)) ** 0.5


def best_graph_scale(profile, rows: list[LayerRow], stack) -> float:  # type: ignore[no-untyped-def]
    """The ``graph_overhead_scale`` (on a 0.01 grid over its plausible range) whose prices
    fit the graph replays best: least squares on the log ratio."""
    from slotune.engine.sim.stack import PARAMETER_RANGES

    low, high, _ = PARAMETER_RANGES["graph_overhead_scale"]
    scales = [round(low + 0.01 * i, 2) for i in range(round((high - low) / 0.01) + 1)]
    return min(scales, key=lambda x: rms(graph_errors(profile, rows, stack, x)))


def graph_scale_table(profile, files: list[Path], stack) -> str:  # type: ignore[no-untyped-def]
    """A layer's linear ops as ``stack`` prices them against the graph replays, per TP, at
    the stack's own scale and at the best one: a check of the stack's constant."""
    rows = layer_rows(files)
    best = best_graph_scale(profile, rows, stack)
    errors = {scale: graph_errors(profile, rows, stack, scale)
              for scale in (stack.graph_overhead_scale, best)}  # fmt: skip
    tps = sorted(errors[best])
    lines = ["| graph_overhead_scale | " + " | ".join(f"TP{tp}" for tp in tps)
             + " | rms log error |", "|---|" + "---:|" * (len(tps) + 1)]  # fmt: skip
    for scale, errs in errors.items():
        cells = [f"{100 * (math.exp(statistics.median(errs[tp])) - 1):+.1f} %" for tp in tps]
        lines.append(f"| {scale:g}{' (best fit here)' if scale == best else ''} | "
                     f"{' | '.join(cells)} | {rms(errs):.3f} |")  # fmt: skip
    return "\n".join(["", "A layer's linear ops, 1 – 512 tokens, signed median error per TP:", "",
                      *lines])  # fmt: skip


def signed_errors(files: list[Path], pricer_for: Callable[[str], Pricer]) -> str:
    """Median of predicted / measured − 1 per op and token range (too fast or too slow),
    each file priced by ``pricer_for(its model)``."""
    from slotune.calibration.errors import TOKEN_RANGES
    from slotune.calibration.readers import (
        LINEAR_OPS,
        gemm_dims,
        median_seconds,
        mlp_shapes,
        read_reference,
    )

    ranges = [r for r in TOKEN_RANGES if r[0] <= max(TOKENS)]
    head = " | ".join(f"{lo}–{hi} tokens" for lo, hi in ranges)
    lines = [
        f"| file | op (signed median error, %) | {head} |",
        "|---|---|" + "---:|" * len(ranges),
    ]
    for path in files:
        df = read_reference(path)
        shapes = mlp_shapes(df)
        price = pricer_for(model_of(path))
        for column, op in LINEAR_OPS.items():
            meas = median_seconds(df, column)
            k_all, n_all = gemm_dims(shapes, op)
            cells = []
            for lo, hi in ranges:
                errs = [price(int(m), int(k), int(n)) / t - 1
                        for m, k, n, t in zip(shapes["m"], k_all, n_all, meas, strict=True)
                        if lo <= m <= hi and t > 0]  # fmt: skip
                cells.append(f"{100 * statistics.median(errs):+.1f}" if errs else "")
            lines.append(f"| {path.name} | {column} | {' | '.join(cells)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
