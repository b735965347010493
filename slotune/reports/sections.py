"""The text sections of a report: recommendation, diagnostics, trials table, provenance."""

from __future__ import annotations

from typing import Any

import pandas as pd

from slotune.reports import fmt
from slotune.reports.best import CONFIG_FIELDS, section, slo_text
from slotune.reports.diagnostics import Diagnostic
from slotune.reports.html import Cell, command_block, definition_list, e, note, table
from slotune.reports.trials import TABLE_METRICS, TrialsData

_PERCENTILES = ("p50", "p90", "p99")


def stat(summary: dict[str, Any], metric: str, name: str | None = None) -> float | None:
    """``summary[metric][name]`` (or ``summary[metric]``) when it is a finite number."""
    value = summary.get(metric)
    if name is not None:
        value = value.get(name) if isinstance(value, dict) else None
    return float(value) if fmt.is_number(value) else None


def goodput_gain(best: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    ours, theirs = stat(best, "goodput"), stat(baseline, "goodput")
    if ours is None or theirs is None or theirs <= 0:
        return None
    return ours / theirs - 1.0


def _changed(config: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    if not baseline:
        return [k for k in CONFIG_FIELDS if k in config]
    return [k for k in _config_keys(config, baseline) if config.get(k) != baseline.get(k)]


def _config_keys(config: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    extra = sorted((set(config) | set(baseline)) - set(CONFIG_FIELDS))
    return [k for k in CONFIG_FIELDS if k in config or k in baseline] + extra


def recommendation_sentence(best: dict[str, Any]) -> str:
    config = section(best, "config")
    metrics = section(best, "metrics")
    base = section(best, "baseline")
    base_config, base_metrics = section(base, "config"), section(base, "metrics")
    trace = section(best, "trace").get("name")
    where = (
        f"{fmt.text(best.get('model'))} on {fmt.text(best.get('gpu'))} "
        f"(TP {fmt.text(best.get('tp'))}), trace {fmt.text(trace)}"
    )
    changed = _changed(config, base_config)
    if not config:
        setting = "no configuration was stored"
    elif changed:
        setting = "set " + ", ".join(f"{k}={config.get(k)}" for k in changed)
    else:
        setting = "keep vLLM's defaults"
    result = (
        f"It meets the SLO ({fmt.text(slo_text(best))}) for "
        f"{fmt.pct(stat(metrics, 'slo_attainment'))} of requests, a goodput of "
        f"{fmt.num(stat(metrics, 'goodput'))} req/s"
    )
    gain = goodput_gain(metrics, base_metrics)
    if gain is not None:
        result += (
            f", {fmt.signed_pct(gain)} over vLLM's defaults "
            f"({fmt.num(stat(base_metrics, 'goodput'))} req/s)"
        )
    elif base_metrics:
        result += f" (vLLM's defaults: {fmt.num(stat(base_metrics, 'goodput'))} req/s)"
    return f"For {where}: {setting}. {result}."


def _config_table(config: dict[str, Any], baseline: dict[str, Any]) -> str:
    rows = []
    for key in _config_keys(config, baseline):
        ours, theirs = config.get(key), baseline.get(key)
        css = "changed" if baseline and ours != theirs else ""
        rows.append([key, Cell(fmt.text(ours), css=css), fmt.text(theirs) if baseline else "n/a"])
    return table(["parameter", "recommended", "vLLM defaults (baseline)"], rows, css="config")


def _slo_cell(value: float | None, target: float | None) -> Cell:
    css = ""
    if value is not None and target is not None:
        css = "met" if value <= target else "missed"
    return Cell(fmt.ms(value), css=css)


def metrics_table(runs: list[tuple[str, dict[str, Any]]], slo: dict[str, float]) -> str:
    """Latency percentiles against the SLO lines, attainment, goodput, throughput."""
    rows: list[list[Cell | str]] = []
    for metric, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms")):
        target = slo.get(key.removesuffix("_ms"))
        for p in _PERCENTILES:
            cells = [_slo_cell(stat(s, key, p), target) for _, s in runs]
            rows.append([f"{metric} {p}", fmt.ms(target) if target else "—", *cells])
    scalars = (
        ("SLO attainment", "slo_attainment", fmt.pct),
        ("goodput (req/s)", "goodput", fmt.num),
        ("request throughput (req/s)", "request_throughput", fmt.num),
        ("output throughput (tok/s)", "output_throughput", fmt.num),
        ("preemptions", "num_preemptions", fmt.num),
        ("prefix-cache hit rate", "prefix_cache_hit_rate", fmt.pct),
        ("completed / failed", None, None),
    )
    for label, key, show in scalars:
        if key is None:
            cells = [
                f"{fmt.num(stat(s, 'completed'))} / {fmt.num(stat(s, 'failed'))}" for _, s in runs
            ]
        else:
            cells = [show(stat(s, key)) for _, s in runs]
        rows.append([label, "—", *cells])
    return table(["metric", "SLO", *[label for label, _ in runs]], rows, css="metrics")


def recommendation_html(best: dict[str, Any], slo: dict[str, float]) -> str:
    config = section(best, "config")
    base = section(best, "baseline")
    runs = [("recommended", section(best, "metrics"))]
    if section(base, "metrics"):
        runs.append(("vLLM defaults (baseline)", section(base, "metrics")))
    commands = section(best, "commands")
    return (
        f'<p class="lead" id="recommendation-text">{e(recommendation_sentence(best))}</p>'
        '<div class="grid">'
        f"<div><h3>Configuration</h3>{_config_table(config, section(base, 'config'))}</div>"
        f"<div><h3>Latency against the SLO</h3>{metrics_table(runs, slo)}</div></div>"
        "<h3>Run it</h3>"
        + command_block("vllm", "vLLM", commands.get("vllm"))
        + command_block("sglang", "SGLang", commands.get("sglang"))
    )


def diagnostics_html(diagnostics: list[Diagnostic]) -> str:
    items = []
    for d in diagnostics:
        css = {True: "triggered", False: "ok", None: "na"}[d.triggered]
        mark = {True: "⚠", False: "✓", None: "–"}[d.triggered]
        items.append(
            f'<li class="{css}" data-diagnostic="{e(d.key)}">{mark} <strong>{e(d.title)}.</strong> '
            f"{e(d.message)}</li>"
        )
    return f'<ul class="diagnostics">{"".join(items)}</ul>'


def _value_cell(value: Any, digits: int = 4) -> Cell:
    if fmt.is_number(value):
        return Cell(f"{value:.{digits}g}" if isinstance(value, float) else str(value), sort=value)
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return Cell("n/a", sort="")
    return Cell(str(value))


def trials_table_html(trials: TrialsData) -> str:
    frame = trials.frame.sort_values("number") if len(trials.frame) else trials.frame
    if frame.empty:
        return note("No trials were stored.")
    metrics = [m for m in TABLE_METRICS if m in frame]
    headers = ["trial", "state", "feasible", *trials.objective_names, *trials.param_names, *metrics]
    rows = []
    for _, row in frame.iterrows():
        feasible = bool(row["feasible"])
        state = row["state"]
        status = "yes" if feasible else "no"
        css = "" if feasible and state == "COMPLETE" else "infeasible"
        cells = [
            _value_cell(int(row["number"])),
            Cell(str(state), css=css),
            Cell(status if state == "COMPLETE" else "—", css=css),
        ]
        cells += [_value_cell(row.get(c)) for c in trials.value_columns]
        cells += [_value_cell(row.get(f"params_{p}")) for p in trials.param_names]
        cells += [_value_cell(row.get(m)) for m in metrics]
        rows.append(cells)
    caption = (
        f"{len(frame)} trials ({int((frame['state'] == 'COMPLETE').sum())} completed) from "
        f"{trials.source}. Click a column header to sort."
    )
    return (
        note(caption)
        + '<div class="tablewrap">'
        + table(headers, rows, sortable=True, table_id="trials-table")
        + "</div>"
    )


def provenance_items(
    best: dict[str, Any], report_version: str, n_trials: int
) -> list[tuple[str, str]]:
    trace = section(best, "trace")
    stats = section(trace, "stats")
    stats_text = ", ".join(f"{k}={fmt.text(v)}" for k, v in stats.items()) or "n/a"
    return [
        ("slotune version (run)", fmt.text(best.get("slotune_version"))),
        ("slotune version (report)", report_version),
        ("GPU", fmt.text(best.get("gpu"))),
        ("model", fmt.text(best.get("model"))),
        ("tensor parallel", fmt.text(best.get("tp"))),
        ("trace", fmt.text(trace.get("name"))),
        ("trace statistics", stats_text),
        ("SLO", fmt.text(slo_text(best))),
        ("objective", fmt.text(best.get("objective"))),
        ("objective value", fmt.text(best.get("objective_value"))),
        ("sampler", fmt.text(best.get("sampler"))),
        ("seed", fmt.text(best.get("seed"))),
        ("study", fmt.text(best.get("study_name"))),
        ("trials", str(n_trials)),
        ("date", fmt.text(best.get("date"))),
    ]


def provenance_html(items: list[tuple[str, str]]) -> str:
    return definition_list(items)
