"""``slotune tune``: search the engine's knobs against latency SLOs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from slotune.cli import engine_options as eo
from slotune.cli import trace_options as to
from slotune.cli.app import app
from slotune.cli.common import fail, opt

_console = Console()


@app.command()
def tune(
    slo: Annotated[str, opt("--slo", "Latency SLO: ttft=300ms,tpot=50ms or ttft:p90=300ms.")],
    gpu: Annotated[str | None, opt("--gpu", "GPU (`slotune gpus`) or a profile JSON.")] = None,
    model: Annotated[
        str,
        opt(
            "--model",
            "Model name (`slotune models`), an HF config.json, "
            "or a checkpoint folder with --backend engine.",
        ),
    ] = "llama-3-8b",
    tp: Annotated[int, opt("--tp", "Tensor-parallel GPUs.")] = 1,
    quantization: eo.Quantization = None,
    ep: eo.ExpertParallel = 1,
    trace: to.TraceName = "sharegpt-like",
    format: to.TraceFormat = None,
    num_requests: Annotated[
        int | None,
        opt(
            "--num-requests",
            "Requests per trial (default: 500, or the whole trace if shorter; 32 with --backend "
            "engine); more come closer to steady state, slower.",
        ),
    ] = None,
    rate: Annotated[float | None, opt("--rate", "Poisson request rate (req/s).")] = None,
    burstiness: Annotated[float, opt("--burstiness", "Gamma arrival shape; needs --rate.")] = 1.0,
    concurrency: Annotated[int | None, opt("--concurrency", "Closed loop of N users.")] = None,
    objective: Annotated[
        str | None,
        opt(
            "--objective",
            "weighted | goodput | pareto (default: goodput when the trace has no "
            "timestamps and no --rate is given, else weighted).",
        ),
    ] = None,
    weights: Annotated[str | None, opt("--weights", "Score weights: ttft=0.5,tpot=0.5.")] = None,
    percentile: Annotated[float, opt("--percentile", "Percentile of the weighted score.")] = 99.0,
    attainment: Annotated[float, opt("--attainment", "Target share of requests in SLO.")] = 0.99,
    trials: Annotated[int, opt("--trials", "Finished trials the study should have.")] = 50,
    timeout: Annotated[float | None, opt("--timeout", "Stop new trials after N seconds.")] = None,
    request_timeout: Annotated[
        float | None,
        opt(
            "--request-timeout",
            "Client timeout per request (s): later, it is aborted and fails the SLO.",
        ),
    ] = None,
    duration: Annotated[
        float | None,
        opt(
            "--duration",
            "Steady state: each run sends at its rate for this many seconds (the trace cut "
            "or repeated), instead of a number of requests.",
        ),
    ] = None,
    warmup: Annotated[
        float, opt("--warmup", "Leave requests arriving in the first N seconds out of scores.")
    ] = 0.0,
    cooldown: Annotated[
        float, opt("--cooldown", "Leave requests arriving in the last N seconds out of scores.")
    ] = 0.0,
    sampler: Annotated[
        str | None,
        opt("--sampler", "tpe | nsga2 | random | grid (default: tpe; nsga2 for pareto)."),
    ] = None,
    seed: Annotated[int, opt("--seed", "Seed of the sampler, trace and arrivals.")] = 0,
    search: Annotated[
        str | None, opt("--search", "YAML/JSON file fixing or narrowing the search space.")
    ] = None,
    storage: Annotated[
        str | None, opt("--storage", "Optuna storage URL (default: SQLite in --out).")
    ] = None,
    study_name: Annotated[
        str | None, opt("--study-name", "Study name (default: <gpu>-<model>-<trace>-<objective>).")
    ] = None,
    resume: Annotated[bool, opt("--resume", "Continue an existing study.")] = False,
    n_jobs: Annotated[int, opt("--n-jobs", "Parallel worker processes on one storage.")] = 1,
    heartbeat: Annotated[
        int,
        opt(
            "--heartbeat",
            "Seconds between a worker's heartbeats; a trial silent for 3x is failed and retried.",
        ),
    ] = 30,
    backend: Annotated[
        str, opt("--backend", "sim (simulated GPU) | engine (real embedded engine).")
    ] = "sim",
    stack: Annotated[
        str | None,
        opt("--stack", "Serving stack the simulator models: a name or JSON (default vllm-v1)."),
    ] = None,
    out: Annotated[
        str | None, opt("--out", "Output folder (default: slotune-out/<study-name>/).")
    ] = None,
) -> None:
    """Find the engine configuration that best meets the SLO; compare it with vLLM's defaults."""
    from slotune.tuner.prepare import TuneInputError, TuneOptions, place_study, prepare

    options = TuneOptions(
        gpu=gpu,
        model=model,
        tp=tp,
        stack=stack,
        trace=trace,
        format=format,
        num_requests=num_requests,
        rate=rate,
        burstiness=burstiness,
        concurrency=concurrency,
        objective=objective,
        weights=weights,
        percentile=percentile,
        attainment=attainment,
        trials=trials,
        timeout=timeout,
        request_timeout=request_timeout,
        duration=duration,
        warmup=warmup,
        cooldown=cooldown,
        sampler=sampler,
        seed=seed,
        search=search,
        storage=storage,
        study_name=study_name,
        resume=resume,
        n_jobs=n_jobs,
        backend=backend,
        out=out,
        slo=slo,
        heartbeat=heartbeat,
        quantization=quantization,
        ep=ep,
    )
    try:
        prepared = prepare(options)
        place = place_study(options, prepared.setup.objective)
    except TuneInputError as e:
        fail(str(e))
    _run(options, prepared, place)


