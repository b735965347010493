"""Simulator speed: seconds to replay traces on a simulated GPU, and to run the CLI on one.

    .venv/bin/python benchmarks/sim_speed.py                      # every case, once
    .venv/bin/python benchmarks/sim_speed.py --repeats 3 --base main   # against main, interleaved
    .venv/bin/python benchmarks/sim_speed.py --cases azure-at whole-azure --requests 2000
    .venv/bin/python benchmarks/sim_speed.py --stretches off      # replays without stretches
    .venv/bin/python benchmarks/sim_speed.py --instructions --requests 3000 --base main

Cases (llama-2-7b on a100-80g unless named, 512-token budget; each run in a fresh process):

- ``synthetic``: the conversation-like trace (log-normal lengths, means about 1,150 prompt
  and 220 output tokens, at most 4,096 in all), Poisson 4 req/s.
- ``azure-below`` / ``azure-at`` / ``azure-above``: an Azure-format CSV (``TIMESTAMP,
  ContextTokens, GeneratedTokens``) generated to match the published statistics of the Azure
  LLM inference conversation trace (context median about 1,020 and p90 about 4,000 tokens,
  up to 14,000; output median about 130; it is not the real file), read with the azure
  reader, replayed at Poisson 2, 3 and 5 req/s: below, at and above this setup's capacity
  (about 3.2 req/s: the last one queues and preempts).
- ``azure-overload``: the same file at 5 req/s on llama-2-70b with two-way tensor
  parallelism (a100-80g), far over capacity: thousands of requests wait (issue 28's
  overload case).
- ``whole-azure`` / ``whole-overload``: the whole ``slotune bench --format azure ...
  --rate 5 --json`` process on that file (imports, reading, drawing tokens, replay,
  summary), on llama-2-7b and on the overloaded llama-2-70b TP2.
- ``help`` / ``bench-help``: start-up of ``slotune --help`` and ``slotune bench --help``.
- ``vidur-azure`` / ``vidur-overload``: Vidur's whole process on the cases of
  ``whole-azure`` and ``whole-overload`` (``benchmarks/vidur_side.py``: prepared from its
  public snapshot in a virtualenv of its own; skipped, saying why, where none is prepared).
  They run once per repeat whatever ``--base`` is, and the table gives each whole-process
  case's ratio to Vidur's (Vidur's CPU seconds over slotune's).

Replay cases time ``run_simulated`` on the loaded trace with the prompt tokens drawn
inside it; process cases time the child process. The table compares CPU seconds
(``cpu_s``: far less disturbed than wall time on a shared machine; wall is in the JSON
lines). ``--base REV`` runs the same cases on a checkout of another commit (a ``git
worktree`` under the temp folder), each repeat interleaving the two trees, and prints
min, median and their ratios (this / base). ``--instructions`` also runs each case under
valgrind's callgrind (Debian package ``valgrind``) and compares instruction counts (in
billions): on a shared machine whose speed drifts, the count of the same run repeats to
within a fraction of a percent (both trees' bytecode is compiled first), so ratios of a
few percent can be seen.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

GPU, MODEL, BUDGET = "a100-80g", "llama-2-7b", 512
REPLAYS = {
    "synthetic": 4.0,
    "azure-below": 2.0,
    "azure-at": 3.0,
    "azure-above": 5.0,
    "azure-overload": 5.0,
}
PROCESSES = ("whole-azure", "whole-overload", "help", "bench-help")
VIDUR = {"vidur-azure": "whole-azure", "vidur-overload": "whole-overload"}  # and its twin
CASES = (*REPLAYS, *PROCESSES, *VIDUR)
WHOLE_RATE = 5.0
# the overloaded cases: the large model on two GPUs, far over its capacity at 5 req/s
OVERLOAD_MODEL, OVERLOAD_TP = "llama-2-70b", 2


def model_of(case: str) -> tuple[str, int]:
    """The model and tensor-parallel size a case runs."""
    return (OVERLOAD_MODEL, OVERLOAD_TP) if case.endswith("overload") else (MODEL, 1)


ROOT = Path(__file__).resolve().parent.parent


def write_azure_csv(path: Path, num_requests: int, seed: int = 0) -> Path:
    """An Azure-format conversation trace matching the published statistics (not the file)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ctx = np.clip(np.round(rng.lognormal(np.log(1020), 1.066, num_requests)), 2, 14000)
    gen = np.clip(np.round(rng.lognormal(np.log(130), 1.0, num_requests)), 1, 2000)
    times = np.cumsum(rng.exponential(1 / 5.4, num_requests))
    start = datetime(2023, 11, 16, 18, 15, 46)
    with open(path, "w", encoding="utf-8") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        rows = zip(times.tolist(), ctx.astype(int).tolist(), gen.astype(int).tolist(), strict=True)
        for t, c, g in rows:
            d = start + timedelta(seconds=t)
            f.write(f"{d:%Y-%m-%d %H:%M:%S}.{d.microsecond:06d}0,{c},{g}\n")
    return path


