"""``slotune deploy``: how to spend N GPUs on a trace: replicas and TP, co-located or
prefill/decode apart, the router and each instance kind's flags, under an SLO."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from rich.console import Console
from rich.table import Table

from slotune.cli import trace_options as to
from slotune.cli.app import app
from slotune.cli.common import fail, opt

_console = Console()


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        fail(f"{flag}: {text!r} is not a comma-separated list of integers (e.g. 1,2,4,8)")
    if not values or min(values) < 1:
        fail(f"{flag}: needs at least one size >= 1 (got {text!r})")
    return values


def _names(text: str, flag: str, known: tuple[str, ...]) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [v for v in values if v not in known]
    if bad or not values:
        fail(f"{flag}: {', '.join(bad) or 'nothing given'} — choose from {', '.join(known)}")
    return values


@app.command()
def deploy(
    slo: Annotated[str, opt("--slo", "Latency SLO: ttft=300ms,tpot=50ms or ttft:p90=300ms.")],
    rate: Annotated[float, opt("--rate", "Poisson request rate the deployment must serve.")],
    gpus: Annotated[int, opt("--gpus", "GPUs to spend (a deployment may use fewer).")] = 8,
    gpu: Annotated[str, opt("--gpu", "GPU (`slotune gpus`) or a profile JSON.")] = "h100",
    model: Annotated[str, opt("--model", "Model name (`slotune models`).")] = "llama-3-8b",
    stack: Annotated[str | None, opt("--stack", "Serving stack (default vllm-v1).")] = None,
    trace: to.TraceName = "sharegpt-like",
    format: to.TraceFormat = None,
    num_requests: to.NumRequests = None,
    attainment: Annotated[float, opt("--attainment", "Target share of requests in SLO.")] = 0.99,
    trials: Annotated[int, opt("--trials", "Deployments tried (Optuna TPE).")] = 30,
    single_trials: Annotated[
        int, opt("--single-trials", "More trials on one instance alone, for comparison.")
    ] = 8,
    tp: Annotated[str, opt("--tp", "Tensor-parallel sizes tried.")] = "1,2,4,8",
    pp: Annotated[str, opt("--pp", "Pipeline-parallel sizes tried (co-located replicas).")] = "1",
    modes: Annotated[str, opt("--modes", "co-located,disaggregated.")] = "co-located,disaggregated",
    routers: Annotated[
        str, opt("--routers", "Routers tried.")
    ] = "round-robin,least-outstanding,least-kv,prefix-aware",
    link: Annotated[str, opt("--link", "KV link of disaggregation: nvlink | rdma | tcp.")] = "rdma",
    expert_parallel: Annotated[
        bool,
        opt(
            "--ep/--no-ep",
            "Search expert parallelism per instance kind (MoE models; the sizes --engine runs).",
        ),
    ] = True,
    engine: Annotated[str, opt("--engine", "Export for: vllm | sglang.")] = "vllm",
    timeout: Annotated[float | None, opt("--timeout", "Client timeout per request (s).")] = None,
    seed: Annotated[int, opt("--seed", "Seed of the arrivals and the sampler.")] = 0,
    out: Annotated[
        Path | None,
        opt(
            "--out",
            "Write deployment.json, launch.sh, k8s.yaml (Kubernetes) and report.html here.",
        ),
    ] = None,
) -> None:
    """Search deployments of N GPUs (replicas × TP (× EP for MoE) × co-located or P/D ×
    P:D ratio × router, with each instance kind's flags) for goodput per GPU under the
    SLO, and compare the best with the best single instance (`slotune tune --gpus N`
    runs this search too)."""
    from slotune.cluster.export import ENGINES
    from slotune.cluster.search import MODES, DeploySpace, search
    from slotune.cluster.spec import ROUTERS, get_link
    from slotune.workloads import parse_slo
    from slotune.workloads.arrivals import ArrivalSpec

    if engine not in ENGINES:
        fail(f"--engine: {engine!r} — choose from {', '.join(ENGINES)}")
    if not rate > 0:
        fail(f"--rate: must be > 0 requests/s (got {rate})")
    if not 0 < attainment <= 1:
        fail(f"--attainment: must be in (0, 1] (got {attainment})")
    if trials < 1 or single_trials < 0:
        fail("--trials must be >= 1 and --single-trials >= 0")
    loaded = to.load_trace_or_fail(trace, format, num_requests, None, seed, False, "--trace")
    try:
        slo_spec = parse_slo(slo)
        space = DeploySpace(
            gpus,
            gpu,
            model,
            stack,
            _base_config(engine, gpu, loaded),
            _ints(tp, "--tp"),
            _ints(pp, "--pp"),
            _names(modes, "--modes", MODES),
            _names(routers, "--routers", ROUTERS),
            get_link(link),
            engine,
            expert_parallel,
        )
    except ValueError as exc:
        fail(str(exc))
    with _console.status("Searching deployments...") as status:

        def progress(k: int, s: Any) -> None:
            status.update(f"Searching deployments... {k}/{trials} (best so far at {s.per_gpu:.3g})")

        try:
            study = search(
                space,
                loaded,
                ArrivalSpec(rate=rate),
                slo_spec,
                trials=trials,
                single_trials=single_trials,
                seed=seed,
                timeout_s=timeout,
                target=attainment,
                progress=progress,
            )
        except ValueError as exc:
            fail(str(exc))
    _print_study(study, slo_spec, gpus, rate)
    if out is not None:
        from slotune.reports.deploy import build_deploy_report
        from slotune.targets import ExportRefused

        about = {"gpus": gpus, "gpu": gpu, "model": model, "trace": trace, "rate": rate}
        about |= {"slo": slo, "attainment": attainment, "engine": engine, "seed": seed}
        try:
            _write(out, study, slo_spec, engine, about)
        except ExportRefused as exc:
            fail(f"--engine {engine}: {exc}")
        report = build_deploy_report(out)
        _console.print(f"Wrote {out}/deployment.json, launch.sh, k8s.yaml, {report.name}")


def _base_config(engine: str, gpu: str, trace: Any) -> Any:
    """What every instance runs besides the searched budget and sequences: the export
    engine's own defaults on the GPU, so the deployment simulated is the one exported."""
    from slotune.engine.sim.hardware import get_gpu
    from slotune.targets import get_target
    from slotune.workloads import default_max_model_len

    return get_target(engine).defaults(get_gpu(gpu), max_model_len=default_max_model_len(trace))


def _print_study(study: Any, slo: Any, gpus: int, rate: float) -> None:
    from slotune.cluster.report import run_report

    best = run_report(study.best, slo)
    single = run_report(study.single, slo) if study.single is not None else None
    _console.print(
        f"{len(study.trials)} deployments of up to {gpus} GPUs at {rate:g} req/s in "
        f"{study.seconds:.1f} s ({study.runs} runs)."
    )
    table = Table(title="Best deployment against the best single instance")
    table.add_column("")
    table.add_column("deployment")
    if single is not None:
        table.add_column("single instance")
    rows = [
        ("what", "deployment"),
        ("goodput / GPU (req/s)", "goodput_per_gpu"),
        ("goodput (req/s)", "goodput"),
        ("SLO attainment", "slo_attainment"),
        ("TTFT p99 (ms)", "ttft_p99_ms"),
        ("TPOT p99 (ms)", "tpot_p99_ms"),
        ("SLO lost (requests)", "slo_lost"),
    ]
    for label, key in rows:
        cells = [_fmt(best.get(key))]
        if single is not None:
            cells.append(_fmt(single.get(key)))
        table.add_row(label, *cells)
    _console.print(table)
    inst = Table(title="Instances of the best deployment")
    for col in ("kind", "count", "TP", "PP", "EP", "max_num_batched_tokens", "max_num_seqs"):
        inst.add_column(col)
    for i in best["instances"]:
        inst.add_row(
            i["role"],
            str(i["count"]),
            str(i["tp"]),
            str(i["pp"]),
            str(i["ep"]),
            str(i["max_num_batched_tokens"]),
            str(i["max_num_seqs"]),
        )
    _console.print(inst)
    util = ", ".join(
        f"#{u['instance']} {u['role']} {u['busy_share']:.0%} ({u['requests']} req)"
        for u in best.get("utilization", [])
    )
    _console.print(f"Busy share per instance: {util}")
    _console.print(f"Router: {best['router']}; decisions: {best.get('router_decisions')}")
    for index, lost in best.get("slo_lost_by_instance", {}).items():
        _console.print(f"SLO lost on instance #{index}: {_fmt(lost)}")
    if "kv_transfers" in best:
        kv = best["kv_transfers"]
        _console.print(
            f"KV transfers: {kv['count']} ({kv['gib']:.1f} GiB), mean {kv['mean_ms']:.1f} ms, "
            f"p99 {kv['p99_ms']:.1f} ms over {best['link']['name']}"
        )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in v.items())
    return "-" if v is None else str(v)


def _write(out: Path, study: Any, slo: Any, engine: str, about: dict[str, Any]) -> None:
    from slotune.cluster.export import launch_lines, manifests_yaml, router_command
    from slotune.cluster.report import study_report

    out.mkdir(parents=True, exist_ok=True)
    spec = study.best.spec
    data = study_report(study, slo, about)
    (out / "deployment.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    lines = ["#!/bin/sh", f"# slotune deploy: {data['best']['deployment']}"]
    for name, line in launch_lines(spec, engine).items():
        lines += ["", f"# instance kind {name}", line]
    lines += ["", "# router", router_command(spec)]
    (out / "launch.sh").write_text("\n".join(lines) + "\n")
    (out / "k8s.yaml").write_text(manifests_yaml(spec, engine))
