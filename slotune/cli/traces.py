"""``slotune traces list|show|convert``: the bundled traces and any trace file's statistics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from slotune.cli import trace_options as to
from slotune.cli.app import app
from slotune.cli.common import fail, writable_file

traces_app = typer.Typer(help="List, inspect and convert workload traces.", no_args_is_help=True)
app.add_typer(traces_app, name="traces")


def _stats_table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, box=None, pad_edge=False, header_style="bold")
    headers = (
        "trace",
        "reqs",
        "sess",
        "in",
        "in p99",
        "out",
        "out p99",
        "prefix",
        "times",
    )
    for col in headers:
        table.add_column(col, justify="left" if col == "trace" else "right", no_wrap=True)
    for s in rows:
        p, o = s["prompt_len"], s["output_len"]
        table.add_row(
            s["name"],
            str(s["requests"]),
            str(s["sessions"] or "-"),
            f"{p['mean']:.0f}",
            f"{p['p99']:.0f}",
            f"{o['mean']:.0f}",
            f"{o['p99']:.0f}",
            f"{s['prefix_sharing_ratio']:.0%}",
            "yes" if s["has_timestamps"] else "no",
        )
    return table


def _print_notes(console: Console, stats: dict[str, Any]) -> None:
    if stats.get("tokenizer"):
        console.print(f"tokenizer: {stats['tokenizer']}", highlight=False)
    dropped = stats.get("dropped") or {}
    if dropped:
        parts = ", ".join(f"{n} {reason}" for reason, n in dropped.items())
        console.print(f"dropped {sum(dropped.values())} rows: {parts}", highlight=False)


@traces_app.command("list")
def list_traces(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The bundled traces with their statistics."""
    from slotune.workloads import BUNDLED, load_trace

    rows = []
    for name, description in BUNDLED.items():
        stats = load_trace(name).stats()
        stats["description"] = description
        rows.append(stats)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    console = Console()
    title = "Bundled traces (tokens in/out: mean, p99; prompts include the history)"
    console.print(_stats_table(rows, title))
    notes = Table.grid(padding=(0, 2))
    notes.add_column(no_wrap=True, style="bold")
    notes.add_column()  # a long description wraps in its own column
    for s in rows:
        notes.add_row(s["name"], s["description"])
    console.print(notes)


@traces_app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="A bundled trace name or a trace file.")],
    fmt: to.TraceFormat = None,
    num_requests: to.NumRequests = None,
    tokenizer: to.Tokenizer = None,
    model: to.TokenizerModel = None,
    multi_turn: to.MultiTurn = False,
    seed: int = typer.Option(0, "--seed", help="Seed of ShareGPT sampling and synthetic tokens."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Statistics of one trace: requests, sessions, length percentiles, prefix sharing."""
    trace = to.load_trace_or_fail(name, fmt, num_requests, tokenizer, seed, multi_turn, model=model)
    stats = trace.stats()
    if as_json:
        typer.echo(json.dumps(stats, indent=2))
        return
    console = Console()
    console.print(_stats_table([stats], f"Trace {trace.name} ({trace.source or name})"))
    if stats.get("timestamp_span_s") is not None:
        console.print(
            f"timestamps span {stats['timestamp_span_s']} s, mean rate {stats['mean_rate']} req/s"
        )
    _print_notes(console, stats)


@traces_app.command("convert")
def convert(
    src: Annotated[str, typer.Argument(help="Input trace (bundled name or file).")],
    dst: Annotated[Path, typer.Argument(help="Output file (slotune JSONL).")],
    fmt: to.TraceFormat = None,
    num_requests: to.NumRequests = None,
    tokenizer: to.Tokenizer = None,
    model: to.TokenizerModel = None,
    multi_turn: to.MultiTurn = False,
    seed: int = typer.Option(0, "--seed", help="Seed of ShareGPT sampling and synthetic tokens."),
    force: bool = typer.Option(False, "--force", help="Overwrite DST if it exists."),
) -> None:
    """Convert any supported trace to slotune's own JSONL."""
    writable_file(dst, "DST", inputs=[src], overwrite=force)
    trace = to.load_trace_or_fail(src, fmt, num_requests, tokenizer, seed, multi_turn, model=model)
    try:
        trace.to_jsonl(dst)
    except OSError as exc:
        fail(f"cannot write {dst}: {exc}")
    console = Console()
    console.print(f"wrote {dst}: {len(trace)} requests", highlight=False)
    _print_notes(console, trace.stats())


@traces_app.command("fit")
def fit(
    src: Annotated[str, typer.Argument(help="Trace to fit (bundled name or file).")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the spec (JSON).")],
    fmt: to.TraceFormat = None,
    num_requests: to.NumRequests = None,
    tokenizer: to.Tokenizer = None,
    model: to.TokenizerModel = None,
    multi_turn: to.MultiTurn = False,
    seed: int = typer.Option(0, "--seed", help="Seed of ShareGPT sampling and synthetic tokens."),
) -> None:
    """Fit a trace's lengths, arrivals, sessions and prefix sharing into a spec; then
    `--trace SPEC --num-requests N` draws any number of requests like it."""
    from slotune.workloads.fit import fit_trace, write_spec

    writable_file(out, "--out", inputs=[src])
    trace = to.load_trace_or_fail(src, fmt, num_requests, tokenizer, seed, multi_turn, model=model)
    try:
        spec = fit_trace(trace)
        write_spec(spec, out)
    except ValueError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {out}: {exc}")
    console = Console()
    lengths, arrivals, prefix = spec["lengths"], spec["arrivals"], spec["prefix"]
    console.print(
        f"wrote {out}: fitted on {spec['requests']} requests of {trace.name}", highlight=False
    )
    console.print(
        f"  prompt p50 {lengths['prompt'][20]:.0f}, output p50 {lengths['output'][20]:.0f} tokens; "
        f"sessions {spec['sessions']['turns']}",
        highlight=False,
    )
    if arrivals:
        console.print(
            f"  arrivals {arrivals['rate']:.3g} req/s, burstiness {arrivals['burstiness']:.3g}, "
            f"shape over {arrivals['period_s']:.0f} s",
            highlight=False,
        )
    console.print(
        f"  prefix sharing: {prefix['share']:.0%} of first turns, {len(prefix['weights'])} groups",
        highlight=False,
    )
