"""``slotune bench``: one benchmark run of a trace against the simulator, the embedded
engine or an OpenAI-compatible HTTP server."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from slotune.cli import engine_options as eo
from slotune.cli import trace_options as to
from slotune.cli.app import app
from slotune.cli.common import fail, opt, writable_folder


@app.command()
def bench(
    gpu: Annotated[str, opt("--gpu", "Simulated GPU (`slotune gpus`) or a profile JSON.")] = "h100",
    model: Annotated[
        str,
        opt(
            "--model",
            "Model name (sim), checkpoint folder (engine), or the served model name (http).",
        ),
    ] = "llama-3-8b",
    tp: Annotated[int, opt("--tp", "Tensor-parallel GPUs (sim).")] = 1,
    quantization: eo.Quantization = None,
    ep: eo.ExpertParallel = 1,
    backend: Annotated[str, opt("--backend", "sim | engine | http.")] = "sim",
    url: Annotated[str | None, opt("--url", "Server URL for --backend http.")] = None,
    endpoint: Annotated[str, opt("--endpoint", "completions | chat (http).")] = "completions",
    trace: to.TraceName = "sharegpt-like",
    format: to.TraceFormat = None,
    num_requests: to.NumRequests = None,
    multi_turn: to.MultiTurn = False,
    tokenizer: to.Tokenizer = None,
    rate: Annotated[
        float | None,
        opt(
            "--rate",
            "Open-loop arrival rate per second of sessions: a session's first request (the "
            "later turns of a multi-turn trace follow their predecessors, so such a trace "
            "sends more requests per second; the header says how many). Single requests: "
            "req/s, as vLLM's --request-rate.",
        ),
    ] = None,
    burstiness: Annotated[
        float, opt("--burstiness", "Gamma shape (1 = Poisson); needs --rate.")
    ] = 1.0,
    constant: Annotated[bool, opt("--constant", "Constant gaps of 1/rate.")] = False,
    concurrency: Annotated[int | None, opt("--concurrency", "Closed loop of N users.")] = None,
    timestamps: Annotated[bool, opt("--timestamps", "Replay the trace's own timestamps.")] = False,
    time_scale: Annotated[float, opt("--time-scale", "Multiply trace timestamps by this.")] = 1.0,
    stages: Annotated[
        str | None,
        opt(
            "--stages",
            "Load stages RATE:SECONDS,... (e.g. 5:60,10:60); they set the number of requests "
            "(the trace is cut or repeated).",
        ),
    ] = None,
    duration: Annotated[
        float | None, opt("--duration", "With --rate: send for this many seconds (one stage).")
    ] = None,
    warmup: Annotated[
        float, opt("--warmup", "Leave requests arriving in the first N seconds out of the scores.")
    ] = 0.0,
    cooldown: Annotated[
        float,
        opt("--cooldown", "Leave requests arriving in the last N seconds out of the scores."),
    ] = 0.0,
    slo: Annotated[str | None, opt("--slo", "SLO, e.g. ttft=300ms,tpot=50ms.")] = None,
    stack: eo.Stack = None,
    target_name: eo.TargetName = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            "--request-timeout",
            help="Client timeout per request (s): the request is aborted and fails "
            "(an SLO miss). Default: none (http: 600).",
        ),
    ] = None,
    max_num_batched_tokens: eo.MaxNumBatchedTokens = None,
    long_prefill_token_threshold: eo.LongPrefillTokenThreshold = None,
    block_size: eo.BlockSize = None,
    max_num_seqs: eo.MaxNumSeqs = None,
    max_model_len: Annotated[
        int | None, opt("--max-model-len", "Default: the trace's longest request.")
    ] = None,
    preemption_mode: eo.PreemptionMode = None,
    prefix_caching: eo.PrefixCaching = None,
    policy: eo.Policy = None,
    num_gpu_blocks: eo.NumGpuBlocks = None,
    gpu_memory_utilization: eo.GpuMemoryUtilization = None,
    swap_space_gb: eo.SwapSpace = None,
    kv_cache_dtype: eo.KVCacheDtype = None,
    num_speculative_tokens: eo.NumSpeculativeTokens = None,
    prompt_lookup_min: eo.PromptLookupMin = None,
    prompt_lookup_max: eo.PromptLookupMax = None,
    scheduling_policy: eo.SchedulingPolicy = None,
    swap_threshold_tokens: eo.SwapThreshold = None,
    top_tier_kv_share: eo.TopTierKVShare = None,
    top_tier_token_share: eo.TopTierTokenShare = None,
    decode_budget_ms: eo.DecodeBudget = None,
    config: eo.ConfigJson = None,
    seed: Annotated[int, opt("--seed", "Seed of arrivals, sampling and synthetic tokens.")] = 0,
    out: Annotated[
        Path | None, opt("--out", "Write summary.json, requests.csv, steps.csv here.")
    ] = None,
    as_json: Annotated[bool, opt("--json", "Print the summary as JSON.")] = False,
) -> None:
    """Run one benchmark and print its latency, throughput and SLO summary."""
    from slotune.workloads import parse_slo, summarize
    from slotune.workloads.backends import make_backend
    from slotune.workloads.runner.timeouts import check_timeout

    if backend == "http" and not url:
        fail("--backend http needs --url (e.g. http://localhost:8000)")
    try:
        where = make_backend(
            backend,
            gpu=gpu,
            model=model,
            tp=tp,
            ep=ep,
            quantization=quantization,
            stack=stack,
            url=url,
            endpoint=endpoint,
            tokenizer=tokenizer,
        )
    except ValueError as exc:
        fail(f"--{exc}")
    if out is not None:
        writable_folder(out, "--out")
    console = Console(stderr=as_json)
    try:
        stack = eo.resolve_stack(stack, target_name)
    except ValueError as exc:
        fail(f"--target: {exc}")
    try:
        slo_obj = parse_slo(slo) if slo else None
    except ValueError as exc:
        fail(f"--slo: {exc}")
    try:
        check_timeout(timeout)
    except ValueError as exc:
        fail(f"--{exc}")
    arrivals = _arrivals(
        rate, burstiness, concurrency, timestamps, time_scale, constant, stages, duration
    )
    if arrivals.stages and num_requests is not None:
        fail("--num-requests: the load stages (--stages or --duration) set the number of requests")
    tr = to.load_trace_or_fail(
        trace, format, num_requests, tokenizer, seed, multi_turn, where="--trace", model=model
    )
    if arrivals.num_sessions is not None:
        if arrivals.num_sessions > len(tr):
            console.print(
                f"trace {tr.name}: repeated to the {arrivals.num_sessions} sessions the "
                "stages send",
                highlight=False,
            )
        tr = tr.repeat_to(arrivals.num_sessions)
    if timestamps and not tr.has_timestamps:
        fail(f"--timestamps: trace {tr.name} has no timestamps; use --rate or --concurrency")
    overrides = eo.flag_overrides(locals())
    engine_config = None if backend == "http" else _engine_config(config, overrides, tr)
    stats = tr.stats()
    if stats.get("tokenizer"):
        console.print(f"tokenizer: {stats['tokenizer']}", highlight=False)
    if tr.dropped:
        console.print(
            f"trace {tr.name}: dropped {tr.num_dropped} rows ({tr.dropped})", highlight=False
        )
    load = arrivals.describe(tr.requests_per_session)
    console.print(
        f"bench: {len(tr)} requests of {tr.name}, {load}, {where.describe()}", highlight=False
    )
    result = _run(where, engine_config, tr, arrivals, seed=seed, timeout_s=timeout, console=console)
    try:
        summary = summarize(
            result, slo_obj, warmup_s=warmup, cooldown_s=cooldown, stages=arrivals.stages
        )
    except ValueError as exc:
        fail(f"--warmup/--cooldown: {exc}")
    summary.update(
        {
            "config": None if engine_config is None else engine_config.to_dict(),
            "backend": backend,
            "gpu": gpu if backend == "sim" else None,
            "stack": result.engine_stats.get("stack"),
            "model": model,
            "tp": tp,
            "quantization": quantization,
            "ep": ep,
            "url": url,
            "trace": {"name": tr.name, "stats": stats},
            "arrivals": load,
            "timeout_s": timeout,
            "seed": seed,
            "slotune_version": _version(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "engine_stats": result.engine_stats,
        }
    )
    if out is not None:
        _write(out, result, summary, console)
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
    else:
        _print_summary(Console(), summary)


def _arrivals(
    rate: float | None,
    burstiness: float,
    concurrency: int | None,
    timestamps: bool,
    time_scale: float,
    constant: bool,
    stages: str | None,
    duration: float | None,
) -> Any:
    from slotune.workloads import ArrivalSpec, Stage, parse_stages

    try:
        if stages is not None and (rate is not None or duration is not None):
            raise ValueError("--stages: give stages or --rate (with --duration), not both")
        if duration is not None and rate is None:
            raise ValueError("--duration: needs --rate (or use --stages RATE:SECONDS,...)")
        staged = parse_stages(stages) if stages else ()
        if duration is not None and rate is not None:
            staged, rate = (Stage(rate, duration),), None
        return ArrivalSpec(
            rate=rate,
            burstiness=burstiness,
            concurrency=concurrency,
            timestamps=timestamps,
            time_scale=time_scale,
            constant=constant,
            stages=staged,
        )
    except ValueError as exc:  # ArrivalSpec names its fields: give the flags instead
        fail(re.sub(r"^ArrivalSpec\.(\w+)", lambda m: "--" + m[1].replace("_", "-"), str(exc)))


def _engine_config(config: str | None, overrides: dict[str, Any], trace: Any) -> Any:
    from slotune.workloads import default_max_model_len

    try:
        return eo.build_engine_config(config, overrides, lambda: default_max_model_len(trace))
    except ValueError as exc:
        fail(str(exc))


def _run(
    backend: Any,
    engine_config: Any,
    trace: Any,
    arrivals: Any,
    *,
    seed: int,
    timeout_s: float | None,
    console: Console,
) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from slotune.workloads.backends import run

    columns = (TextColumn("[bold]requests"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("run", total=len(trace))

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done)

        try:
            return run(
                backend,
                trace,
                arrivals,
                engine_config,
                seed=seed,
                timeout_s=timeout_s,
                progress=on_progress,
            )
        except (ValueError, FileNotFoundError) as exc:
            fail(str(exc))


def _write(out: Path, result: Any, summary: dict[str, Any], console: Console) -> None:
    result.save(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    console.print(f"wrote {out}/summary.json, requests.csv, steps.csv", highlight=False)
    try:
        from slotune.reports import build_bench_report

        path = build_bench_report(out)
        console.print(f"report: {path}", highlight=False)
    except Exception as exc:  # the run's data is written; a report failure must not hide it
        console.print(f"[yellow]report not written:[/yellow] {exc}", highlight=False)


def _version() -> str:
    from slotune._version import __version__

    return __version__


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.1f}"


def _print_summary(console: Console, s: dict[str, Any]) -> None:
    table = Table(title=f"slotune bench: {s['trace']['name']} ({s['arrivals']})")
    table.add_column("latency (ms)")
    for col in ("mean", "p50", "p90", "p95", "p99"):
        table.add_column(col, justify="right")
    for label, key in (
        ("TTFT", "ttft_ms"),
        ("TPOT", "tpot_ms"),
        ("ITL", "itl_ms"),
        ("E2E", "e2el_ms"),
    ):
        d = s[key]
        table.add_row(label, *(_ms(d.get(c)) for c in ("mean", "p50", "p90", "p95", "p99")))
    console.print(table)
    lines = [
        f"requests: {s['completed']} completed, {s['failed']} failed of {s['num_requests']}"
        f" in {s['duration_s']:.2f} s",
        f"throughput: {s['request_throughput']:.2f} req/s, "
        f"{s['output_throughput']:.0f} output tok/s",
        f"preemptions: {s['num_preemptions']}, "
        f"prefix-cache hit rate: {s['prefix_cache_hit_rate']:.1%}",
    ]
    if s.get("slo"):
        lines.append(
            f"SLO {s['slo']}: attainment {s['slo_attainment']:.1%}, "
            f"goodput {s['goodput']:.2f} req/s"
        )
        for c in s.get("slo_checks", []):
            mark = "met" if c["met"] else "MISSED"
            lines.append(
                f"  {c['metric']} p{c['percentile']:g} = {c['value_ms']:.1f} ms "
                f"(target {c['threshold_ms']:g} ms): {mark}"
            )
    for reason, n in (s.get("errors") or {}).items():
        lines.append(f"  error x{n}: {reason}")
    window = s.get("scoring_window")
    if window:
        lines.append(
            f"scored: {window['requests']} requests arriving in "
            f"[{window['start_s']:.1f} s, {window['end_s']:.1f} s] "
            f"(warm-up {window['warmup_s']:g} s, cool-down {window['cooldown_s']:g} s)"
        )
    if (s.get("steady_state") or {}).get("steady") is False:
        lines.append(f"[yellow]not in steady state:[/yellow] {s['steady_state']['note']}")
    for line in lines:
        console.print(line, highlight=False)
