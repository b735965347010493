"""``slotune tune``: search the engine's knobs against latency SLOs."""

from __future__ import annotations

import dataclasses
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
    tp: Annotated[
        int | None, opt("--tp", "Tensor-parallel GPUs (default 1; with --gpus the one TP tried).")
    ] = None,
    quantization: eo.Quantization = None,
    ep: eo.ExpertParallel = 1,
    speculative_model: eo.SpeculativeModel = None,
    speculative_acceptance: eo.SpeculativeAcceptance = None,
    trace: to.TraceName = "sharegpt-like",
    format: to.TraceFormat = None,
    num_requests: Annotated[
        int | None,
        opt(
            "--num-requests",
            "Requests per trial, sent as a burst at the rate (default: a timed steady-state "
            "run, see --duration; 32 with --backend engine or timestamps, 500 with only "
            "--warmup/--cooldown).",
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
    tier_objective: Annotated[
        str | None,
        opt(
            "--tier-objective",
            "Per tier: floors as constraints, weights maximized (pro>=0.99,free=1).",
        ),
    ] = None,
    trials: Annotated[
        int | None,
        opt(
            "--trials",
            "Finished trials the study should have (default: 12 with the default "
            "steady-state runs, else 50).",
        ),
    ] = None,
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
            "or repeated), instead of a number of requests (default with the simulator on a "
            "trace without timestamps: 30).",
        ),
    ] = None,
    warmup: Annotated[
        float | None,
        opt(
            "--warmup",
            "Leave requests arriving in the first N seconds out of scores (default with a "
            "duration: 10, at most a third of it; else 0).",
        ),
    ] = None,
    cooldown: Annotated[
        float | None,
        opt(
            "--cooldown",
            "Leave requests arriving in the last N seconds out of scores (default with a "
            "duration: 3, at most a tenth of it; else 0).",
        ),
    ] = None,
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
    stack: eo.Stack = None,
    target: eo.TargetName = None,
    out: Annotated[
        str | None, opt("--out", "Output folder (default: slotune-out/<study-name>/).")
    ] = None,
    verify: Annotated[
        str | None,
        opt(
            "--verify",
            "After tuning, start this server command per top configuration ({flags}: its "
            "engine flags, {port}: a free port), measure it with the same trace and load, and "
            'recommend the measured winner; e.g. "vllm serve MODEL {flags} --port {port}".',
        ),
    ] = None,
    verify_top: Annotated[
        int, opt("--verify-top", "Configurations to measure with --verify (plus the defaults).")
    ] = 5,
    verify_repeats: Annotated[
        int, opt("--verify-repeats", "Runs per configuration with --verify (a noise band at 2+).")
    ] = 1,
    verify_flags: Annotated[
        str,
        opt("--verify-flags", "Whose flags fill {flags}: auto | vllm | sglang | slotune."),
    ] = "auto",
    verify_timeout: Annotated[
        float, opt("--verify-timeout", "Seconds a verified server may take to start.")
    ] = 600.0,
    gpus: Annotated[
        int | None,
        opt(
            "--gpus",
            "Spend N GPUs: search deployments (replicas, TP, co-located or prefill/decode "
            "apart, router, each kind's flags) at --rate, as `slotune deploy` does (its "
            "options: `slotune deploy --help`).",
        ),
    ] = None,
) -> None:
    """Find the configuration of the target engine that best meets the SLO; compare it with
    that engine's defaults. With --gpus N, find the deployment of N GPUs instead."""
    from slotune.api import tune
    from slotune.tuner.workflow import (
        StudyError,
        TuneInputError,
        TuneInterrupted,
        TuneOptions,
    )

    options = TuneOptions(
        gpu=gpu,
        model=model,
        tp=1 if tp is None else tp,
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
        tier_objective=tier_objective,
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
        verify=verify,
        verify_top=verify_top,
        verify_repeats=verify_repeats,
        verify_flags=verify_flags,
        verify_timeout=verify_timeout,
        target=target,
        speculative_model=speculative_model,
        speculative_acceptance=speculative_acceptance,
    )
    if gpus is not None:
        _deploy(gpus, {**dataclasses.asdict(options), "tp": tp})
        return
    display = _Display(options)
    try:
        result = tune(options, on_event=display.on_event)
    except TuneInputError as e:
        fail(e.render(flag))
    except StudyError as e:
        fail(str(e))
    except TuneInterrupted as e:
        if e.stored:
            message = (
                f"\nInterrupted: the {e.finished} finished trials are kept in {e.storage}; "
                "run the same command with --resume to continue."
            )
        else:
            message = "\nInterrupted before the study was created; nothing was stored."
        Console(stderr=True).print(message)
        raise typer.Exit(130) from None
    finally:
        display.close()
    _print_result(result)


