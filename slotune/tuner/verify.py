"""``tune --verify``: measure the simulator's top configurations on the user's own server.

For each of the study's best ``top`` configurations and the baseline (the target's
defaults), start the server from the user's command line with that configuration's flags,
replay the study's trace at the load its report shows (``runs/``), ``repeats`` times, and
stop it. Each repeat starts with a cold prefix cache, as the simulation does: the server
drops it (``reset_prefix_cache``), or is restarted when it cannot. The measured runs rank
the candidates again with the study's own objective; the measured winner is the
recommendation, unless it does not beat the baseline beyond the spread of the repeats. The
runs are kept in ``slotune validate``'s layout, and a stack fitted to them (``calibrate
--from-runs``) lets the next study start from this server.

A candidate whose server does not start, or whose run fails, is a result too (its error
and the end of its log); the others go on.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotune.engine.config import EngineConfig
from slotune.tuner.evaluate import Evaluator, Measurement
from slotune.tuner.results import write_json, write_run
from slotune.tuner.setup import TuneSetup

if TYPE_CHECKING:
    from slotune.workloads.server_process import ServerProcess

Flags = Callable[[EngineConfig], list[str]]
VerifyLog = Callable[[str], None]
DEFAULTS = "defaults"


VERIFY_FLAGS = ("auto", "vllm", "sglang", "slotune")


def verify_problem(
    command: str, top: int, repeats: int, flags: str = "auto"
) -> tuple[str, str] | None:
    """What is wrong with verification options, as (``TuneOptions`` field, message)."""
    for mark in ("{flags}", "{port}"):
        if mark not in command:
            return "verify", f"the server command needs {mark} in it (got {command!r})"
    if top < 1:
        return "verify_top", f"must be at least 1 (got {top})"
    if repeats < 1:
        return "verify_repeats", f"must be at least 1 (got {repeats})"
    if flags not in VERIFY_FLAGS:
        return "verify_flags", f"{flags!r} is not one of {', '.join(VERIFY_FLAGS)}"
    return None


@dataclass(frozen=True)
class VerifyOptions:
    """``command``: the server's shell line, with ``{flags}`` (the configuration's engine
    flags) and ``{port}`` (a free port slotune picks) in it; ``flags``: whose flags."""

    command: str
    top: int = 5
    repeats: int = 1
    flags: str = "auto"
    start_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        problem = verify_problem(self.command, self.top, self.repeats, self.flags)
        if problem is not None:
            raise ValueError(f"{problem[0]}: {problem[1]}")

    def engine(self) -> str:
        """The engine whose flags fill ``{flags}``: as given, or read from the command."""
        if self.flags != "auto":
            return self.flags
        words = shlex.split(self.command)
        text = " ".join(words[:4])
        if "sglang" in text:
            return "sglang"
        if "slotune" in text:
            return "slotune"
        return "vllm"


@dataclass(frozen=True)
class Candidate:
    label: str  # "trial-12" or "defaults"
    config: dict[str, Any]
    trial: int | None = None


@dataclass
class Verified:
    """One candidate: what the simulator predicted and what each repeat measured."""

    label: str
    trial: int | None
    config: dict[str, Any]
    command: str
    predicted: dict[str, float | None]
    measured: list[dict[str, float | None]] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    error: str | None = None
    log: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.measured)

    def values(self, key: str) -> list[float]:
        return [v for m in self.measured if (v := m.get(key)) is not None]

    def mean(self, key: str) -> float | None:
        values = self.values(key)
        return sum(values) / len(values) if values else None

    def band(self, key: str) -> tuple[float, float] | None:
        values = self.values(key)
        return (min(values), max(values)) if values else None


@dataclass(frozen=True)
class VerifyOutcome:
    candidates: list[Verified]
    primary: str  # the measured quantity that ranks: "score" (lower wins) or "goodput"
    simulated_order: list[str]
    measured_order: list[str]
    rank_correlation: float | None  # Spearman, simulated vs measured order
    winner: str  # the recommendation after measuring
    winner_config: dict[str, Any]
    note: str
    out_dir: Path

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["out_dir"] = str(self.out_dir)
        return data


def metrics_of(m: Measurement) -> dict[str, float | None]:
    """The quantities a verification compares, from one run's measurement."""
    s = m.summary
    rate = m.rate or s.get("request_throughput") or 0.0
    return {
        "ttft_p50_ms": s["ttft_ms"].get("p50"),
        "ttft_p99_ms": s["ttft_ms"].get("p99"),
        "tpot_p50_ms": s["tpot_ms"].get("p50"),
        "tpot_p99_ms": s["tpot_ms"].get("p99"),
        "goodput": rate * m.attainment * m.sustained,
        "attainment": m.attainment,
        "score": m.score,
    }


