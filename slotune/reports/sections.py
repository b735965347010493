"""The text sections of a report: recommendation, diagnostics, trials table, provenance."""

from __future__ import annotations

from typing import Any

import pandas as pd

from slotune.reports import fmt
from slotune.reports.best import CONFIG_FIELDS, section, slo_text
from slotune.reports.diagnostics import Diagnostic
from slotune.reports.html import Cell, command_block, definition_list, e, note, table
from slotune.reports.trials import STEADY, TABLE_METRICS, TrialsData

_PERCENTILES = ("p50", "p90", "p99")


def stat(summary: dict[str, Any], metric: str, name: str | None = None) -> float | None:
    """``summary[metric][name]`` (or ``summary[metric]``) when it is a finite number."""
    value = summary.get(metric)
    if name is not None:
        value = value.get(name) if isinstance(value, dict) else None
    return float(value) if fmt.is_number(value) else None


def goodput_gain(
    best: dict[str, Any], baseline: dict[str, Any], key: str = "goodput"
) -> float | None:
    """Relative gain of ``best[key]`` over ``baseline[key]`` (0.25 means 25% more)."""
    ours, theirs = stat(best, key), stat(baseline, key)
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


def _setting(config: dict[str, Any], base_config: dict[str, Any]) -> str:
    changed = _changed(config, base_config)
    if not config:
        return "no configuration was stored"
    if changed:
        return "set " + ", ".join(f"{k}={config.get(k)}" for k in changed)
    return "keep vLLM's defaults"


def _gain_clause(best: dict[str, Any], base: dict[str, Any]) -> str:
    """The gain over vLLM's defaults, on the tuner's max SLO-meeting rate when both runs
    have one (``goodput_rps``), else on goodput at the test load."""
    metrics, base_metrics = section(best, "metrics"), section(base, "metrics")
    rps_gain = goodput_gain(best, base, "goodput_rps")
    if rps_gain is not None:
        return (
            f"; it sustains up to {fmt.num(stat(best, 'goodput_rps'))} req/s within the SLO, "
            f"{fmt.signed_pct(rps_gain)} over vLLM's defaults "
            f"({fmt.num(stat(base, 'goodput_rps'))} req/s)"
        )
    gain = goodput_gain(metrics, base_metrics)
    if gain is not None:
        return (
            f", {fmt.signed_pct(gain)} over vLLM's defaults "
            f"({fmt.num(stat(base_metrics, 'goodput'))} req/s)"
        )
    if base_metrics:
        return f" (vLLM's defaults: {fmt.num(stat(base_metrics, 'goodput'))} req/s)"
    return ""


def _score_clause(best: dict[str, Any], base: dict[str, Any]) -> str:
    ours, theirs = stat(best, "score"), stat(base, "score")
    if best.get("objective") != "weighted" or ours is None:
        return ""
    clause = f" Its weighted SLO score is {ours:.3f} (lower is better)"
    if theirs:
        clause += f", {fmt.signed_pct(ours / theirs - 1)} against vLLM's defaults ({theirs:.3f})"
    return clause + "."


def recommendation_sentence(best: dict[str, Any]) -> str:
    """The recommendation in one paragraph, every number taken from ``best.json``."""
    metrics = section(best, "metrics")
    base = section(best, "baseline")
    trace = section(best, "trace").get("name")
    where = (
        f"{fmt.text(best.get('model'))} on {fmt.text(best.get('gpu'))} "
        f"(TP {fmt.text(best.get('tp'))}), trace {fmt.text(trace)}"
    )
    load = section(best, "load").get("description")
    if load:
        where += f", {load}"
    setting = _setting(section(best, "config"), section(base, "config"))
    result = (
        f"It meets the SLO ({fmt.text(slo_text(best))}) for "
        f"{fmt.pct(stat(metrics, 'slo_attainment'))} of requests, a goodput of "
        f"{fmt.num(stat(metrics, 'goodput'))} req/s at the test load"
    )
    stored = best.get("headline")
    if isinstance(stored, str) and stored:  # noise-checked, with what drives the gain
        return f"For {where}: {stored} {result}."
    return f"For {where}: {setting}. {result}{_gain_clause(best, base)}.{_score_clause(best, base)}"


