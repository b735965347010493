"""Tuner quality: the tuner's best in 40 trials against an exhaustive grid, and the gain
over vLLM's defaults, on h100 + llama-3-8b for the sharegpt-like and agent traces.

    .venv/bin/python benchmarks/tuner_quality.py                 # both traces, both objectives
    .venv/bin/python benchmarks/tuner_quality.py --traces agent --objectives weighted

For each trace and objective the script prepares the study exactly as ``slotune tune``
does (SLO ttft=300ms,tpot=50ms, attainment 0.99, vLLM's defaults as the baseline and, for
``weighted``, the load those defaults just sustain), then

1. evaluates every configuration of a reduced space (``REDUCED``, a grid of
   budget x threshold x max_num_seqs x block size) with the tuner's own objective;
2. runs the tuner (TPE, the baseline enqueued first as ``slotune tune`` does) for
   ``--trials`` trials over the same space, for each of ``--seeds`` seeds;
3. runs the tuner on the full default space (``--full-seeds`` seeds), whose best can beat
   the reduced grid (a negative gap).

Simulations are deterministic, so the tuner reuses the grid's cached runs: the tuner's
wall time here says nothing about ``slotune tune``'s speed, only its choices count.
Gap to the grid optimum: goodput ``(grid - tuner) / grid``; weighted score
``(tuner - grid) / grid`` (lower scores are better), among configurations meeting the
attainment target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REDUCED: dict[str, Any] = {
    "max_num_batched_tokens": [512, 1024, 2048, 4096, 8192, 16384],
    "long_prefill_token_threshold": [0, 512],
    "max_num_seqs": [32, 128, 512, 1024],
    "block_size": [16, 32],
    "preemption_mode": "recompute",
    "prefix_caching": "hash",
    "policy": "chunked",
}


def evaluate_grid(objective: Any, space: Any, baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """Every grid configuration's record. Goodput searches start at the best so far (as
    trials do), so the optimum's goodput is exact."""
    rows = []
    best_rung = baseline.get("goodput_rung") or 0
    for params in space.grid():
        config = space.config_from_params(params)
        record = objective.measure(config, best_rung)
        if record.get("goodput_rung") is not None:
            best_rung = max(best_rung, record["goodput_rung"])
        rows.append({"config": config.to_dict(), **record})
    return rows


