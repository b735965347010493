"""``report.html`` of a deployment study (``slotune deploy --out``), from its stored
``deployment.json`` only: the chosen deployment against the best single instance, goodput
per GPU over the trials, per-instance utilization, the router's decisions, KV transfer
times and where the SLO was lost. Every chart has one sentence; a chart with nothing to
show is that sentence alone (``data-empty``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from slotune._version import __version__
from slotune.reports import fmt
from slotune.reports.html import Cell, definition_list, e, figure_block, page, section, table
from slotune.reports.runs import read_json
from slotune.reports.style import (
    BEST_LINE,
    DECODE,
    FEASIBLE,
    INFEASIBLE,
    PREFILL,
    RECOMMENDED,
    finish,
    run_color,
)

DEPLOYMENT_JSON = "deployment.json"
REPORT_NAME = "report.html"
ROLE_COLORS = {"mixed": FEASIBLE, "prefill": PREFILL, "decode": DECODE}
LOSS_KEYS = ("ttft", "tpot", "e2e", "failed")
Chart = tuple[go.Figure | None, str]


def _block(key: str, chart: Chart) -> str:
    fig, sentence = chart
    if fig is None:
        return f'<p class="note" data-empty="{e(key)}">{e(sentence)}</p>'
    return f'{figure_block(key, fig)}\n<p class="caption" data-caption="{e(key)}">{e(sentence)}</p>'


def comparison_html(data: dict[str, Any]) -> str:
    """The chosen deployment beside the best single instance, and the verdict."""
    best, single = data["best"], data.get("single_instance")
    cols = [("chosen deployment", best)] + ([("best single instance", single)] if single else [])
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("deployment", lambda r: fmt.text(r.get("deployment"))),
        ("GPUs", lambda r: fmt.num(r.get("gpus"))),
        ("goodput / GPU (req/s)", lambda r: fmt.sig(r.get("goodput_per_gpu"))),
        ("goodput (req/s)", lambda r: fmt.sig(r.get("goodput"))),
        ("SLO attainment", lambda r: fmt.pct(r.get("slo_attainment"))),
        ("meets the attainment target", lambda r: "yes" if r.get("feasible") else "no"),
        ("TTFT p99", lambda r: fmt.ms(r.get("ttft_p99_ms"))),
        ("TPOT p99", lambda r: fmt.ms(r.get("tpot_p99_ms"))),
    ]
    body = [[Cell(label), *(Cell(get(r), css="wrap") for _, r in cols)] for label, get in rows]
    kinds = [
        [
            i.get("kind") or f"{i['role']} TP{i['tp']}",  # deployment.json before EP
            fmt.num(i["count"]),
            fmt.num(i["max_num_batched_tokens"]),
            fmt.num(i["max_num_seqs"]),
        ]
        for i in best.get("instances", [])
    ]
    return (
        f'<p class="lead" id="deploy-verdict">{e(verdict(data))}</p>'
        + table(["", *(name for name, _ in cols)], body, css="metrics", table_id="comparison")
        + "<h3>Instance kinds of the chosen deployment</h3>"
        + table(
            ["kind", "count", "max_num_batched_tokens", "max_num_seqs"], kinds, table_id="kinds"
        )
    )


def verdict(data: dict[str, Any]) -> str:
    best, single = data["best"], data.get("single_instance")
    head = (
        f"Chosen: {best['deployment']}, {fmt.sig(best['goodput_per_gpu'])} req/s per GPU "
        f"({fmt.pct(best['slo_attainment'])} of requests within the SLO)"
    )
    if not best.get("feasible"):
        head += "; no deployment tried reached the attainment target"
    if single is None:
        return head + "; no single instance was tried for comparison."
    ratio = (
        best["goodput_per_gpu"] / single["goodput_per_gpu"]
        if single.get("feasible") and single["goodput_per_gpu"] > 0
        else None
    )
    against = (
        f"{fmt.sig(ratio, 3)}× the best single instance's {fmt.sig(single['goodput_per_gpu'])}"
        if ratio is not None
        else f"the best single instance ({single['deployment']}) misses the attainment "
        f"target at {fmt.pct(single['slo_attainment'])}"
    )
    return f"{head}: {against}."


def goodput_chart(data: dict[str, Any]) -> Chart:
    """Goodput per GPU of every deployment tried, best first; the chosen one and the best
    single instance marked."""
    trials = sorted(data.get("trials", []), key=lambda t: -t["goodput_per_gpu"])
    best, single = data["best"], data.get("single_instance")
    if not trials:
        return None, "No trial was stored."
    names = [f"#{k + 1} {t['deployment']}" for k, t in enumerate(trials)]
    colors = []
    for t in trials:
        if t.get("chosen"):
            colors.append(RECOMMENDED)
        elif t.get("single"):
            colors.append(BEST_LINE)
        else:
            colors.append(FEASIBLE if t.get("feasible") else INFEASIBLE)
    fig = go.Figure(
        go.Bar(
            x=names,
            y=[t["goodput_per_gpu"] for t in trials],
            marker_color=colors,
            customdata=[[fmt.pct(t["slo_attainment"]), t.get("gpus")] for t in trials],
            hovertemplate="%{x}<br>%{y:.3g} req/s per GPU<br>attainment %{customdata[0]}"
            ", %{customdata[1]} GPUs<extra></extra>",
            name="goodput / GPU",
        )
    )
    if single is not None:
        fig.add_hline(
            y=single["goodput_per_gpu"],
            line_dash="dot",
            line_color=BEST_LINE,
            annotation_text="best single instance",
        )
    fig.update_xaxes(showticklabels=False, title_text="deployments tried (best first)")
    fig.update_yaxes(title_text="goodput per GPU (req/s)", rangemode="tozero")
    feasible = sum(bool(t.get("feasible")) for t in trials)
    sentence = (
        f"{feasible} of {len(trials)} deployments tried reach the attainment target (blue; "
        f"grey ones miss it); the chosen one (yellow; red: the best single instance) serves "
        f"{fmt.sig(best['goodput_per_gpu'])} req/s per GPU"
        + (
            f", the best single instance {fmt.sig(single['goodput_per_gpu'])} (dotted line)."
            if single is not None
            else "."
        )
    )
    return finish(fig, "Goodput per GPU of every deployment tried"), sentence


def utilization_chart(best: dict[str, Any]) -> Chart:
    util = best.get("utilization") or []
    if not util:
        return None, "The chosen deployment's run was not kept: no per-instance utilization."
    fig = go.Figure()
    for role in ROLE_COLORS:
        rows = [u for u in util if u["role"] == role]
        if rows:
            fig.add_trace(
                go.Bar(
                    x=[f"#{u['instance']} {u.get('kind', u['role'])}" for u in rows],
                    y=[u["busy_share"] for u in rows],
                    name=role,
                    marker_color=ROLE_COLORS[role],
                    customdata=[[u["steps"]] for u in rows],
                    hovertemplate="%{x}: busy %{y:.1%} of the run, %{customdata[0]} steps"
                    "<extra></extra>",
                )
            )
    fig.update_yaxes(title_text="share of the run busy", tickformat=".0%", rangemode="tozero")
    parts = []
    for role in ROLE_COLORS:
        shares = [u["busy_share"] for u in util if u["role"] == role]
        if shares:
            parts.append(
                f"{role} instances busy {fmt.pct(min(shares), 0)}–{fmt.pct(max(shares), 0)}"
                if len(shares) > 1
                else f"the {role} instance busy {fmt.pct(shares[0], 0)}"
            )
    sentence = "Over the run, " + ", ".join(parts) + " of the time (steps running on its GPUs)."
    return finish(fig, "Per-instance utilization: share of the run with a step running"), sentence


def routing_chart(best: dict[str, Any]) -> Chart:
    util = best.get("utilization") or []
    front = [u for u in util if u["role"] != "decode"]
    policy = best["router"]["policy"]
    if not util:
        return None, "The chosen deployment's run was not kept: no routing decisions."
    if len(util) == 1:
        return None, (
            f"One instance: all {fmt.num(util[0]['requests'])} requests go to it; "
            "the router makes no choice."
        )
    fig = go.Figure(
        go.Bar(
            x=[f"#{u['instance']} {u.get('kind', u['role'])}" for u in util],
            y=[u["requests"] for u in util],
            marker_color=[ROLE_COLORS[u["role"]] for u in util],
            hovertemplate="%{x}: %{y} requests<extra></extra>",
            name="requests",
        )
    )
    fig.update_yaxes(title_text="requests routed to it", rangemode="tozero")
    counts = [u["requests"] for u in front]
    sentence = f"The {policy} router sent {fmt.num(min(counts))}–{fmt.num(max(counts))} requests"
    sentence += f" to each of the {len(front)} " + (
        "prefill instances" if best.get("link") else "replicas"
    )
    share = best.get("prefix_hit_share")
    if policy == "prefix-aware" and share is not None:
        sentence += (
            f"; {fmt.pct(share)} of its decisions followed a cached prefix, the rest the load"
        )
    if best.get("link"):
        sentence += "; decode instances are chosen by least outstanding requests"
    return finish(fig, "Router decisions: requests per instance"), sentence + "."


def kv_chart(best: dict[str, Any]) -> Chart:
    kv = best.get("kv_transfers")
    if best.get("link") is None:
        return None, "Co-located replicas: no KV cache crosses a link."
    if not kv:
        return None, "No prompt finished its prefill: no KV transfer happened."
    fig = go.Figure(go.Histogram(x=kv["ms"], marker_color=PREFILL, name="transfers", nbinsx=40))
    fig.update_xaxes(title_text="KV transfer time (ms)")
    fig.update_yaxes(title_text="transfers")
    sentence = (
        f"{fmt.num(kv['count'])} prompts moved {fmt.sig(kv['gib'], 3)} GiB of KV cache over "
        f"{best['link']['name']} in {fmt.sig(kv['mean_ms'], 3)} ms on average "
        f"(p99 {fmt.sig(kv['p99_ms'], 3)} ms), part of every such request's TTFT."
    )
    return finish(fig, "KV transfer time per request (prefill to decode)"), sentence


def losses_chart(best: dict[str, Any]) -> Chart:
    by_kind: dict[str, dict[str, int]] = best.get("slo_lost_by_kind") or {}
    total = best.get("slo_lost") or {}
    if not by_kind:
        return None, "The chosen deployment's run was not kept: losses are not known."
    if not any(total.get(k) for k in LOSS_KEYS):
        return None, "No request missed a target of the SLO or failed."
    fig = go.Figure()
    kinds = list(by_kind)
    for k, key in enumerate(LOSS_KEYS):
        if any(by_kind[kind].get(key) for kind in kinds):
            fig.add_trace(
                go.Bar(
                    x=kinds,
                    y=[by_kind[kind].get(key, 0) for kind in kinds],
                    name=_loss_name(key),
                    marker_color=run_color(k),
                )
            )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="requests that missed it", rangemode="tozero")
    per = []
    for kind in kinds:
        items = [f"{v} {_loss_name(k)}" for k in LOSS_KEYS if (v := by_kind[kind].get(k))]
        if items:
            per.append(f"{kind}: {', '.join(items)}")
    sentence = (
        "Requests that missed a target, by the kind of instance that answered them (a "
        "request may miss several): " + "; ".join(per) + "."
    )
    return finish(fig, "Where the SLO was lost: misses per instance kind"), sentence


def _loss_name(key: str) -> str:
    return "failed" if key == "failed" else f"missed {key.upper()}"


def phases_chart(best: dict[str, Any]) -> Chart:
    ph = best.get("ttft_phases")
    if ph is None:
        return None, (
            "Co-located: no handoff between instances; a request's TTFT is its queue and "
            "prefill on the replica that answered it."
        )
    groups = ph["groups"]
    if not groups:
        return None, "No disaggregated request reached its first token."
    fig = go.Figure()
    names = list(groups)
    for k, phase in enumerate(ph["phases"]):
        fig.add_trace(
            go.Bar(
                y=[f"{g} ({groups[g]['count']})" for g in names],
                x=[groups[g]["mean_ms"][k] for g in names],
                name=phase,
                orientation="h",
                marker_color=(PREFILL, BEST_LINE, DECODE)[k],
                hovertemplate=f"{phase}: %{{x:.1f}} ms<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="mean time to first token, by phase (ms)")
    lost = ph["lost_in"]
    n = sum(lost.values())
    if n:
        where = ", ".join(f"{v} in {p}" for p, v in lost.items() if v)
        sentence = f"Of the {n} requests that missed TTFT, the longest phase was: {where}."
    else:
        sentence = "No request missed TTFT; the bar shows where their TTFT went."
    return finish(fig, "TTFT by phase: prefill instance, KV link, decode instance", 300), sentence


def deploy_html(data: dict[str, Any]) -> list[str]:
    best = data["best"]
    return [
        section(
            "chosen", "Chosen deployment against the best single instance", comparison_html(data)
        ),
        section("goodput", "Goodput per GPU", _block("goodput", goodput_chart(data))),
        section(
            "utilization",
            "Per-instance utilization",
            _block("utilization", utilization_chart(best)),
        ),
        section("routing", "Router decisions", _block("routing", routing_chart(best))),
        section("kv", "KV transfer", _block("kv", kv_chart(best))),
        section(
            "slo-lost",
            "Where the SLO was lost",
            _block("losses", losses_chart(best)) + "\n" + _block("phases", phases_chart(best)),
        ),
        section("provenance", "Provenance", definition_list(_provenance(data))),
    ]


def _provenance(data: dict[str, Any]) -> list[tuple[str, str]]:
    study = data.get("study") or {}
    return [
        ("slotune", __version__),
        *((k, fmt.text(v)) for k, v in study.items()),
        ("deployments tried", fmt.num(len(data.get("trials", [])))),
        ("search time", f"{fmt.num(data.get('search_seconds'), 1)} s"),
    ]


def build_deploy_report(out_dir: Path | str, output: Path | str | None = None) -> Path:
    """Write ``report.html`` for a ``slotune deploy --out`` folder and return its path."""
    out_dir = Path(out_dir)
    if not (out_dir / DEPLOYMENT_JSON).is_file():
        raise FileNotFoundError(
            f"{out_dir}: no {DEPLOYMENT_JSON}; expected the --out folder of `slotune deploy`"
        )
    data = read_json(out_dir / DEPLOYMENT_JSON)
    if not isinstance(data.get("best"), dict):
        raise ValueError(f"{out_dir / DEPLOYMENT_JSON}: unreadable, or without a 'best' deployment")
    study = data.get("study") or {}
    subtitle = (
        f"{fmt.text(study.get('model'))} on up to {fmt.text(study.get('gpus'))} × "
        f"{fmt.text(study.get('gpu'))} · SLO {fmt.text(study.get('slo'))} · "
        f"{fmt.text(study.get('rate'))} req/s of {fmt.text(study.get('trace'))}"
    )
    path = Path(output) if output is not None else out_dir / REPORT_NAME
    path.write_text(page("slotune deployment report", subtitle, deploy_html(data)), "utf-8")
    return path
