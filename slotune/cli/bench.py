"""``slotune bench``: one benchmark run of a trace against the simulator, the embedded
engine or an OpenAI-compatible HTTP server."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from slotune.cli import engine_options as eo
from slotune.cli import trace_options as to
from slotune.cli.app import app
from slotune.cli.common import fail, opt


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
    speculative_model: eo.SpeculativeModel = None,
    speculative_acceptance: eo.SpeculativeAcceptance = None,
    scheduling_policy: eo.SchedulingPolicy = None,
    swap_threshold_tokens: eo.SwapThreshold = None,
    top_tier_kv_share: eo.TopTierKVShare = None,
    top_tier_token_share: eo.TopTierTokenShare = None,
    decode_budget_ms: eo.DecodeBudget = None,
    adaptive_chunk_ms: eo.AdaptiveChunk = None,
    config: eo.ConfigJson = None,
    seed: Annotated[int, opt("--seed", "Seed of arrivals, sampling and synthetic tokens.")] = 0,
    out: Annotated[
        Path | None, opt("--out", "Write summary.json, requests.csv, steps.csv here.")
    ] = None,
    as_json: Annotated[bool, opt("--json", "Print the summary as JSON.")] = False,
) -> None:
    """Run one benchmark and print its latency, throughput and SLO summary."""
    from slotune.api import bench as run_bench
    from slotune.engine.knobs import EngineKnobs
    from slotune.workloads.bench import BenchError, BenchRequest, LoadOptions, TraceOptions

    request = BenchRequest(
        backend=backend,
        gpu=gpu,
        model=model,
        tp=tp,
        ep=ep,
        quantization=quantization,
        stack=stack,
        target=target_name,
        url=url,
        endpoint=endpoint,
        trace=TraceOptions(
            name=trace,
            format=format,
            num_requests=num_requests,
            multi_turn=multi_turn,
            tokenizer=tokenizer,
        ),
        load=LoadOptions(
            rate=rate,
            burstiness=burstiness,
            constant=constant,
            concurrency=concurrency,
            timestamps=timestamps,
            time_scale=time_scale,
            stages=stages,
            duration=duration,
            warmup=warmup,
            cooldown=cooldown,
        ),
        slo=slo,
        timeout=timeout,
        knobs=EngineKnobs(
            max_num_batched_tokens=max_num_batched_tokens,
            long_prefill_token_threshold=long_prefill_token_threshold,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            preemption_mode=preemption_mode,
            prefix_caching=prefix_caching,
            policy=policy,
            num_gpu_blocks=num_gpu_blocks,
            gpu_memory_utilization=gpu_memory_utilization,
            swap_space_gb=swap_space_gb,
            kv_cache_dtype=kv_cache_dtype,
            num_speculative_tokens=num_speculative_tokens,
            prompt_lookup_min=prompt_lookup_min,
            prompt_lookup_max=prompt_lookup_max,
            speculative_model=speculative_model,
            speculative_acceptance=speculative_acceptance,
            scheduling_policy=scheduling_policy,
            swap_threshold_tokens=swap_threshold_tokens,
            top_tier_kv_share=top_tier_kv_share,
            top_tier_token_share=top_tier_token_share,
            decode_budget_ms=decode_budget_ms,
            adaptive_chunk_ms=adaptive_chunk_ms,
        ),
        config=config,
        seed=seed,
        out=out,
    )
    console = Console(stderr=as_json)
    try:
        outcome = run_bench(request, _View(console))
    except BenchError as exc:
        fail(str(exc))
    if outcome.out is not None:
        console.print(f"wrote {out}/summary.json, requests.csv, steps.csv", highlight=False)
        if outcome.report is not None:
            console.print(f"report: {outcome.report}", highlight=False)
        else:
            console.print(
                f"[yellow]report not written:[/yellow] {outcome.report_error}", highlight=False
            )
    if as_json:
        typer.echo(json.dumps(outcome.summary, indent=2, default=str))
    else:
        _print_summary(Console(), outcome.summary)


class _View:
    """Notes on the console, and a progress bar while the requests run."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False)

    @contextmanager
    def running(self, total: int) -> Iterator[Callable[[int, int], None]]:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (
            TextColumn("[bold]requests"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=self.console, transient=True) as progress:
            task = progress.add_task("run", total=total)
            yield lambda done, total: progress.update(task, completed=done)


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
        from slotune.workloads.slo import tier_name

        for tier, t in sorted((s.get("tiers") or {}).items(), key=lambda kv: int(kv[0])):
            lines.append(
                f"  tier {tier} ({tier_name(int(tier))}), SLO {t['slo']}: attainment "
                f"{t['slo_attainment']:.1%}, goodput {t['goodput']:.2f} req/s"
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