def best_record(records: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The selection rule of ``slotune tune`` (results.select_best) on plain records."""
    if kind == "goodput":
        return min(records, key=lambda r: (-r["goodput_value"], r["score"]))
    return min(records, key=lambda r: (not r["feasible"], r["score"]))


def best_value(records: list[dict[str, Any]], kind: str) -> float:
    best = best_record(records, kind)
    return best["goodput_value"] if kind == "goodput" else best["score"]


def served(record: dict[str, Any]) -> float:
    """Goodput in vLLM's sense at the record's load: requests/s that met every SLO."""
    return float(record["metrics"].get("goodput") or 0.0)


def run_tuner(
    setup: Any,
    baseline: dict[str, Any],
    evaluator: Any,
    trials: int,
    seed: int,
    folder: Path,
    space: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """A ``slotune tune`` study (baseline enqueued first), on ``space`` when given."""
    from dataclasses import replace

    from slotune.tuner import study as studies
    from slotune.tuner.results import finished

    setup = replace(setup, seed=seed, space=space or setup.space)
    tag = "full" if space else "reduced"
    url = f"sqlite:///{folder / f'{setup.trace}-{setup.objective}-{tag}-{seed}.db'}"
    evaluator.setup = setup
    studies.create(url, "q", setup, baseline)
    studies.run_worker(url, "q", trials, 0, evaluator=evaluator)
    study, _, _ = studies.load(url, "q")
    return [dict(t.user_attrs) for t in finished(study)]


def gap(kind: str, grid: float, tuner: float) -> float:
    return (grid - tuner) / grid if kind == "goodput" else (tuner - grid) / grid


def one_case(
    trace: str, objective_name: str, args: argparse.Namespace, folder: Path
) -> dict[str, Any]:
    from slotune.tuner.evaluate import Evaluator
    from slotune.tuner.prepare import TuneOptions, measure_baseline, prepare
    from slotune.tuner.space import SearchSpace, build_space
    from slotune.tuner.trial import TrialObjective

    search = folder / "reduced.json"
    search.write_text(json.dumps(REDUCED))
    options = TuneOptions(
        gpu="h100",
        model="llama-3-8b",
        trace=trace,
        slo=args.slo,
        objective=objective_name,
        num_requests=args.num_requests,
        search=str(search),
        seed=0,
    )
    prepared = prepare(options)
    evaluator = Evaluator(prepared.setup, prepared.trace)
    t0 = time.perf_counter()
    setup, baseline = measure_baseline(prepared, evaluator)
    space = SearchSpace.from_dict(setup.space)
    objective = TrialObjective(setup, evaluator, space, baseline_rung=baseline.get("goodput_rung"))
    records = evaluate_grid(objective, space, baseline)
    grid_s = time.perf_counter() - t0
    sims_grid = evaluator.runs
    grid_best = best_value(records, objective_name)
    base_value = baseline["goodput_value"] if objective_name == "goodput" else baseline["score"]
    tuner_values, tuner_served = [], []
    t1 = time.perf_counter()
    for seed in range(args.seeds):
        trials = run_tuner(setup, baseline, evaluator, args.trials, seed, folder)
        tuner_values.append(best_value(trials, objective_name))
        tuner_served.append(served(best_record(trials, objective_name)))
    tuner_s = time.perf_counter() - t1
    full_space = build_space(max_model_len=space.max_model_len).to_dict()
    full_values = [
        best_value(
            run_tuner(setup, baseline, evaluator, args.trials, seed, folder, full_space),
            objective_name,
        )
        for seed in range(args.full_seeds)
    ]
    top = evaluator.ladder.rate(evaluator.ladder.highest) if evaluator.ladder else None
    gaps = [gap(objective_name, grid_best, v) for v in tuner_values]
    improve = [
        ((v / base_value - 1) if objective_name == "goodput" else (1 - v / base_value))
        for v in tuner_values
    ]
    return {
        "trace": trace,
        "objective": objective_name,
        "load": setup.load.describe() if objective_name == "weighted" else "rate searched",
        "grid_size": len(records),
        "grid_best": grid_best,
        "grid_best_config": best_record(records, objective_name)["config"],
        "baseline_metrics": {k: baseline["metrics"].get(k) for k in ("ttft_ms", "tpot_ms")},
        "grid_best_metrics": {
            k: best_record(records, objective_name)["metrics"].get(k)
            for k in ("ttft_ms", "tpot_ms")
        },
        "baseline": base_value,
        "baseline_feasible": bool(baseline.get("feasible")),
        "tuner_best": tuner_values,
        "served_rps": {
            "grid_best": served(best_record(records, objective_name)),
            "tuner_best": tuner_served,
            "baseline": served(baseline),
        },
        "saturated": objective_name == "goodput" and top is not None and grid_best >= top,
        "gap_mean": statistics.mean(gaps),
        "gap_worst": max(gaps),
        "within_2pct": sum(g <= 0.02 for g in gaps),
        "gain_over_baseline_mean": statistics.mean(improve),
        "grid_gain_over_baseline": (grid_best / base_value - 1)
        if objective_name == "goodput"
        else 1 - grid_best / base_value,
        "grid_wall_s": round(grid_s, 1),
        "grid_simulations": sims_grid,
        "tuner_wall_s": round(tuner_s, 1),
        "full_space_tuner_best": full_values,
        "full_space_gap_to_grid": [gap(objective_name, grid_best, v) for v in full_values],
        "simulations_total": evaluator.runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=["sharegpt-like", "agent"])
    parser.add_argument("--objectives", nargs="+", default=["weighted", "goodput"])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--full-seeds",
        type=int,
        default=1,
        help="tuner runs on the full default space (compared to the grid)",
    )
    parser.add_argument(
        "--num-requests", type=int, default=None, help="default: as `slotune tune` (500 or all)"
    )
    parser.add_argument("--slo", default="ttft=300ms,tpot=50ms")
    parser.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    args = parser.parse_args()

    from slotune.tuner.study import quiet_optuna

    quiet_optuna()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for trace in args.traces:
            for objective in args.objectives:
                row = one_case(trace, objective, args, Path(tmp))
                rows.append(row)
                print(_line(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


def _line(r: dict[str, Any]) -> str:
    unit = "req/s" if r["objective"] == "goodput" else "score"
    tuner = ", ".join(f"{v:.4g}" for v in r["tuner_best"])
    s = r["served_rps"]
    served_text = ", ".join(f"{v:.4g}" for v in s["tuner_best"])
    flag = " SATURATED: feasible at the top of the rate ladder" if r["saturated"] else ""
    full = ", ".join(
        f"{v:.4g} ({100 * g:+.2f}%)"
        for v, g in zip(r["full_space_tuner_best"], r["full_space_gap_to_grid"], strict=True)
    )
    return (
        f"{r['trace']:14s} {r['objective']:8s} grid {r['grid_size']} configs best "
        f"{r['grid_best']:.4g} {unit}; tuner [{tuner}]; gap mean {100 * r['gap_mean']:.2f}% "
        f"worst {100 * r['gap_worst']:.2f}% ({r['within_2pct']}/{len(r['tuner_best'])} "
        f"within 2%); vLLM defaults {r['baseline']:.4g}, tuner gain "
        f"{100 * r['gain_over_baseline_mean']:+.1f}% "
        f"(grid {100 * r['grid_gain_over_baseline']:+.1f}%); "
        f"load {r['load']}; grid {r['grid_wall_s']}s/{r['grid_simulations']} sims, "
        f"tuner {r['tuner_wall_s']}s; served within SLO at that load: grid best "
        f"{s['grid_best']:.4g}, tuner [{served_text}], defaults {s['baseline']:.4g} "
        f"req/s; tuner on the full space [{full}]{flag}"
    )


if __name__ == "__main__":
    main()
