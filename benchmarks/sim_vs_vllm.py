"""The simulator against real vLLM serving runs, run by run.

    .venv/bin/python benchmarks/sim_vs_vllm.py                       # every run, default stack
    .venv/bin/python benchmarks/sim_vs_vllm.py --stack eager         # kernels + slotune's host
    .venv/bin/python benchmarks/sim_vs_vllm.py --runs DIR --json out.json
    .venv/bin/python benchmarks/sim_vs_vllm.py --cv model --cv workload   # cross-validation
    .venv/bin/python benchmarks/sim_vs_vllm.py --sensitivity              # one-knob changes

Replays every run under ``--runs`` (default: ``../shared/reference/vllm-runs`` beside the
checkout, the training split of the BLIS sim-to-real study) with its own arrivals, prompt
lengths, shared prefixes, output length, TP, token budget, ``max_num_seqs`` and KV-block
count, and prints a Markdown table of the mean TTFT, ITL and E2E errors per run next to
BLIS's published error on the same run, then the mean absolute error over the runs (of
the mean, p50, p90 and p99) and which runs saturate in the simulator. A run the simulator
cannot express (for example a model family it cannot read) is listed with the reason.

``--cv model`` / ``--cv workload``: leave-one-model-out / leave-one-workload-out
cross-validation. Each fold refits the stack (``calibration.from_runs``, ``--cv-params``,
``--cv-evaluations`` replays, from ``--cv-start``) on the other runs and replays the
held-out runs in full with the fold's fit; per-run errors, then the mean and the worst
absolute error per metric.

``--sensitivity``: every pair of runs that differ in one knob, measured against simulated
change of the mean E2E, TTFT and ITL: the load stages of one run (the request rate), one
model's workloads, two models at one TP and workload; then the measured single-knob
changes of the study's held-out runs (``validate.pairs.MEASURED_PAIRS``: for checking,
never fitted) simulated on a study-like workload.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from slotune.validate import load_run, markdown_table, overall, replay, run_row
from slotune.validate.runs import MeasuredRun

DEFAULT_RUNS = Path(__file__).resolve().parents[1].parent / "shared/reference/vllm-runs"


def _blis(runs_dir: Path) -> dict[str, dict[str, float]]:
    path = runs_dir / "blis_published_errors.csv"
    if not path.is_file():
        return {}
    with path.open() as f:
        return {
            row["run"]: {k: float(v) for k, v in row.items() if k.endswith("_pct")}
            for row in csv.DictReader(f)
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--stack", default=None, help="stack name or JSON (default vllm-v1)")
    ap.add_argument("--gpu", default=None, help="GPU profile name or JSON (default: the run's)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--cv", action="append", choices=("model", "workload"), default=[])
    ap.add_argument("--cv-start", default=None, help="stack each fold's fit starts from")
    ap.add_argument("--cv-evaluations", type=int, default=28)
    ap.add_argument("--cv-window", type=float, default=60.0)
    ap.add_argument(
        "--cv-params",
        default="",
        help="comma-separated fitted constants per fold (default: calibration.from_runs.PARAMS)",
    )
    ap.add_argument("--sensitivity", action="store_true")
    args = ap.parse_args()
    folders = sorted(p for p in args.runs.iterdir() if (p / "requests.json").is_file())
    if not folders:
        print(f"no runs under {args.runs}", file=sys.stderr)
        return 2
    if args.cv:
        return cross_validate(folders, args)
    if args.sensitivity:
        return sensitivity(folders, args)
    rows, skipped = [], []
    for folder in folders:
        t0 = time.perf_counter()
        try:
            run = load_run(folder, gpu=args.gpu)
            row = run_row(replay(run, gpu=args.gpu, stack=args.stack))
        except ValueError as e:
            skipped.append((folder.name, str(e)))
            continue
        row["replay_s"] = time.perf_counter() - t0
        rows.append(row)
        print(f"{folder.name}: {row['replay_s']:.1f} s", file=sys.stderr)
    print(markdown_table(rows, _blis(args.runs)))
    total = overall(rows)
    print("| metric | MAE of the mean | median | MAE p50 | MAE p90 | MAE p99 |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in ("ttft", "itl", "e2e"):
        print(
            f"| {m.upper()} | {total[f'{m}_mean_mae_pct']:.1f} % | "
            f"{total[f'{m}_mean_median_ae_pct']:.1f} % | {total[f'{m}_p50_mae_pct']:.1f} % | "
            f"{total[f'{m}_p90_mae_pct']:.1f} % | {total[f'{m}_p99_mae_pct']:.1f} % |"
        )
    print(
        f"| throughput | {total['throughput_mae_pct']:.1f} % | "
        f"{total['throughput_median_ae_pct']:.1f} % | | | |"
    )
    sat = [r["run"] for r in rows if r["saturated"]]
    print(f"\n{len(rows)} runs replayed; saturating in the simulator: {sat or 'none'}")
    for name, why in skipped:
        print(f"- not replayed: {name}: {why}")
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "overall": total}, indent=2))
    return 0


def run_model(run: MeasuredRun) -> str:
    return Path(run.settings.model).parent.name


def run_workload(run: MeasuredRun) -> str:
    return run.name.rsplit("-", 1)[-1]


def _metric_summary(rows: list[dict], label: str) -> None:
    print(f"\n| {label} | mean abs | worst (run) |")
    print("|---|---:|---|")
    for m in ("e2e", "ttft", "itl"):
        errs = [(abs(r[f"{m}_mean_err"]) * 100, r["run"]) for r in rows]
        worst = max(errs)
        mean = sum(e for e, _ in errs) / len(errs)
        print(f"| {m.upper()} | {mean:.1f} % | {worst[0]:.1f} % ({worst[1][16:]}) |")


def cross_validate(folders: list[Path], args: argparse.Namespace) -> int:
    from slotune.calibration.from_runs import PARAMS, fit_from_runs
    from slotune.engine.sim.stack import load_stack

    runs = [load_run(f, gpu=args.gpu) for f in folders]
    by_name = {p.name: p for p in PARAMS}
    params = [by_name[n] for n in args.cv_params.split(",")] if args.cv_params else list(PARAMS)
    out: dict[str, list[dict]] = {}
    for kind in args.cv:
        key = run_model if kind == "model" else run_workload
        rows: list[dict] = []
        for group in sorted({key(r) for r in runs}):
            train = [r for r in runs if key(r) != group]
            test = [r for r in runs if key(r) == group]
            t0 = time.perf_counter()
            fit = fit_from_runs(
                train,
                stack=load_stack(args.cv_start),
                params=params,
                window_s=args.cv_window,
                warmup_s=15.0,
                max_evaluations=args.cv_evaluations,
            )
            vals = ", ".join(f"{k.split('.')[-1]} {v:.4g}" for k, v in fit.values.items())
            print(
                f"fold {kind}={group}: fit on {len(train)} runs in "
                f"{time.perf_counter() - t0:.0f} s: {vals}; at bounds: {fit.at_bounds or 'none'}",
                file=sys.stderr,
            )
            for run in test:
                row = run_row(replay(run, stack=fit.stack, profile=fit.profile))
                row["fold"] = f"{kind}={group}"
                row["fit_values"] = fit.values
                row["at_bounds"] = fit.at_bounds
                rows.append(row)
        print(f"\n### Leave one {kind} out\n")
        print(markdown_table(rows, _blis(args.runs)))
        _metric_summary(rows, f"leave-one-{kind}-out")
        out[kind] = rows
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


def _change(after: float, before: float) -> float:
    return after / before - 1 if before > 0 else float("nan")


def sensitivity(folders: list[Path], args: argparse.Namespace) -> int:
    from itertools import combinations

    from slotune.validate.pairs import MEASURED_PAIRS, direction_ok, simulate_pair

    runs = {f.name: load_run(f, gpu=args.gpu) for f in folders}
    replays = {n: replay(r, gpu=args.gpu, stack=args.stack) for n, r in runs.items()}
    per_run = [run_row(rp) for rp in replays.values()]
    print("### Every run with the shipped fit (training error)\n")
    print(markdown_table(per_run, _blis(args.runs)))
    _metric_summary(per_run, "training runs")
    print()
    rows: list[tuple[str, str, dict[str, float], dict[str, float]]] = []

    def means(rp, window=None):  # type: ignore[no-untyped-def]
        st = rp.stats(window)
        return (
            {m: st[m]["meas_mean"] for m in ("e2e", "ttft", "itl")},
            {m: st[m]["pred_mean"] for m in ("e2e", "ttft", "itl")},
        )

    for name, rp in replays.items():  # the request rate: stage 0 -> stage 1 of one run
        stages = rp.run.stages
        if len(stages) == 2:
            (m0, p0), (m1, p1) = means(rp, stages[0]), means(rp, stages[1])
            meas = {m: _change(m1[m], m0[m]) for m in m0}
            pred = {m: _change(p1[m], p0[m]) for m in p0}
            rows.append((f"{name[16:]} stage 1 -> 2", "rate", meas, pred))
    for a, b in combinations(sorted(replays), 2):
        ra, rb = runs[a], runs[b]
        same_model = run_model(ra) == run_model(rb) and ra.settings.tp == rb.settings.tp
        same_load = run_workload(ra) == run_workload(rb)
        if same_model == same_load:
            continue  # none or two knobs differ
        knob = "workload" if same_model else "model"
        (ma, pa), (mb, pb) = means(replays[a]), means(replays[b])
        meas = {m: _change(mb[m], ma[m]) for m in ma}
        pred = {m: _change(pb[m], pa[m]) for m in pa}
        rows.append((f"{a[16:]} -> {b[16:]}", knob, meas, pred))
    print("### Single-knob pairs within the training runs (measured / simulated change)\n")
    print("| pair | knob | E2E meas / sim | TTFT meas / sim | ITL meas / sim | direction |")
    print("|---|---|---:|---:|---:|---|")
    for label, knob, meas, pred in rows:
        ok = all(direction_ok(meas[m], pred[m]) for m in ("e2e", "ttft", "itl"))
        cells = " | ".join(
            f"{meas[m] * 100:+.1f} / {pred[m] * 100:+.1f} %" for m in ("e2e", "ttft", "itl")
        )
        print(f"| {label} | {knob} | {cells} | {'right' if ok else 'WRONG'} |")
    print(
        "\n### Held-out single-knob changes (measured: BLIS study as quoted in issue 25; "
        "simulated on the study's general load, validate.pairs.study_workload)\n"
    )
    print(
        "| pair | E2E meas / sim | TTFT meas / sim | ITL sim | direction | size ratio "
        "| mixed steps before / after | largest step before / after |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for pair in MEASURED_PAIRS:
        r = simulate_pair(pair, stack=args.stack)
        ok = direction_ok(pair.e2e or 0.0, r["e2e_sim"])
        if pair.ttft is not None:
            ok = ok and direction_ok(pair.ttft, r["ttft_sim"])
        ratio = r["e2e_sim"] / pair.e2e if pair.e2e else float("nan")
        meas_t = "" if pair.ttft is None else f"{pair.ttft * 100:+.0f} %"
        tie = "tie (±2 %)" if pair.tie else f"{(pair.e2e or 0) * 100:+.0f} %"
        print(
            f"| {pair.name} | {tie} / {r['e2e_sim'] * 100:+.1f} % | "
            f"{meas_t} / {r['ttft_sim'] * 100:+.1f} % | {r['itl_sim'] * 100:+.1f} % | "
            f"{'right' if ok else 'WRONG'} | {'' if pair.tie else f'{ratio:.2f}'} | "
            f"{r['mixed_before'] * 100:.1f} / {r['mixed_after'] * 100:.1f} % | "
            f"{r['largest_step_before']:.0f} / {r['largest_step_after']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