def baseline_label(best: dict[str, Any]) -> str:
    """The baseline's name: the target's defaults ("vLLM 0.34 defaults", "SGLang 0.5.23
    defaults"), or vLLM's for a best.json from before targets."""
    name = section(best, "baseline").get("name")
    if isinstance(name, str) and name:
        return name.replace(" serving defaults", " defaults")
    return "vLLM defaults"


def _config_table(
    config: dict[str, Any], baseline: dict[str, Any], label: str = "vLLM defaults"
) -> str:
    rows: list[list[Cell | str]] = []
    for key in _config_keys(config, baseline):
        ours, theirs = config.get(key), baseline.get(key)
        css = "changed" if baseline and ours != theirs else ""
        rows.append([key, Cell(fmt.text(ours), css=css), fmt.text(theirs) if baseline else "n/a"])
    return table(["parameter", "recommended", f"{label} (baseline)"], rows, css="config")


def _slo_cell(value: float | None, target: float | None) -> Cell:
    css = ""
    if value is not None and target is not None:
        css = "met" if value <= target else "missed"
    return Cell(fmt.ms(value), css=css)


def metrics_table(runs: list[tuple[str, dict[str, Any]]], slo: dict[str, float]) -> str:
    """Latency percentiles against the SLO lines, attainment, goodput, throughput."""
    rows: list[list[Cell | str]] = []
    latencies = [("TTFT", "ttft_ms", "ttft"), ("TPOT", "tpot_ms", "tpot"), ("ITL", "itl_ms", "itl")]
    if "e2e" in slo:
        latencies.append(("E2E", "e2el_ms", "e2e"))
    for metric, key, slo_key in latencies:
        target = slo.get(slo_key)
        for p in _PERCENTILES:
            cells = [_slo_cell(stat(s, key, p), target) for _, s in runs]
            rows.append([f"{metric} {p}", fmt.ms(target) if target else "—", *cells])
    scalars = (
        ("SLO attainment", "slo_attainment", fmt.pct),
        ("goodput at the test load (req/s)", "goodput", fmt.num),
        ("max rate within SLO (req/s)", "goodput_rps", fmt.num),
        ("weighted score (lower is better)", "score", _score),
        ("request throughput (req/s)", "request_throughput", fmt.num),
        ("output throughput (tok/s)", "output_throughput", fmt.num),
        ("preemptions", "num_preemptions", fmt.num),
        ("prefix-cache hit rate", "prefix_cache_hit_rate", fmt.pct),
    )
    for label, key, show in scalars:
        if key in ("goodput_rps", "score") and all(stat(s, key) is None for _, s in runs):
            continue
        rows.append([label, "—", *[show(stat(s, key)) for _, s in runs]])
    rows += _policy_rows(runs, slo)
    completed = [f"{fmt.num(stat(s, 'completed'))} / {fmt.num(stat(s, 'failed'))}" for _, s in runs]
    rows.append(["completed / failed", "—", *completed])
    rows.append(["of which timed out", "—", *[fmt.num(timeouts(s)) for _, s in runs]])
    windows = [Cell(window_text(s), css="wrap") for _, s in runs]  # long: may wrap
    rows.append(["scoring window", "—", *windows])
    rows.append(["steady state reached", "—", *[steady_cell(s) for _, s in runs]])
    return table(["metric", "SLO", *[label for label, _ in runs]], rows, css="metrics")


