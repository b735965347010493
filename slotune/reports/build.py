"""Assemble ``report.html`` from a tune output folder, or a smaller one from a bench folder."""

from __future__ import annotations

import contextlib
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from slotune._version import __version__
from slotune.reports import behaviour, fmt, search
from slotune.reports.best import section, slo_targets_ms, slo_text
from slotune.reports.diagnostics import diagnose
from slotune.reports.hardware import hardware_html
from slotune.reports.html import definition_list, e, figure_block, note, page
from slotune.reports.html import section as html_section
from slotune.reports.runs import RunData, forget_ahead, load_run, read_ahead, read_json
from slotune.reports.sections import (
    baseline_label,
    bench_provenance_items,
    bench_summary_html,
    diagnostics_html,
    importance_note,
    provenance_html,
    provenance_items,
    recommendation_html,
    trials_table_html,
)
from slotune.reports.trials import TrialsData, empty_trials, load_csv_trials, load_study_trials

REPORT_NAME = "report.html"
RECOMMENDED = "recommended"


def _blocks(figures: list[tuple[str, go.Figure | None]], pair: bool = False) -> str:
    blocks = [figure_block(key, fig) for key, fig in figures if fig is not None]
    if pair and len(blocks) > 1:
        return f'<div class="pair">{"".join(blocks)}</div>'
    return "\n".join(blocks)


def load_trials(out_dir: Path, best: dict[str, Any]) -> TrialsData:
    """The study (``study.db``, else the storage URL in best.json), else ``trials.csv``,
    else no trials, with the reason."""
    objective = best.get("objective") if isinstance(best.get("objective"), str) else None
    sources: list[str | Path] = []
    if (out_dir / "study.db").is_file():
        sources.append(out_dir / "study.db")
    storage = best.get("storage")
    if isinstance(storage, str) and storage and not storage.startswith("sqlite:"):
        sources.append(storage)
    problems = [] if sources else ["no study.db or storage URL was stored"]
    for source in sources:
        try:
            trials = load_study_trials(source, best.get("study_name"), objective)
            return replace(trials, source=_redact(source))
        except Exception as exc:  # an unreadable study must not stop the rest of the report
            problems.append(
                _redact(
                    f"{source} could not be read as an Optuna study ({type(exc).__name__}: {exc})"
                )
            )
    csv = out_dir / "trials.csv"
    if csv.is_file():
        try:
            names = tuple(str(n) for n in best.get("metric_names") or ())
            trials = load_csv_trials(csv, objective, tuple(best.get("directions") or ()), names)
            return replace(trials, source=str(csv))
        except (OSError, ValueError, KeyError) as exc:
            problems.append(f"{csv} could not be read ({exc})")
    return empty_trials("; ".join(problems))


def _redact(source: str | Path) -> str:
    """A storage URL without its password."""
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", str(source))


def search_html(trials: TrialsData, best: dict[str, Any] | None = None) -> str:
    if trials.completed.empty:
        reason = f" ({trials.importance_note})" if trials.source == "none" else ""
        return note(f"No completed trials to plot{reason}.")
    params = search.top_params(trials)
    parts = [_blocks([("history", search.history_figure(trials))])]
    parts.append(_blocks([("pareto", search.pareto_figure(trials))]))
    importances = search.importance_figure(trials)
    parts.append(
        _blocks([("importances", importances)])
        + f"<p>{e(importance_note(trials.importances, best or {}))}</p>"
        if importances
        else note(trials.importance_note or "Parameter importances not computed.")
    )
    parts.append(_blocks([("slices", search.slice_figure(trials, params))]))
    parts.append(_blocks([("contour", search.contour_figure(trials, params))]))
    return "\n".join(p for p in parts if p)


def behaviour_html(runs: list[RunData], slo: dict[str, float]) -> str:
    if not runs:
        return note("No stored runs (runs/best, runs/baseline) to plot.")
    return "\n".join(
        [
            _blocks(
                [
                    ("ttft_cdf", behaviour.latency_cdf_figure(runs, "ttft_ms", slo.get("ttft"))),
                    ("tpot_cdf", behaviour.latency_cdf_figure(runs, "tpot_ms", slo.get("tpot"))),
                ],
                pair=True,
            ),
            _blocks(
                [
                    ("itl", _itl_figure(runs, slo)),
                    ("kv", behaviour.kv_figure(runs)),
                ],
                pair=True,
            ),
            _blocks([("batch", behaviour.batch_figure(runs))]),
            _blocks([("queues", behaviour.queue_figure(runs))]),
            _preemption_cache(runs),
        ]
    )


def _preemption_cache(runs: list[RunData]) -> str:
    quiet = behaviour.preemption_cache_note(runs)
    if quiet is not None:
        return f'<h3 class="quiet">Preemptions and prefix caching</h3>{note(quiet)}'
    return _blocks([("preemption_cache", behaviour.preemption_cache_figure(runs))])


def _itl_figure(runs: list[RunData], slo: dict[str, float]) -> go.Figure | None:
    if "itl" in slo:
        return behaviour.itl_figure(runs, slo["itl"], "ITL")
    return behaviour.itl_figure(runs, slo.get("tpot"), "TPOT")


def _has_data(run: RunData) -> bool:
    return bool(run.summary) or not run.requests.empty or not run.steps.empty