def _run(options: Any, prepared: Any, place: Any) -> None:
    from slotune.tuner import study as studies
    from slotune.tuner.evaluate import Evaluator
    from slotune.tuner.prepare import measure_baseline
    from slotune.tuner.space import SearchSpace

    evaluator = Evaluator(prepared.setup, prepared.trace)

    def baseline() -> Any:
        with _console.status("Measuring vLLM's defaults (the baseline)..."):
            return measure_baseline(prepared, evaluator)

    try:
        joined = studies.create_or_join(
            place.storage,
            place.name,
            prepared.setup,
            baseline,
            trials=options.trials,
            heartbeat=options.heartbeat,
        )
    except KeyboardInterrupt:
        Console(stderr=True).print(
            "\nInterrupted before the study was created; nothing was stored."
        )
        raise typer.Exit(130) from None
    except studies.StudyError as e:
        fail(str(e))
    study, setup, baseline = joined.study, joined.setup, joined.baseline
    if not joined.created:
        studies.set_budget(study, options.trials)
        evaluator = Evaluator(setup, prepared.trace)
        _console.print(
            f"{'Resuming' if options.resume else 'Joining'} study [bold]{place.name}[/bold] "
            f"({studies.count_finished(study)} finished trials)."
        )
    _print_plan(setup, place, prepared.trace)
    budget = options.trials
    if setup.sampler == "grid":
        space = SearchSpace.from_dict(setup.space)
        size = studies.enqueue_grid(study, space, setup.seed, options.trials, url=place.storage)
        budget = min(budget, size)
        _console.print(f"Grid: {size} configurations in the discretized space.")
    seed = None if joined.created else studies.joiner_seed(setup.seed)
    try:
        _optimize(
            place, studies.count_finished(study), setup, baseline, budget, options, evaluator, seed
        )
    except KeyboardInterrupt:
        done = studies.count_finished(study)
        Console(stderr=True).print(
            f"\nInterrupted: the {done} finished trials are kept in {place.storage}; "
            "run the same command with --resume to continue."
        )
        raise typer.Exit(130) from None
    except studies.StudyError as e:
        fail(str(e))
    done = studies.count_finished(study)
    if options.timeout and done < options.trials:
        _console.print(
            f"--timeout {options.timeout:g}s reached: {done} of {options.trials} "
            "trials finished; --resume continues the study.",
            highlight=False,
        )
    _finish(place, study, setup, baseline, evaluator)


def _print_plan(setup: Any, place: Any, trace: Any) -> None:
    load = setup.load.describe()
    if setup.objective == "goodput":
        kind = (
            "Poisson"
            if setup.load.burstiness == 1
            else (f"gamma, burstiness {setup.load.burstiness:g}")
        )
        load = f"the request rate is searched per trial ({kind}, 2% steps)"
    if setup.load.duration_s is not None:
        load += (
            f", each run {setup.load.duration_s:g} s long (scored after a "
            f"{setup.warmup_s:g} s warm-up, before a {setup.cooldown_s:g} s cool-down)"
        )
    _console.print(
        f"Tuning [bold]{setup.model}[/bold] on [bold]{setup.gpu}[/bold]"
        f"{f' x{setup.tp}' if setup.tp > 1 else ''} for SLO [bold]{setup.slo}[/bold]: "
        f"objective {setup.objective}, trace {setup.trace} ({len(trace)} requests), "
        f"load {load}, sampler {setup.sampler}, study {place.name}.",
        highlight=False,
    )
    for note in setup.notes:
        _console.print(f"  note: {note}", highlight=False)