def conversation_trace(num_requests: int, seed: int = 0):  # type: ignore[no-untyped-def]
    from slotune.workloads.generators import LengthDist, length_trace

    return length_trace(
        "conversation-like",
        num_requests,
        LengthDist(mean=1350, sigma=0.8, low=16, high=3800),
        LengthDist(mean=240, sigma=0.8, low=4, high=1024),
        max_total=4096,
        seed=seed,
        id_prefix="c",
    )


def run_replay(case: str, num_requests: int, csv: Path, stretches: bool) -> dict[str, float]:
    t_import = time.perf_counter()
    from slotune.engine.config import EngineConfig
    from slotune.workloads import ArrivalSpec, default_max_model_len, run_simulated
    from slotune.workloads.readers import read_trace_file
    from slotune.workloads.tokenizer import get_tokenizer

    imports_s = time.perf_counter() - t_import
    t_load = time.perf_counter()
    if case == "synthetic":
        trace = conversation_trace(num_requests)
    else:
        trace = read_trace_file(
            csv, "azure", get_tokenizer("bytes"), num_requests=None, seed=0, multi_turn=False
        ).head(num_requests)
    load_s = time.perf_counter() - t_load
    config = EngineConfig(max_num_batched_tokens=BUDGET, max_model_len=default_max_model_len(trace))
    model, tp = model_of(case)
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_simulated(
        config,
        trace,
        gpu=GPU,
        model=model,
        tp=tp,
        arrivals=ArrivalSpec(rate=REPLAYS[case]),
        stretches=stretches,
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    requests = result.requests
    steps = int(result.engine_stats.get("steps", len(result.steps)))
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "imports_s": round(imports_s, 3),
        "load_s": round(load_s, 3),
        "completed": int(requests["error"].isna().sum()),
        "steps": steps,
        "simulated_s": round(result.duration_s, 3),
        "mean_ttft_s": round(
            float((requests["first_token_time"] - requests["arrival_time"]).mean()), 6
        ),
        "preemptions": int(result.engine_stats.get("num_preemptions", 0)),
    }


def process_command(case: str, num_requests: int, csv: Path) -> list[str]:
    slotune = [sys.executable, "-m", "slotune"]
    if case == "help":
        return [*slotune, "--help"]
    if case == "bench-help":
        return [*slotune, "bench", "--help"]
    model, tp = model_of(case)
    return [
        *slotune,
        "bench",
        *("--gpu", GPU, "--model", model, "--tp", str(tp)),
        *("--max-num-batched-tokens", str(BUDGET)),
        *("--trace", str(csv), "--format", "azure", "--num-requests", str(num_requests)),
        *("--rate", f"{WHOLE_RATE:g}", "--json"),
    ]


def run_case(
    tree: Path, case: str, num_requests: int, csv: Path, stretches: str, instructions: bool
) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "100"}
    replay = case in REPLAYS
    if case in VIDUR:
        import vidur_side

        cmd, tree = vidur_side.process(case, csv, num_requests)
        env.pop("PYTHONPATH")
    elif replay:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", case]
        cmd += ["--requests", str(num_requests), "--csv", str(csv), "--stretches", stretches]
    else:
        cmd = process_command(case, num_requests, csv)
    counted = instructions and case not in VIDUR
    if counted:  # the same run under callgrind: a count that load does not move
        env["PYTHONHASHSEED"] = "0"
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if replay:
        run = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        run = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}
    if counted:
        collected = re.search(r"Collected : (\d+)", out.stderr)
        if collected is None:
            raise RuntimeError(f"no instruction count from callgrind:\n{out.stderr[-2000:]}")
        run["instructions"] = int(collected.group(1))
    return run


def base_tree(rev: str) -> Path:
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"slotune-base-{sha[:12]}"
    if not tree.exists():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha],
            capture_output=True,
            check=True,
        )
    return tree