def primary_metric(objective: str) -> str:
    """What ranks candidates at one load: the weighted score (lower wins) for a weighted
    study, the goodput at the report's rate (higher wins) otherwise."""
    return "score" if objective == "weighted" else "goodput"


def _order(values: dict[str, float | None], primary: str) -> list[str]:
    sign = 1.0 if primary == "score" else -1.0
    present = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
    return sorted(present, key=lambda k: (sign * present[k], k))


def spearman(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Spearman's rank correlation of two orders of the same labels (None under three)."""
    common = [x for x in a if x in b]
    if len(common) < 3:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr([a.index(x) for x in common], [b.index(x) for x in common]).statistic
    return float(rho)


def verify(
    candidates: Sequence[Candidate],
    *,
    evaluator: Evaluator,
    options: VerifyOptions,
    flags: Flags,
    rate: float | None,
    out_dir: Path,
    log: VerifyLog = lambda _: None,
) -> VerifyOutcome:
    """Measure every candidate on the server (see the module docstring) into ``out_dir``."""
    from slotune.workloads.backends import HttpBackend
    from slotune.workloads.server_process import (
        ServerProcess,
        ServerStartError,
        free_port,
        served_model,
    )

    setup = evaluator.setup
    primary = primary_metric(setup.objective)
    results: list[Verified] = []
    for c in candidates:
        config = EngineConfig.from_dict(c.config)
        predicted = metrics_of(evaluator.measure(config, rate))
        port = free_port()
        try:
            words = flags(config)
        except ValueError as exc:  # the target cannot run it (ExportRefused): a result too
            results.append(Verified(c.label, c.trial, c.config, "", predicted, error=str(exc)))
            continue
        command = options.command.replace("{flags}", shlex.join(words)).replace("{port}", str(port))
        v = Verified(c.label, c.trial, c.config, command, predicted)
        results.append(v)
        where = out_dir / c.label
        url = f"http://127.0.0.1:{port}"
        server = ServerProcess(
            command, url, log=where / "server.log", start_timeout_s=options.start_timeout_s
        )
        v.log = str(server.log)
        log(f"verify {c.label}: {command}")
        try:
            server.start()
        except ServerStartError as exc:
            v.error = f"server did not start: {exc}"
            log(f"verify {c.label}: {v.error}")
            continue
        try:
            backend = HttpBackend(url, served_model(url))
            for r in range(options.repeats):
                if r and config.prefix_caching != "none":
                    _cold_cache(server, log, c.label)
                result = evaluator.run(config, rate, backend=backend)
                summary = evaluator.summarize(result)
                measured = evaluator.measurement(summary, rate)
                run_dir = where / f"run-{r}"
                # what validate/calibrate need to replay an HTTP run, which cannot know them
                replay = {"model": setup.model, "gpu": setup.gpu, "tp": setup.tp, "backend": "http"}
                write_run(run_dir, result, {**summary, **replay}, c.config, rate, c.label)
                v.measured.append(metrics_of(measured))
                v.runs.append(str(run_dir))
        except Exception as exc:  # a failed candidate is a result; the others go on
            v.error = f"run failed: {exc}"
            log(f"verify {c.label}: {v.error}")
        finally:
            server.stop()
    return _outcome(results, primary, out_dir)


def _cold_cache(server: ServerProcess, log: VerifyLog, label: str) -> None:
    """Empty the server's prefix cache of the previous repeat's prompts."""
    from slotune.workloads.server_process import RESET_HINT, reset_prefix_cache

    if reset_prefix_cache(server.url) is None:
        log(
            f"verify {label}: the server cannot drop its prefix cache; restarting it ({RESET_HINT})"
        )
        server.restart()


def _outcome(results: list[Verified], primary: str, out_dir: Path) -> VerifyOutcome:
    simulated = _order({v.label: v.predicted[primary] for v in results}, primary)
    measured = _order({v.label: v.mean(primary) for v in results if v.ok}, primary)
    rho = spearman(simulated, measured)
    by_label = {v.label: v for v in results}
    if not measured:
        return VerifyOutcome(
            results, primary, simulated, measured, rho, simulated[0],
            by_label[simulated[0]].config, "no configuration could be measured: the "
            "simulator's recommendation stands unverified", out_dir,
        )  # fmt: skip
    best = by_label[measured[0]]
    note = f"measured winner: {best.label}"
    defaults = by_label.get(DEFAULTS)
    if defaults is not None and defaults.ok and best is not defaults:
        beats = _beats(best, defaults, primary)
        if beats is False:
            note = (
                f"{best.label} measured best but within the repeats' spread of the defaults: "
                "keep the defaults"
            )
            best = defaults
        elif beats is None:
            note += " (one repeat each: no noise band; use --verify-repeats 2 or more)"
    return VerifyOutcome(
        results, primary, simulated, measured, rho, best.label, best.config, note, out_dir
    )


def _beats(a: Verified, b: Verified, primary: str) -> bool | None:
    """Whether ``a`` beats ``b`` beyond both repeats' spread (None: one repeat, no spread)."""
    ba, bb = a.band(primary), b.band(primary)
    if ba is None or bb is None or len(a.measured) < 2 or len(b.measured) < 2:
        return None
    return ba[1] < bb[0] if primary == "score" else ba[0] > bb[1]


def write_outcome(outcome: VerifyOutcome, best_json: Path) -> dict[str, Any]:
    """``verify.json`` beside the runs, and the outcome in ``best.json`` (``verify``; the
    recommendation becomes the measured winner); returns the new ``best.json``."""
    data = outcome.to_dict()
    write_json(outcome.out_dir / "verify.json", data)
    best = json.loads(best_json.read_text())
    if outcome.winner_config != best.get("config"):
        best["simulated_config"] = best.get("config")
        best["config"] = outcome.winner_config
    best["recommended_by"] = "measured" if outcome.measured_order else "simulated"
    best["verify"] = {k: v for k, v in data.items() if k != "candidates"} | {
        "candidates": [
            {
                "label": c["label"],
                "trial": c["trial"],
                "predicted": c["predicted"],
                "measured": c["measured"],
                "error": c["error"],
                "log": c["log"],
            }
            for c in data["candidates"]
        ]
    }
    write_json(best_json, best)
    return best


def calibrate(
    outcome: VerifyOutcome,
    setup: TuneSetup,
    *,
    stack_path: Path,
    max_evaluations: int = 40,
    log: VerifyLog = lambda _: None,
) -> Path | None:
    """Fit the study's stack to the measured runs (``calibrate --from-runs``, the constants
    runs of one workload pin) and write it to ``stack_path``; None when nothing was measured."""
    from slotune.calibration.from_runs import ONE_WORKLOAD_PARAMS, fit_from_runs, write_fit
    from slotune.engine.sim.stack import load_stack
    from slotune.validate.runs import load_run

    dirs = [d for c in outcome.candidates for d in c.runs]
    if not dirs:
        return None
    runs = [load_run(d, gpu=setup.gpu, model=setup.model) for d in dirs]
    span = max(r.trace.requests[-1].arrival_time or 0.0 for r in runs if r.trace.requests)
    log(f"calibrating the stack on {len(runs)} measured runs")
    result = fit_from_runs(
        runs,
        stack=load_stack(setup.stack),
        params=ONE_WORKLOAD_PARAMS,
        window_s=span + 1.0,
        warmup_s=0.0,
        max_evaluations=max_evaluations,
    )
    note = f"fitted by tune --verify to {len(runs)} runs measured on the server"
    write_fit(result, stack_path, name=stack_path.stem, note=note)
    return stack_path


def candidates_from(
    study: Any, setup: TuneSetup, baseline: dict[str, Any], top: int
) -> list[Candidate]:
    """The study's ``top`` best distinct configurations, best first, and the baseline."""
    from slotune.tuner.results import finished, ranked

    seen: set[str] = {json.dumps(baseline["config"], sort_keys=True)}
    out: list[Candidate] = []
    for t in ranked(finished(study), setup.objective, setup.attainment, baseline["config"]):
        key = json.dumps(t.user_attrs["config"], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        out.append(Candidate(f"trial-{t.number}", t.user_attrs["config"], t.number))
        if len(out) == top:
            break
    return [*out, Candidate(DEFAULTS, baseline["config"])]


def flags_for(engine: str, setup: TuneSetup) -> Flags:
    """The flags that make ``engine``'s server (a family: vllm, sglang, slotune) run a
    configuration: the study's target's own flags when it is of that family, else the
    family's newest release's. ``slotune serve`` takes the whole configuration as JSON,
    so it runs exactly the simulated one."""
    if engine == "slotune":
        return lambda config: ["--config", json.dumps(config.to_dict(), sort_keys=True)]
    from slotune.targets import get_target
    from slotune.tuner.export import engine_args

    target = setup.target if get_target(setup.target).family == engine else engine
    return lambda config: engine_args(
        config,
        target,
        setup.quantization,
        gpu=setup.gpu,
        model=setup.model,
        tp=setup.tp,
        ep=setup.ep,
    )[0]