def _policy_rows(
    runs: list[tuple[str, dict[str, Any]]], slo: dict[str, float]
) -> list[list[Cell | str]]:
    """The preemption mix (tokens recomputed vs swapped) and each service tier's
    attainment and p99 latencies, for the runs whose summaries have them."""
    rows: list[list[Cell | str]] = []
    if any("preemption_mix" in s for _, s in runs):
        for label, key in (("recomputed", "recomputed_tokens"), ("swapped", "swapped_tokens")):
            mix: list[Cell | str] = [
                fmt.num(stat(section(s, "preemption_mix"), key)) for _, s in runs
            ]
            rows.append([f"tokens {label} by preemption", "—", *mix])
    from slotune.workloads.slo import tier_name

    tiers = sorted({t for _, s in runs for t in section(s, "tiers")}, key=int)
    for tier in tiers:
        scores = [section(section(s, "tiers"), tier) for _, s in runs]
        own = next((str(t["slo"]) for t in scores if t.get("slo")), None)
        targets = _tier_targets(own) if own else slo  # the tier's own SLO (per-tier SLOs)
        name = f"tier {tier} ({tier_name(int(tier))})"
        rows.append(
            [
                f"{name}: SLO attainment",
                own or "—",
                *[fmt.pct(stat(t, "slo_attainment")) for t in scores],
            ]
        )
        for metric, key, slo_key in (("TTFT", "ttft_ms", "ttft"), ("TPOT", "tpot_ms", "tpot")):
            target = targets.get(slo_key)
            cells: list[Cell | str] = [_slo_cell(stat(t, key, "p99"), target) for t in scores]
            rows.append([f"{name}: {metric} p99", fmt.ms(target) if target else "—", *cells])
    return rows


def _tier_targets(text: str) -> dict[str, float]:
    """A tier's SLO (``ttft=200ms,tpot=30ms``) as metric -> ms."""
    from slotune.workloads.slo import parse_slo

    try:
        return {t.metric: t.threshold_ms for t in parse_slo(text).targets}
    except ValueError:
        return {}


def timeouts(summary: dict[str, Any]) -> int | None:
    """Requests the client gave up on (None when the summary says nothing of failures)."""
    if stat(summary, "failed") is None:
        return None
    from slotune.tuner.results import flat_metrics

    return flat_metrics(summary).get("timeouts")


def window_text(summary: dict[str, Any]) -> str:
    """The arrivals a run's scores count: ``10–27 s of arrivals, 1,234 requests``."""
    window = section(summary, "scoring_window")
    start, end = stat(window, "start_s"), stat(window, "end_s")
    if start is None or end is None:
        return "the whole run" if summary else fmt.NA
    requests = fmt.num(stat(window, "requests"))
    return f"{fmt.sig(start, 3)}–{fmt.sig(end, 3)} s of arrivals, {requests} requests"


def steady_cell(summary: dict[str, Any]) -> Cell:
    """The run's steady-state check: yes, no (requests in flight kept growing), or n/a."""
    steady = section(summary, "steady_state").get("steady")
    return _flag_cell(steady if isinstance(steady, bool) else None)


def _flag_cell(flag: bool | None) -> Cell:
    if flag is None:
        return Cell(fmt.NA, sort="")
    return Cell("yes" if flag else "no", css="met" if flag else "missed", sort=int(flag))


def _score(value: Any) -> str:
    return f"{value:.3f}" if fmt.is_number(value) else fmt.NA


def _with_tuner_figures(result: dict[str, Any]) -> dict[str, Any]:
    """A run's summary plus the tuner's per-configuration figures stored beside it."""
    extra: dict[str, Any] = {k: result[k] for k in ("goodput_rps", "score") if k in result}
    return {**section(result, "metrics"), **extra}


def _notes(best: dict[str, Any]) -> str:
    stored = best.get("notes")
    notes = [str(n) for n in stored] if isinstance(stored, list) else []
    for label, run in (("recommended", best), (baseline_label(best), section(best, "baseline"))):
        check = section(section(run, "metrics"), "steady_state")
        if check.get("steady") is False and check.get("note"):
            notes.append(f"{label} run not in steady state: {check['note']}")
    if not notes:
        return ""
    return '<ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>"