# tune's options the deployment search takes (as deploy's); the rest are refused
_DEPLOY_TAKES: tuple[str, ...] = (
    "slo",
    "gpu",
    "model",
    "tp",
    "ep",
    "trace",
    "format",
    "num_requests",
    "rate",
)
_DEPLOY_TAKES += ("attainment", "trials", "request_timeout", "seed", "stack", "target", "out")


def _deploy(gpus: int, given: dict[str, Any]) -> None:
    """``tune --gpus N``: ``slotune deploy``'s search, with tune's options mapped onto
    deploy's; an option of tune that a deployment search does not take is refused."""
    import inspect

    from slotune.cli.deploy import deploy
    from slotune.cluster.export import ENGINES

    defaults = {k: p.default for k, p in inspect.signature(tune).parameters.items()}
    changed = [k for k, v in given.items() if k in defaults and v != defaults[k]]
    extra = [flag(k) for k in changed if k not in _DEPLOY_TAKES]
    if given["ep"] != 1:
        fail(
            "--ep with --gpus: the deployment search chooses each instance kind's EP for a "
            "MoE model (`slotune deploy --no-ep` keeps it at 1)"
        )
    if extra:
        fail(f"--gpus searches deployments (`slotune deploy`), which takes no {', '.join(extra)}")
    if given["rate"] is None:
        fail("--gpus: needs --rate, the request rate the deployment must serve")
    engine = given["target"] or "vllm"
    if engine not in ENGINES:
        fail(f"--target with --gpus: {engine!r} — a deployment exports to {', '.join(ENGINES)}")
    trace = given["trace"]
    out = given["out"] or (
        f"slotune-out/deploy-{gpus}x{given['gpu'] or 'h100'}-{given['model']}-{Path(trace).stem}"
    )
    deploy(
        slo=given["slo"],
        rate=given["rate"],
        gpus=gpus,
        gpu=given["gpu"] or "h100",
        model=given["model"],
        stack=given["stack"],
        trace=trace,
        format=given["format"],
        num_requests=given["num_requests"],
        attainment=given["attainment"],
        trials=given["trials"] or 30,
        tp="1,2,4,8" if given["tp"] is None else str(given["tp"]),
        engine=engine,
        timeout=given["request_timeout"],
        seed=given["seed"],
        out=Path(out),
    )


def flag(field: str) -> str:
    """The ``slotune tune`` flag of a ``TuneOptions`` field."""
    return "--" + field.replace("_", "-")