def json_in_tree(tree: Path, code: str, *args: str) -> dict:
    """Run ``code`` (``python -c``) with ``args`` on the code in ``tree``, in a process of
    its own, and read the JSON object its last line prints."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        cwd=tempfile.gettempdir(),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict], key: str) -> tuple[float, float]:
    values = [r[key] for r in runs]
    return min(values), statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    parser.add_argument("--requests", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=1, help="fresh runs of each case")
    parser.add_argument("--base", help="git revision to compare with, interleaved (e.g. main)")
    parser.add_argument(
        "--stretches",
        default="on",
        choices=["on", "off"],
        help="replays with the engine's stretches on or off (results are identical)",
    )
    parser.add_argument("--csv", type=Path, help="the Azure-format file (default: generated)")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count each case's instructions under valgrind's callgrind (about 15x "
        "slower; a replay's count includes the child's imports and trace load)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run = run_replay(args.child, args.requests, args.csv, args.stretches == "on")
        print(json.dumps(run))
        return
    csv = args.csv or write_azure_csv(
        Path(tempfile.gettempdir()) / f"slotune-azure-like-{args.requests}.csv", args.requests
    )
    trees = {"this": ROOT}
    if args.base:
        trees["base"] = base_tree(args.base)
    if any(case in VIDUR for case in args.cases):
        import vidur_side

        state, why = vidur_side.prepared()
        if state is None:
            print(f"skipped {', '.join(c for c in args.cases if c in VIDUR)}: {why}")
            args.cases = [c for c in args.cases if c not in VIDUR]
    for tree in trees.values():  # a fresh tree would count compiling its bytecode once
        subprocess.run([sys.executable, "-m", "compileall", "-q", "slotune"], cwd=tree, check=True)
    print(
        f"{MODEL} on {GPU} ({OVERLOAD_MODEL} TP{OVERLOAD_TP} for the overload cases), "
        f"budget {BUDGET}, {args.requests} requests, trace file {csv}"
    )
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(args.repeats):
        for case in args.cases:
            for name, tree in trees.items():
                if case in VIDUR and name != "this":
                    continue  # Vidur is the same whichever tree is measured
                run = run_case(tree, case, args.requests, csv, args.stretches, args.instructions)
                runs.setdefault((case, name), []).append(run)
                print(json.dumps({"case": case, "tree": name, **run}), flush=True)
    print()
    print("| case | time | this: min / median | base: min / median | ratio min | ratio median |")
    print("|---|---|---:|---:|---:|---:|")
    for case in args.cases:
        counted = args.instructions and case not in VIDUR
        keys = ["cpu_s"] + (["instructions"] if counted else [])
        same = not args.base or case in VIDUR or _same(runs[case, "this"], runs[case, "base"])
        for key in keys:
            unit = 1e9 if key == "instructions" else 1.0  # instructions in billions
            lo, med = (v / unit for v in summarize(runs[case, "this"], key))
            row = f"| {case} | {key} | {lo:.3f} / {med:.3f} |"
            if args.base and case not in VIDUR:
                blo, bmed = (v / unit for v in summarize(runs[case, "base"], key))
                row += f" {blo:.3f} / {bmed:.3f} | {lo / blo:.3f} | {med / bmed:.3f} |"
                row += "" if same else " results differ!"
            else:
                row += " | | |"
            print(row)
    for vidur, whole in VIDUR.items():
        if vidur in args.cases and whole in args.cases:
            v = summarize(runs[vidur, "this"], "cpu_s")
            for name in trees:
                w = summarize(runs[whole, name], "cpu_s")
                print(
                    f"{name}: {vidur} / {whole}, CPU seconds (min, median): "
                    f"{v[0] / w[0]:.1f}x, {v[1] / w[1]:.1f}x"
                )
    if "whole-azure" in args.cases and "azure-above" in args.cases:
        for name in trees:
            whole = summarize(runs["whole-azure", name], "cpu_s")
            replay = summarize(runs["azure-above", name], "cpu_s")
            print(
                f"{name}: whole process / replay of the loaded trace (min, median): "
                f"{whole[0] / replay[0]:.2f}, {whole[1] / replay[1]:.2f}"
            )


def _same(a: list[dict], b: list[dict]) -> bool:
    keys = ("completed", "steps", "simulated_s", "mean_ttft_s", "preemptions")
    return all(x.get(k) == y.get(k) for x in a for y in b for k in keys)


if __name__ == "__main__":
    main()
