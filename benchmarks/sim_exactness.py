"""Random configurations replayed by this tree and a base revision: the results must match.

    .venv/bin/python benchmarks/sim_exactness.py --base main --configs 12
    .venv/bin/python benchmarks/sim_exactness.py --base HEAD~1 --configs 8 --check
    .venv/bin/python benchmarks/sim_exactness.py --base main --request-timeout 60
    .venv/bin/python benchmarks/sim_exactness.py --base main --decode-budget-ms 100 --check

A change that only makes the simulator faster (issue 28) must leave every replay where it
was. This draws ``--configs`` engine configurations at random (token budget, block size,
sequences, prefix cache, preemption mode, policy, memory share: small shares overload the
KV pool, so that requests are preempted; some with adaptive chunking or a decode budget),
replays the same slice of an Azure-like trace (``sim_speed.write_azure_csv``) with
``slotune bench --json`` in both trees, and compares the JSON whole, but for its date and
the count of steps run in stretches (which a planner change is meant to move). With
``--request-timeout`` every replay's client gives up on a request that long after sending
it (as ``tune --request-timeout`` and ``bench --timeout`` do); with
``--decode-budget-ms`` every chunked configuration runs under that decode budget (in place
of adaptive chunking; small memory shares make it preempt). With ``--check`` this
tree's replays also run with ``SLOTUNE_CHECK_STRETCHES=1``, which replays
every stretch step by step on a shadow scheduler and fails on any difference. A
configuration that both trees refuse (the same message) counts as matching.

Prints a line per configuration (its flags, the stretch steps of both trees, CPU seconds of
both) and exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import GPU, MODEL, ROOT, base_tree, write_azure_csv

IGNORED = ("date",)  # top-level keys that differ from run to run
IGNORED_STATS = ("stretch_steps",)  # what a planner change is allowed to move


def draw_config(rng: random.Random) -> list[str]:
    """One random configuration as ``slotune bench`` flags."""
    flags = {
        "--max-num-batched-tokens": rng.choice([256, 512, 768, 1024, 2048, 4096]),
        "--block-size": rng.choice([16, 32, 64, 128]),
        "--max-num-seqs": rng.choice([16, 64, 128, 199, 256]),
        "--prefix-caching": rng.choice(["none", "hash", "radix"]),
        "--preemption-mode": rng.choice(["recompute", "recompute", "swap", "hybrid"]),
        "--policy": rng.choice(["chunked", "chunked", "chunked", "prefill_first"]),
        "--gpu-memory-utilization": rng.choice([0.3, 0.35, 0.5, 0.9]),
    }
    if flags["--policy"] == "prefill_first":  # a whole prompt a step: the longest must fit
        flags["--max-num-batched-tokens"] = 16384
    extra = rng.random() if flags["--policy"] == "chunked" else 1.0  # prefill_first: neither
    if extra < 0.2:
        flags["--adaptive-chunk-ms"] = rng.choice([50, 100])
    elif extra < 0.35:
        flags["--decode-budget-ms"] = rng.choice([100, 500])
    # a long-prefill threshold keeps prompts prefilling for many steps in front of
    # requests that already decode (the tuner searches it)
    if flags["--policy"] == "chunked" and rng.random() < 0.5:
        flags["--long-prefill-token-threshold"] = rng.choice([32, 71, 256])
    return [str(x) for pair in flags.items() for x in pair]


def with_decode_budget(flags: list[str], ms: float) -> list[str]:
    """``flags`` with a decode budget of ``ms`` in place of adaptive chunking (prefill-first
    takes neither)."""
    pairs = dict(zip(flags[::2], flags[1::2], strict=True))
    if pairs["--policy"] == "prefill_first":
        return flags
    pairs.pop("--adaptive-chunk-ms", None)
    pairs["--decode-budget-ms"] = f"{ms:g}"
    return [x for pair in pairs.items() for x in pair]


def bench(tree: Path, csv: Path, requests: int, flags: list[str], check: bool) -> dict:
    """``slotune bench --json`` in ``tree``: its JSON (or the refusal), and its CPU seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100"}
    if check:
        env["SLOTUNE_CHECK_STRETCHES"] = "1"
    cmd = [sys.executable, "-m", "slotune", "bench", "--gpu", GPU, "--model", MODEL]
    cmd += ["--trace", str(csv), "--format", "azure", "--num-requests", str(requests)]
    cmd += ["--timestamps", "--slo", "ttft=2s,tpot=100ms", "--json", *flags]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if out.returncode:
        return {"refused": (out.stderr.strip().splitlines() or ["?"])[-1], "cpu_s": cpu}
    data = json.loads(out.stdout)
    return {"result": data, "cpu_s": cpu}


def comparable(run: dict) -> object:
    if "refused" in run:
        return run["refused"]
    data = {k: v for k, v in run["result"].items() if k not in IGNORED}
    stats = data.get("engine_stats", {})
    data["engine_stats"] = {k: v for k, v in stats.items() if k not in IGNORED_STATS}
    return data


def stretch_steps(run: dict) -> str:
    if "refused" in run:
        return f"refused ({run['refused']})"
    stats = run["result"]["engine_stats"]
    return f"{stats.get('stretch_steps', 0)}/{stats['steps']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare with")
    parser.add_argument("--configs", type=int, default=12)
    parser.add_argument("--requests", type=int, default=1500, help="of the trace's start")
    parser.add_argument("--seed", type=int, default=0, help="of the configuration draws")
    parser.add_argument("--csv", type=Path, help="the Azure-format file (default: generated)")
    parser.add_argument(
        "--check", action="store_true", help="also replay this tree in the checking mode"
    )
    parser.add_argument("--request-timeout", type=float, help="seconds, for every replay")
    parser.add_argument(
        "--decode-budget-ms", type=float, help="on every chunked configuration (no adaptive)"
    )
    args = parser.parse_args()
    csv = args.csv or write_azure_csv(
        Path(tempfile.gettempdir()) / f"slotune-azure-like-{args.requests}.csv", args.requests
    )
    base = base_tree(args.base)
    rng = random.Random(args.seed)
    differ = 0
    for n in range(args.configs):
        flags = draw_config(rng)
        if args.decode_budget_ms:
            flags = with_decode_budget(flags, args.decode_budget_ms)
        if args.request_timeout:
            flags += ["--request-timeout", f"{args.request_timeout:g}"]
        this = bench(ROOT, csv, args.requests, flags, check=False)
        other = bench(base, csv, args.requests, flags, check=False)
        same = comparable(this) == comparable(other)
        line = (
            f"{n}: {' '.join(flags)}: stretch steps {stretch_steps(this)} (base "
            f"{stretch_steps(other)}), cpu {this['cpu_s']:.1f} s (base {other['cpu_s']:.1f} s)"
        )
        if args.check:
            checked = bench(ROOT, csv, args.requests, flags, check=True)
            same = same and comparable(checked) == comparable(this)
            line += ", checking mode"
        differ += not same
        print(f"{line}: {'same' if same else 'DIFFERENT'}", flush=True)
    print(f"{args.configs - differ} of {args.configs} configurations match the base")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