def _optimize(
    place: Any,
    start: int,
    setup: Any,
    baseline: dict[str, Any],
    budget: int,
    options: Any,
    evaluator: Any,
    seed: int | None,
) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from slotune.tuner import study as studies
    from slotune.tuner.results import finished, select_best

    remaining = budget - start
    if remaining <= 0:
        _console.print(f"The study already has {start} finished trials.")
        return
    columns = (
        TextColumn("trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[best]}"),
    )
    with Progress(*columns, console=_console, transient=False) as progress:
        task = progress.add_task("tune", total=remaining, best="")

        def on_progress(study: Any) -> None:
            done = studies.count_finished(study)
            best = select_best(
                finished(study), setup.objective, setup.attainment, baseline["config"]
            )
            progress.update(
                task, completed=min(done - start, remaining), best=_best_text(setup, best, baseline)
            )

        studies.run_workers(
            place.storage,
            place.name,
            budget,
            options.n_jobs,
            timeout=options.timeout,
            on_progress=on_progress,
            evaluator=evaluator,
            seed=seed,
        )


def _best_text(setup: Any, best: Any, baseline: dict[str, Any]) -> str:
    if best is None:
        return ""
    attrs = best.user_attrs
    if setup.objective == "weighted":
        mark = "" if attrs.get("feasible") else " (misses attainment)"
        return (
            f"best score {attrs.get('score', 0):.3f}{mark} "
            f"(defaults {baseline.get('score', float('nan')):.3f})"
        )
    return (
        f"best goodput {attrs.get('goodput_rps') or 0:.3g} req/s "
        f"(defaults {baseline.get('goodput_rps') or 0:.3g})"
    )


def _finish(place: Any, study: Any, setup: Any, baseline: dict[str, Any], evaluator: Any) -> None:
    from slotune.tuner.results import write_outputs

    with _console.status("Rerunning the recommendation and the baseline for the report..."):
        try:
            outputs = write_outputs(
                out_dir=place.out_dir,
                study=study,
                setup=setup,
                baseline=baseline,
                evaluator=evaluator,
                storage=place.storage,
            )
        except ValueError as e:
            fail(str(e))
    _console.print(_comparison_table(outputs.best))
    for note in outputs.best["notes"][len(setup.notes) :]:
        _console.print(f"note: {note}", highlight=False)
    paths = [outputs.best_json, outputs.trials_csv, outputs.best_run, outputs.baseline_run]
    if place.storage.startswith("sqlite:///"):
        paths.insert(2, Path(place.storage.split("///", 1)[1]))
    report = _build_report(place.out_dir)
    _console.print("Written:", highlight=False)
    for p in paths:
        _console.print(f"  {p}", highlight=False)
    _console.print(f"  {report}" if isinstance(report, Path) else f"  ({report})", highlight=False)
    _console.print(
        f"Export: slotune export {outputs.best_json} --format vllm|sglang|yaml|json",
        highlight=False,
    )


def _build_report(out_dir: Path) -> Path | str:
    try:
        from slotune.reports import build_report
    except ImportError:
        return "report.html comes with the reports issue"
    try:
        return build_report(out_dir)
    except Exception as e:  # the report is a view: a failure there must not lose the results
        return f"report.html not written: {e}"


def _comparison_table(best: dict[str, Any]) -> Any:
    from rich.table import Table

    from slotune.tuner.objectives import METRIC_KEYS, percentile_key
    from slotune.workloads import parse_slo

    base = best["baseline"]
    load = best["load"]["description"]
    table = Table(
        title=f"Recommended vs vLLM defaults ({best['gpu']}, {best['model']}, "
        f"trace {best['trace']['name']}, load {load})"
    )
    table.add_column("")
    table.add_column("recommended", justify="right")
    table.add_column("vLLM defaults", justify="right")
    for name, value in best["config"].items():
        theirs = base["config"].get(name)
        style = "bold green" if value != theirs else ""
        table.add_row(name, f"[{style}]{value}[/{style}]" if style else str(value), str(theirs))
    table.add_section()
    own = {t.metric: t.percentile for t in parse_slo(best["slo"]).targets}
    for metric in best["slo_targets"]:
        p = percentile_key(own.get(metric) or best["percentile"])
        key = METRIC_KEYS[metric]
        ours = best["metrics"].get(key, {}).get(p)
        theirs = base["metrics"].get(key, {}).get(p)
        table.add_row(
            f"{metric.upper()} {p} (SLO {best['slo_targets'][metric]:g} ms)", _ms(ours), _ms(theirs)
        )
    table.add_row(
        "SLO attainment",
        _pct(best["metrics"].get("slo_attainment")),
        _pct(base["metrics"].get("slo_attainment")),
    )
    table.add_row(
        "weighted score (lower is better)", _num(best.get("score")), _num(base.get("score"))
    )
    if best.get("goodput_rps") is not None or base.get("goodput_rps") is not None:
        table.add_row(
            "goodput: max rate within SLO (req/s)",
            _num(best.get("goodput_rps")),
            _num(base.get("goodput_rps")),
        )
    return table


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3g}"