def recommendation_html(best: dict[str, Any], slo: dict[str, float]) -> str:
    config = section(best, "config")
    base = section(best, "baseline")
    runs = [("recommended", _with_tuner_figures(best))]
    if section(base, "metrics"):
        runs.append((f"{baseline_label(best)} (baseline)", _with_tuner_figures(base)))
    config_html = _config_table(config, section(base, "config"), baseline_label(best))
    commands = section(best, "commands")
    refused = best.get("export_refused")
    blocks = "".join(
        command_block(name.replace("=", "-"), name, cmd) for name, cmd in commands.items()
    )
    if refused:
        blocks += note(f"Export refused: {refused}")
    return (
        f'<p class="lead" id="recommendation-text">{e(recommendation_sentence(best))}</p>'
        + _notes(best)
        + '<div class="grid">'
        f"<div><h3>Configuration</h3>{config_html}</div>"
        f'<div class="wide"><h3>Latency against the SLO</h3>{metrics_table(runs, slo)}</div></div>'
        "<h3>Run it</h3>" + blocks
    )


def importance_note(importances: dict[str, float], best: dict[str, Any]) -> str:
    """Reconcile the importance chart with the recommendation: the top-ranked knob moves
    the objective most across trials, which is not the same as being worth changing."""
    if not importances:
        return ""
    top = max(importances, key=lambda k: importances[k])
    name = top.removesuffix("_on")
    config, base = section(best, "config"), section(section(best, "baseline"), "config")
    changed = [k for k in config if base and config.get(k) != base.get(k)]
    if name in changed:
        return f"{name} ranks first in importance; the recommendation changes it."
    kept = "keeps it at the default" if base else "keeps it"
    return (
        f"{name} ranks first in importance: it moves the objective most across the trials "
        f"(often by making it worse), while the recommendation {kept}"
        + (f" and changes {', '.join(changed)}." if changed else ".")
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
        return Cell(fmt.sig(value, digits) if isinstance(value, float) else str(value), sort=value)
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return Cell("n/a", sort="")
    return Cell(str(value))


def trials_table_html(trials: TrialsData) -> str:
    frame = trials.frame.sort_values("number") if len(trials.frame) else trials.frame
    if frame.empty:
        return note("No trials were stored.")
    metrics = [m for m in TABLE_METRICS if m in frame]
    steady = [STEADY] if STEADY in frame else []
    headers = [
        "trial",
        "state",
        "feasible",
        *trials.objective_names,
        *trials.param_names,
        *metrics,
        *steady,
    ]
    rows = []
    for _, row in frame.iterrows():
        feasible = bool(row["feasible"])
        state = row["state"]
        status = "yes" if feasible else "no"
        css = "" if feasible and state == "COMPLETE" else "infeasible"
        number = int(row["number"])
        chosen = number == trials.recommended
        cells = [
            Cell(
                f"{number} ★" if chosen else str(number),
                sort=number,
                css="chosen" if chosen else "",
            ),
            Cell(str(state), css=css),
            Cell(status if state == "COMPLETE" else "—", css=css),
        ]
        cells += [_value_cell(row.get(c)) for c in trials.value_columns]
        cells += [_value_cell(row.get(f"params_{p}")) for p in trials.param_names]
        cells += [_value_cell(row.get(m)) for m in metrics]
        if steady:
            flag = row.get(STEADY)
            cells.append(_flag_cell(flag if isinstance(flag, bool) else None))
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


def _compact(value: Any) -> str:
    """Nested statistics on one line: ``prompt_len(mean=243.3, p50=160)``."""
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k}={_compact(v)}" for k, v in value.items()) + ")"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_compact(v) for v in value) + "]"
    if isinstance(value, float) and fmt.is_number(value):
        return fmt.sig(value)
    return fmt.text(value)


def _stats_text(stats: dict[str, Any]) -> str:
    parts = [
        f"{k}{_compact(v)}" if isinstance(v, dict) else f"{k}={_compact(v)}"
        for k, v in stats.items()
        if k != "name"
    ]
    return ", ".join(parts) or fmt.NA