class _Display:
    """The console view of the workflow's events: a spinner per stage, the plan, a bar."""

    def __init__(self, options: Any) -> None:
        self.options = options
        self.live: Any = None
        self.task: Any = None
        self.ready: Any = None
        self.finished = 0

    def on_event(self, event: Any) -> None:
        from slotune.tuner import workflow as w

        if isinstance(event, w.StudyReady):
            self._ready(event)
        elif isinstance(event, w.TrialsProgress):
            self.finished = event.finished
            done = min(event.finished - event.start, event.budget - event.start)
            best = _best_text(self.ready.setup, event.best, self.ready.baseline)
            self.live.update(self.task, completed=done, best=best)
        elif isinstance(event, w.StageStarted):
            self._start(event.stage)
        elif isinstance(event, w.StageDone):
            self.close()

    def _ready(self, event: Any) -> None:
        self.ready = event
        self.finished = event.finished
        if not event.created:
            _console.print(
                f"{'Resuming' if self.options.resume else 'Joining'} study "
                f"[bold]{event.name}[/bold] ({event.finished} finished trials)."
            )
        _print_plan(event.setup, event.name, event.num_requests)
        if event.grid_size is not None:
            _console.print(f"Grid: {event.grid_size} configurations in the discretized space.")
        if event.budget <= event.finished:
            _console.print(f"The study already has {event.finished} finished trials.")

    def _start(self, stage: Any) -> None:
        from slotune.tuner.workflow import Stage

        if stage is Stage.TRIALS:
            self.live = _progress_bar()
            self.task = self.live.add_task(
                "tune", total=self.ready.budget - self.ready.finished, best=""
            )
        else:
            if stage is Stage.FINISH:
                self._timeout_note()
            self.live = _console.status(stage.value[0].upper() + stage.value[1:] + "...")
        self.live.start()

    def _timeout_note(self) -> None:
        trials = self.ready.budget
        if self.options.timeout and self.finished < trials:
            _console.print(
                f"--timeout {self.options.timeout:g}s reached: {self.finished} of {trials} "
                "trials finished; --resume continues the study.",
                highlight=False,
            )

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _progress_bar() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[best]}"),
    )
    return Progress(*columns, console=_console, transient=False)


def _print_plan(setup: Any, name: str, num_requests: int) -> None:
    load = setup.load.describe()
    if setup.objective == "goodput":
        kind = (
            "Poisson"
            if setup.load.burstiness == 1
            else (f"gamma, burstiness {setup.load.burstiness:g}")
        )
        step = ((setup.ladder or {}).get("ratio", 1.02) - 1) * 100
        load = f"the request rate is searched per trial ({kind}, {step:.0f}% steps)"
    if setup.load.duration_s is not None:
        load += (
            f", each run {setup.load.duration_s:g} s long (scored after a "
            f"{setup.warmup_s:g} s warm-up, before a {setup.cooldown_s:g} s cool-down)"
        )
    _console.print(
        f"Tuning [bold]{setup.model}[/bold] on [bold]{setup.gpu}[/bold]"
        f"{f' x{setup.tp}' if setup.tp > 1 else ''} for SLO [bold]{setup.slo}[/bold]: "
        f"objective {setup.objective}, trace {setup.trace} ({num_requests} requests), "
        f"load {load}, sampler {setup.sampler}, study {name}.",
        highlight=False,
    )
    for note in setup.notes:
        _console.print(f"  note: {note}", highlight=False)


def _best_text(setup: Any, best: Any, baseline: dict[str, Any]) -> str:
    if best is None:
        return ""
    if setup.objective == "weighted":
        missed = " (below a tier floor)" if setup.tier_objective else " (misses attainment)"
        mark = "" if best.feasible else missed
        return (
            f"best score {best.score or 0:.3f}{mark} "
            f"(defaults {baseline.get('score', float('nan')):.3f})"
        )
    return (
        f"best goodput {best.goodput_rps or 0:.3g} req/s "
        f"(defaults {baseline.get('goodput_rps') or 0:.3g})"
    )


def _print_result(result: Any) -> None:
    if result.verified is not None:
        _print_verify(result.verified, result.verified_stack)
    _console.print(_comparison_table(result.best))
    _console.print(result.best.get("headline", ""), highlight=False)
    if result.best.get("what_if"):
        from slotune.reports.what_if import what_if_sentence

        _console.print(f"What-if: {what_if_sentence(result.best['what_if'])}", highlight=False)
    for note in result.best["notes"][len(result.setup.notes) :]:
        _console.print(f"note: {note}", highlight=False)
    paths = [result.best_json, result.trials_csv, result.best_run, result.baseline_run]
    if result.database is not None:
        paths.insert(2, result.database)
    _console.print("Written:", highlight=False)
    for p in paths:
        _console.print(f"  {p}", highlight=False, soft_wrap=True)
    report = result.report or f"({result.report_note})"
    _console.print(f"  {report}", highlight=False)
    refused = result.best.get("export_refused")
    if refused:
        _console.print(f"Export refused: {refused}", highlight=False)
    else:
        # soft_wrap: a command longer than the terminal is never broken by an inserted newline
        _console.print(
            f"Export: slotune export {result.best_json}", highlight=False, soft_wrap=True
        )