def _diagnostics_block(runs: list[RunData], trace_stats: dict[str, Any]) -> str:
    if not runs:
        return note("No stored run to diagnose.")
    parts = []
    for i, run in enumerate(runs):
        items = diagnostics_html(diagnose(run, trace_stats))
        if i == 0:
            parts.append(f"<h3>{e(run.label)}</h3>{items}")
        else:
            parts.append(f"<details><summary>{e(run.label)}</summary>{items}</details>")
    return "\n".join(parts)


def _run_dirs(out_dir: Path) -> tuple[Path, Path]:
    """The recommendation's and the baseline's stored runs in a tune's output folder."""
    return out_dir / "runs" / "best", out_dir / "runs" / "baseline"


class TuneReport:
    """``build_report`` as ``slotune.tune`` calls it: the tune's finish also has it read the
    stored runs (``read_ahead``) as soon as they are written, while the last what-if reruns
    end on the other cores, so that the report does not read them after."""

    def __call__(self, out_dir: Path) -> Path:
        try:
            return build_report(out_dir)
        finally:
            for run_dir in _run_dirs(out_dir):
                forget_ahead(run_dir)  # not taken: the build failed before it

    def read_ahead(self, out_dir: Path) -> None:
        # only a head start: the report reads the runs itself and says what it cannot, and
        # the tune's results must not be lost to it
        with contextlib.suppress(Exception):
            for run_dir in _run_dirs(out_dir):
                read_ahead(run_dir)


def build_report(out_dir: Path | str, output: Path | str | None = None) -> Path:
    """Write ``report.html`` for a ``slotune tune`` output folder and return its path."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise FileNotFoundError(f"{out_dir}: no such folder; expected the --out folder of tune")
    if not (out_dir / "best.json").is_file() and not (out_dir / "study.db").is_file():
        raise FileNotFoundError(
            f"{out_dir}: neither best.json nor study.db found; is this a `slotune tune` folder?"
        )
    best = read_json(out_dir / "best.json")
    slo = slo_targets_ms(best)
    trials = load_trials(out_dir, best)
    if isinstance(best.get("trial"), int):
        trials = replace(trials, recommended=best["trial"])
    base = section(best, "baseline")
    best_dir, base_dir = _run_dirs(out_dir)
    candidates = [
        load_run(best_dir, RECOMMENDED, section(best, "config") or None),
        load_run(base_dir, baseline_label(best), section(base, "config") or None),
    ]
    runs = [r for r in candidates if _has_data(r)]
    trace_stats = section(section(best, "trace"), "stats")
    sections = [
        html_section("recommendation", "Recommendation", recommendation_html(best, slo)),
        *_verified(best),
        *_what_if(best),
        html_section("diagnostics", "Diagnostics", _diagnostics_block(runs, trace_stats)),
        html_section(
            "behaviour",
            f"Behaviour: recommended vs {baseline_label(best)}",
            behaviour_html(runs, slo),
        ),
        html_section(
            "hardware", "Hardware: recommended vs vLLM defaults", hardware_html(runs, best)
        ),
        html_section("search", "Search", search_html(trials, best)),
        html_section("trials", "All trials", trials_table_html(trials)),
        html_section(
            "provenance",
            "Provenance",
            provenance_html(provenance_items(best, __version__, len(trials.frame), trials.source)),
        ),
    ]
    subtitle = (
        f"{fmt.text(best.get('model'))} on {fmt.text(best.get('gpu'))} · "
        f"SLO {fmt.text(slo_text(best))} · objective {fmt.text(best.get('objective'))}"
    )
    path = Path(output) if output is not None else out_dir / REPORT_NAME
    path.write_text(page("slotune tuning report", subtitle, sections), encoding="utf-8")
    return path


def _verified(best: dict[str, Any]) -> list[str]:
    from slotune.reports.verify import verify_html

    body = verify_html(best)
    return [] if body is None else [html_section("verify", "Measured on the server", body)]


def _what_if(best: dict[str, Any]) -> list[str]:
    from slotune.reports.what_if import what_if_html

    body = what_if_html(best)
    return [] if body is None else [html_section("what-if", "What-if: slotune's policies", body)]


def build_bench_report(bench_dir: Path | str, output: Path | str | None = None) -> Path:
    """Write ``report.html`` for a ``slotune bench --out`` folder: one run's behaviour."""
    bench_dir = Path(bench_dir)
    if not (bench_dir / "summary.json").is_file() and not (bench_dir / "requests.csv").is_file():
        raise FileNotFoundError(
            f"{bench_dir}: no summary.json or requests.csv; expected a `slotune bench --out` folder"
        )
    run = load_run(bench_dir, "run")
    summary = run.summary
    slo = slo_targets_ms(summary)
    trace = section(summary, "trace")
    sections = [
        html_section("summary", "Summary", bench_summary_html(summary, run.config, slo)),
        html_section(
            "diagnostics", "Diagnostics", _diagnostics_block([run], section(trace, "stats"))
        ),
        html_section("behaviour", "Behaviour", behaviour_html([run], slo)),
        html_section("hardware", "Hardware", hardware_html([run], summary)),
        html_section(
            "provenance",
            "Provenance",
            definition_list(bench_provenance_items(summary, __version__)),
        ),
    ]
    target = summary.get("gpu") or summary.get("url") or summary.get("backend")
    subtitle = (
        f"{fmt.text(summary.get('model'))} on {fmt.text(target)} · "
        f"SLO {fmt.text(slo_text(summary))} · load {fmt.text(summary.get('arrivals'))}"
    )
    path = Path(output) if output is not None else bench_dir / REPORT_NAME
    path.write_text(page("slotune bench report", subtitle, sections), encoding="utf-8")
    return path