def provenance_items(
    best: dict[str, Any], report_version: str, n_trials: int, storage: str | None = None
) -> list[tuple[str, str]]:
    trace = section(best, "trace")
    objective = fmt.text(best.get("objective"))
    names = best.get("metric_names")
    if isinstance(names, list) and names:
        directions = best.get("directions") or []
        pairs = [f"{n} ({d})" for n, d in zip(names, directions, strict=False)]
        objective += f": {', '.join(pairs or map(str, names))}"
    return [
        ("slotune version (run)", fmt.text(best.get("slotune_version"))),
        ("slotune version (report)", report_version),
        ("GPU", fmt.text(best.get("gpu"))),
        ("model", fmt.text(best.get("model"))),
        ("tensor parallel", fmt.text(best.get("tp"))),
        ("backend", fmt.text(best.get("backend"))),
        ("trace", fmt.text(trace.get("name"))),
        ("trace statistics", _stats_text(section(trace, "stats"))),
        ("load", fmt.text(section(best, "load").get("description"))),
        ("scoring", scoring_text(best)),
        ("SLO", fmt.text(slo_text(best))),
        ("attainment target", fmt.pct(best.get("attainment_target"))),
        ("objective", objective),
        ("objective value", fmt.text(best.get("objective_value"))),
        ("score weights", _compact(best.get("weights")) if best.get("weights") else fmt.NA),
        ("sampler", fmt.text(best.get("sampler"))),
        ("seed", fmt.text(best.get("seed"))),
        ("study", fmt.text(best.get("study_name"))),
        ("storage", fmt.text(storage)),
        ("trials", str(n_trials)),
        ("recommended trial", fmt.text(best.get("trial"))),
        ("date", fmt.text(best.get("date"))),
    ]


def scoring_text(best: dict[str, Any]) -> str:
    """How runs were scored: their length, warm-up, cool-down and client timeout."""
    load, scoring = section(best, "load"), section(best, "scoring")
    duration = stat(load, "duration_s")
    parts = [f"each run {duration:g} s of arrivals" if duration else "each run a request burst"]
    warmup, cooldown = stat(scoring, "warmup_s"), stat(scoring, "cooldown_s")
    if warmup or cooldown:
        parts.append(
            f"scored after a {warmup or 0:g} s warm-up, before a {cooldown or 0:g} s cool-down"
        )
    timeout = stat(scoring, "request_timeout_s")
    parts.append(f"client timeout {timeout:g} s" if timeout else "no client timeout")
    return "; ".join(parts) if scoring or load else fmt.NA


def bench_summary_html(
    summary: dict[str, Any], config: dict[str, Any], slo: dict[str, float]
) -> str:
    config_rows = [[k, fmt.text(config.get(k))] for k in _config_keys(config, {})]
    config_html = (
        table(["parameter", "value"], config_rows, css="config")
        if config
        else note("No engine configuration (an HTTP target, or not stored).")
    )
    return (
        '<div class="grid">'
        f"<div><h3>Latency against the SLO</h3>{metrics_table([('run', summary)], slo)}</div>"
        f"<div><h3>Engine configuration</h3>{config_html}</div></div>"
    )


def bench_provenance_items(summary: dict[str, Any], report_version: str) -> list[tuple[str, str]]:
    trace = section(summary, "trace")
    return [
        ("slotune version (run)", fmt.text(summary.get("slotune_version"))),
        ("slotune version (report)", report_version),
        ("backend", fmt.text(summary.get("backend"))),
        ("GPU", fmt.text(summary.get("gpu"))),
        ("model", fmt.text(summary.get("model"))),
        ("tensor parallel", fmt.text(summary.get("tp"))),
        ("URL", fmt.text(summary.get("url"))),
        ("trace", fmt.text(trace.get("name"))),
        ("trace statistics", _stats_text(section(trace, "stats"))),
        ("arrivals", fmt.text(summary.get("arrivals"))),
        ("SLO", fmt.text(slo_text(summary))),
        ("seed", fmt.text(summary.get("seed"))),
        ("date", fmt.text(summary.get("date"))),
    ]


def provenance_html(items: list[tuple[str, str]]) -> str:
    return definition_list(items)