def _print_verify(outcome: Any, stack: Path | None) -> None:
    from rich.table import Table

    primary = outcome.primary
    table = Table(title=f"Verified on the server ({primary}; simulated vs measured)")
    for col in ("configuration", "simulated", "measured", "TTFT p99 sim/meas (ms)", "result"):
        table.add_column(col, justify="left" if col in ("configuration", "result") else "right")

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:,.3g}"

    for c in outcome.candidates:
        band = c.band(primary)
        measured = num(c.mean(primary)) + (
            f" [{num(band[0])}, {num(band[1])}]" if band and len(c.measured) > 1 else ""
        )
        ttft = f"{num(c.predicted.get('ttft_p99_ms'))} / {num(c.mean('ttft_p99_ms'))}"
        result = c.error or ("winner" if c.label == outcome.winner else "")
        table.add_row(c.label, num(c.predicted.get(primary)), measured, ttft, result)
    _console.print(table)
    rho = outcome.rank_correlation
    _console.print(
        f"rank correlation (simulated vs measured order): {'-' if rho is None else f'{rho:.2f}'}"
        f"; {outcome.note}",
        highlight=False,
    )
    if stack is not None:
        _console.print(
            f"stack fitted to the measured runs: {stack} (next study: --stack {stack})",
            highlight=False,
        )


def _comparison_table(best: dict[str, Any]) -> Any:
    from rich.table import Table

    from slotune.tuner.objectives import METRIC_KEYS, percentile_key
    from slotune.workloads import parse_slo

    base = best["baseline"]
    load = best["load"]["description"]
    defaults = base.get("name", "vLLM serving defaults").replace("serving ", "")
    table = Table(
        title=f"Recommended vs {defaults} ({best['gpu']}, {best['model']}, "
        f"trace {best['trace']['name']}, load {load})"
    )
    table.add_column("")
    table.add_column("recommended", justify="right")
    table.add_column(defaults, justify="right")
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
    from slotune.workloads.slo import tier_name

    ours_tiers, theirs_tiers = (
        best["metrics"].get("tiers") or {},
        base["metrics"].get("tiers") or {},
    )
    for tier in sorted(ours_tiers, key=int):  # each against its own SLO
        table.add_row(
            f"tier {tier} ({tier_name(int(tier))}) SLO attainment",
            _pct(ours_tiers[tier].get("slo_attainment")),
            _pct((theirs_tiers.get(tier) or {}).get("slo_attainment")),
        )
    table.add_row("failed (timed out)", _failed(best["metrics"]), _failed(base["metrics"]))
    table.add_row("steady state reached", _steady(best["metrics"]), _steady(base["metrics"]))
    score_label = (
        "tier objective: weighted share missing the SLO"
        if best.get("tier_objective")
        else "weighted score (lower is better)"
    )
    table.add_row(score_label, _num(best.get("score")), _num(base.get("score")))
    if best.get("goodput_rps") is not None or base.get("goodput_rps") is not None:
        table.add_row(
            "goodput: max rate within SLO (req/s)",
            _num(best.get("goodput_rps")),
            _num(base.get("goodput_rps")),
        )
    return table


def _failed(metrics: dict[str, Any]) -> str:
    from slotune.tuner.results import flat_metrics

    if metrics.get("failed") is None:
        return "n/a"
    return f"{metrics['failed']} ({flat_metrics(metrics).get('timeouts', 0)})"


def _steady(metrics: dict[str, Any]) -> str:
    steady = (metrics.get("steady_state") or {}).get("steady")
    if isinstance(steady, bool):
        return "yes" if steady else "no"
    return "n/a"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3g}"
