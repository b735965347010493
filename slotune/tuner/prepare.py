"""Turn ``slotune tune``'s options into a checked ``TuneSetup``, before any trial runs.

Every user error (a malformed SLO, an unknown GPU or model, weights that do not sum to a
positive number, an empty search space, a trace too small for ``--num-requests``, ...)
raises ``TuneInputError`` with one line saying what is wrong and what would be right.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from slotune._extras import MissingExtra, require
from slotune.targets import ExportRefused, Target, get_target
from slotune.tuner.baseline import gpu_spec
from slotune.tuner.evaluate import Evaluator
from slotune.tuner.objectives import (
    OBJECTIVES,
    RateLadder,
    parse_tier_objective,
    parse_weights,
    resolve_weights,
)
from slotune.tuner.setup import LoadSpec, TuneSetup, trace_digest
from slotune.tuner.space import SearchSpace, SearchSpaceError, build_space, load_search_file
from slotune.tuner.study import (
    DEFAULT_HEARTBEAT_S,
    SAMPLERS,
    StudyError,
    default_storage,
    study_names,
)

DEFAULT_NUM_REQUESTS = {"sim": 500, "engine": 32}
"""Requests per trial when a run is a number of requests: the real engine's default (every
request is real compute on this machine), and the simulator's with ``--warmup`` or
``--cooldown`` but no ``--duration``, or on a trace with its own timestamps."""


@dataclass(frozen=True)
class SteadyRun:
    """How long a simulated run sends at its rate, and the ends its scores leave out."""

    duration_s: float
    warmup_s: float
    cooldown_s: float
    rate_step: float  # the goodput search's ladder: each rate this much above the last
    trials: int  # the study's default budget with these runs


STEADY_DEFAULT = SteadyRun(
    duration_s=30.0, warmup_s=10.0, cooldown_s=3.0, rate_step=1.05, trials=12
)
"""The simulator's default run at a rate: 30 s of arrivals (the trace repeated), scored
after a 10 s warm-up (longer than most requests stay in the system, so the requests in
flight have settled) and before a 3 s cool-down; the run's steady-state check decides
whether the rate is held. Rates 5 % apart: finer than a 30 s run resolves. The least
simulation whose ranking of configurations equals that of 60 s and 120 s runs
(docs/BENCHMARKS.md, "Steady-state goodput"); with 12 trials (a run costs several bursts)
the default tune stays well under a minute."""
BURST_RATE_STEP = 1.02
DEFAULT_TRIALS = 50
DEFAULT_OUT_ROOT = Path("slotune-out")


class TuneInputError(ValueError):
    """Bad input to the tune workflow, found before any trial runs: ``field`` is the
    ``TuneOptions`` field at fault. The message names options as ``{field}``; ``str()``
    gives their field names, ``render`` any other names (the CLI gives its flags)."""

    def __init__(self, field: str, template: str) -> None:
        self.field = field
        self.template = template
        super().__init__(self.render(lambda name: name))

    def render(self, name_of: Callable[[str], str]) -> str:
        def name(m: re.Match[str]) -> str:
            return name_of(m[1]) if m[1] in _OPTION_NAMES else m[0]

        return re.sub(r"\{([a-z_]+)\}", name, self.template)


@dataclass(frozen=True)
class TuneOptions:
    gpu: str | None = None
    model: str = "llama-3-8b"
    tp: int = 1
    stack: str | None = None
    trace: str = "sharegpt-like"
    format: str | None = None
    num_requests: int | None = None
    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None
    objective: str | None = None
    weights: str | None = None
    tier_objective: str | None = None  # ``pro>=0.99,free=1`` (``TierObjective``)
    percentile: float = 99.0
    attainment: float = 0.99
    trials: int | None = None  # default: STEADY_DEFAULT's with the default run, else 50
    timeout: float | None = None
    request_timeout: float | None = None
    duration: float | None = None
    warmup: float | None = None  # default: STEADY_DEFAULT's with the default run, else 0
    cooldown: float | None = None
    sampler: str | None = None
    seed: int = 0
    search: str | None = None
    storage: str | None = None
    study_name: str | None = None
    resume: bool = False
    n_jobs: int = 1
    backend: str = "sim"
    out: str | None = None
    slo: str = ""
    heartbeat: int = DEFAULT_HEARTBEAT_S
    quantization: str | None = None
    ep: int = 1
    verify: str | None = None  # the server's command line, with {flags} and {port}
    verify_top: int = 5
    verify_repeats: int = 1
    verify_flags: str = "auto"  # whose flags fill {flags}: vllm | sglang | slotune
    verify_timeout: float = 600.0  # seconds a server may take to answer /health
    target: str | None = None  # default: the newest vLLM supported
    speculative_model: str | None = None  # fixes it: num_speculative_tokens is searched
    speculative_acceptance: float | None = None  # the simulator's rate (fixed)


_OPTION_NAMES = frozenset(f.name for f in fields(TuneOptions))


@dataclass(frozen=True)
class Prepared:
    options: TuneOptions  # with the defaults that depend on the trace settled
    setup: TuneSetup
    space: SearchSpace
    trace: Any
    gpu: Any | None
    reference_from_baseline: bool
    target: Target

    @property
    def trials(self) -> int:
        """The trial budget, which ``with_run_length`` always settles."""
        assert self.options.trials is not None
        return self.options.trials


def _check_verify(o: TuneOptions) -> None:
    from slotune.tuner.verify import verify_problem

    problem = verify_problem(o.verify or "", o.verify_top, o.verify_repeats, o.verify_flags)
    if problem is not None:
        field, message = problem
        raise TuneInputError(field, f"{{{field}}}: {message}")


def check_options(o: TuneOptions) -> None:
    """Checks that need nothing loaded."""
    warmup, cooldown = o.warmup or 0.0, o.cooldown or 0.0
    if o.backend not in ("sim", "engine"):
        raise TuneInputError(
            "backend", f"{{backend}}: unknown backend {o.backend!r}; use sim or engine"
        )
    if o.backend == "sim" and not o.gpu:
        raise TuneInputError(
            "gpu",
            "{gpu} is required with the simulated backend (e.g. {gpu} h100; "
            "`slotune gpus` lists the GPUs)",
        )
    if o.objective is not None and o.objective not in OBJECTIVES:
        raise TuneInputError(
            "objective",
            f"{{objective}}: unknown objective {o.objective!r}; use one of {', '.join(OBJECTIVES)}",
        )
    if o.sampler is not None and o.sampler not in SAMPLERS:
        raise TuneInputError(
            "sampler",
            f"{{sampler}}: unknown sampler {o.sampler!r}; use one of {', '.join(SAMPLERS)}",
        )
    if o.verify is not None:
        _check_verify(o)
    checks = [
        (o.tp >= 1, f"{{tp}} must be at least 1 (got {o.tp})"),
        (o.trials is None or o.trials >= 1, f"{{trials}} must be at least 1 (got {o.trials})"),
        (o.n_jobs >= 1, f"{{n_jobs}} must be at least 1 (got {o.n_jobs})"),
        (o.heartbeat >= 1, f"{{heartbeat}} must be at least 1 second (got {o.heartbeat})"),
        (
            o.timeout is None or o.timeout > 0,
            f"{{timeout}} must be positive seconds (got {o.timeout})",
        ),
        (
            o.request_timeout is None
            or (o.request_timeout > 0 and math.isfinite(o.request_timeout)),
            f"{{request_timeout}} must be positive seconds (got {o.request_timeout})",
        ),
        (
            o.duration is None or (o.duration > 0 and math.isfinite(o.duration)),
            f"{{duration}} must be positive seconds (got {o.duration})",
        ),
        (
            math.isfinite(warmup + cooldown) and min(warmup, cooldown) >= 0,
            f"{{warmup}} and {{cooldown}} must be >= 0 seconds (got {warmup:g}, {cooldown:g})",
        ),
        (
            o.duration is None or warmup + cooldown < o.duration,
            "{warmup} and {cooldown} together must be shorter than {duration}",
        ),
        (
            o.duration is None or o.num_requests is None,
            "{num_requests}: with {duration} the rate and the duration set the requests",
        ),
        (
            o.duration is None or o.concurrency is None,
            "{duration} sends at a rate for a time; a closed loop ({concurrency}) has no rate",
        ),
        (
            o.num_requests is None or o.num_requests >= 1,
            f"{{num_requests}} must be at least 1 (got {o.num_requests})",
        ),
        (
            o.rate is None or (o.rate > 0 and math.isfinite(o.rate)),
            f"{{rate}} must be a positive number of requests/s (got {o.rate})",
        ),
        (o.burstiness > 0, f"{{burstiness}} must be positive (got {o.burstiness})"),
        (
            o.concurrency is None or o.concurrency >= 1,
            f"{{concurrency}} must be at least 1 (got {o.concurrency})",
        ),
        (0 < o.percentile <= 100, f"{{percentile}} must be in (0, 100] (got {o.percentile:g})"),
        (0 < o.attainment <= 1, f"{{attainment}} must be a share in (0, 1] (got {o.attainment:g})"),
        (
            o.burstiness == 1.0 or o.rate is not None or o.concurrency is None,
            "{burstiness} shapes open-loop arrivals; a closed loop ({concurrency}) has none",
        ),
    ]
    for ok, message in checks:
        if not ok:
            field = re.match(r"\{([a-z_]+)\}", message)
            raise TuneInputError(field[1] if field else "", message)


def _check_tier_objective(o: TuneOptions, trace_tiers: set[int]) -> None:
    """A tier objective must parse, and name only tiers the trace has (two or more)."""
    if not o.tier_objective:
        return
    from slotune.workloads.slo import tier_name

    try:
        objective = parse_tier_objective(o.tier_objective)
    except ValueError as e:
        raise TuneInputError(
            "tier_objective", str(e).replace("--tier-objective", "{tier_objective}")
        ) from None
    have = ", ".join(tier_name(t) for t in sorted(trace_tiers))
    if len(trace_tiers) < 2:
        raise TuneInputError(
            "tier_objective",
            f"{{tier_objective}}: the trace has one tier ({have}); it needs requests of two "
            "or more (a `tier` per request)",
        )
    for t in sorted(objective.tiers - trace_tiers):
        raise TuneInputError(
            "tier_objective",
            f"{{tier_objective}}: the trace has no request of tier {tier_name(t)!r} (its "
            f"tiers: {have})",
        )


def prepare(o: TuneOptions) -> Prepared:
    """Validate everything and build the setup (the baseline and its rate come later)."""
    from slotune.workloads import default_max_model_len, load_trace, parse_slo

    check_options(o)
    target = _target(o)
    try:
        slo = parse_slo(o.slo)
    except ValueError as e:
        raise TuneInputError("slo", f"{{slo}}: {e}") from None
    try:
        weights = resolve_weights(
            parse_weights(o.weights) if o.weights else None, list(slo.metrics)
        )
    except ValueError as e:
        raise TuneInputError("weights", str(e).replace("--weights", "{weights}")) from None
    gpu = _check_hardware(o)
    try:
        trace = load_trace(
            o.trace, format=o.format, num_requests=o.num_requests, seed=o.seed, model=o.model
        )
    except (ValueError, OSError) as e:
        raise TuneInputError("trace", f"{{trace}}: {e}") from None
    o = with_run_length(o, trace)
    if o.num_requests is None and o.duration is None:  # the default takes what a short trace has
        trace = trace.head(min(len(trace), DEFAULT_NUM_REQUESTS[o.backend]))
    trace_tiers = {r.tier for r in trace.requests}
    try:
        slo.check_tiers(trace_tiers)
    except ValueError as e:
        raise TuneInputError("slo", f"{{slo}}: {e}") from None
    _check_tier_objective(o, trace_tiers)
    where = f"{{search}} {o.search}" if o.search else "search space"
    try:
        overrides = load_search_file(o.search) if o.search else {}
        for name in ("speculative_model", "speculative_acceptance"):  # a flag fixes its field
            if getattr(o, name) is not None:
                overrides[name] = getattr(o, name)
        space = build_space(
            max_model_len=default_max_model_len(trace),
            overrides=overrides,
            where=where,
            kv_cache_dtypes=gpu.kv_cache_dtypes if gpu is not None else ("auto",),
            target=target,
        )
    except SearchSpaceError as e:
        raise TuneInputError("search", str(e)) from None
    objective = o.objective or _default_objective(o, trace)
    if objective in ("goodput", "pareto") and o.concurrency is not None:
        raise TuneInputError(
            "objective",
            f"{{objective}} {objective} searches the request rate, which a "
            "closed loop ({concurrency}) does not have; use {objective} weighted",
        )
    load = _load(o, trace)
    if objective in ("goodput", "pareto") and load.timestamps and not load.native_rate:
        raise TuneInputError(
            "objective",
            f"{{objective}} {objective}: the trace's timestamps span no time, "
            "so they cannot be scaled to other rates; give {rate} instead",
        )
    reference_from_baseline = (
        load.rate is None
        and load.concurrency is None
        and not load.timestamps
        and objective != "goodput"
    )
    needs_ladder = objective in ("goodput", "pareto") or reference_from_baseline
    base = o.rate or load.native_rate or 1.0
    if o.duration is None:
        ladder = RateLadder(base=base, ratio=BURST_RATE_STEP)
    else:  # a step of 8 rungs (48 %): no run far above what a server holds, each a long one
        ladder = RateLadder(base=base, ratio=STEADY_DEFAULT.rate_step, max_gallop=8)
    notes = []
    if objective == "goodput" and o.rate is not None:
        notes.append(f"--rate {o.rate:g} starts the goodput search; the searched rate varies")
    if any(r.session_id is not None for r in trace.requests) and load.timestamps is False:
        notes.append(
            "the trace has sessions: a rate counts new sessions per second; later "
            "turns follow when the previous answer (and the tool time) is done"
        )
    setup = TuneSetup(
        gpu=o.gpu or "local",
        model=o.model,
        slo=str(slo),
        objective=objective,
        weights=weights,
        tier_objective=o.tier_objective or None,
        percentile=o.percentile,
        attainment=o.attainment,
        space=space.to_dict(),
        load=load,
        tp=o.tp,
        backend=o.backend,
        stack=_stack_name(o.stack or target.stack),
        trace=o.trace,
        trace_format=o.format,
        num_requests=len(trace),
        request_timeout_s=o.request_timeout,
        warmup_s=o.warmup or 0.0,
        cooldown_s=o.cooldown or 0.0,
        seed=o.seed,
        sampler=o.sampler or ("nsga2" if objective == "pareto" else "tpe"),
        ladder=ladder.to_dict() if needs_ladder else None,
        notes=tuple(notes),
        trace_digest=trace_digest(trace),
        quantization=o.quantization,
        ep=o.ep,
        target=target.name,
    )
    return Prepared(o, setup, space, trace, gpu, reference_from_baseline, target)


def _target(o: TuneOptions) -> Target:
    """The target, checked to serve the model's weight format."""
    try:
        target = get_target(o.target)
    except ValueError as e:
        raise TuneInputError("target", f"{{target}}: {e}") from None
    try:
        target.weight_serving(o.quantization)
    except ExportRefused as e:
        raise TuneInputError("quantization", f"{{quantization}}: {e}") from None
    except ValueError:
        pass  # an unknown format: _check_hardware names it
    return target


def with_run_length(o: TuneOptions, trace: Any) -> TuneOptions:
    """The options with the run's length, scoring window and trial budget settled. A
    simulated run at a rate (given or searched) on a trace without timestamps is by
    default a timed steady-state run (``STEADY_DEFAULT``, with its trial budget); a
    warm-up or cool-down left unset is then STEADY_DEFAULT's, capped to a third (a
    tenth) of the duration, and else none."""
    steady = (
        o.backend == "sim"
        and o.num_requests is None
        and o.duration is None
        and o.concurrency is None
        and o.warmup is None
        and o.cooldown is None
        and not trace.has_timestamps
    )
    duration = STEADY_DEFAULT.duration_s if steady else o.duration
    trials = o.trials or (STEADY_DEFAULT.trials if steady else DEFAULT_TRIALS)
    if duration is None:
        return replace(o, warmup=o.warmup or 0.0, cooldown=o.cooldown or 0.0, trials=trials)
    warmup = min(STEADY_DEFAULT.warmup_s, duration / 3) if o.warmup is None else o.warmup
    cooldown = min(STEADY_DEFAULT.cooldown_s, duration / 10) if o.cooldown is None else o.cooldown
    if not warmup + cooldown < duration:
        raise TuneInputError(
            "warmup", "{warmup} and {cooldown} together must be shorter than {duration}"
        )
    return replace(o, duration=duration, warmup=warmup, cooldown=cooldown, trials=trials)


def _check_hardware(o: TuneOptions) -> Any | None:
    from slotune.engine.sim.models import get_model

    gpu = None
    if o.backend == "sim":
        try:
            gpu = gpu_spec(o.gpu or "")
        except ValueError as e:
            raise TuneInputError("gpu", f"{{gpu}}: {e}") from None
    try:
        model = get_model(o.model)
    except ValueError as e:
        raise TuneInputError("model", f"{{model}}: {e}") from None
    try:
        model = get_model(o.model, o.quantization)
    except ValueError as e:
        raise TuneInputError("quantization", f"{{quantization}}: {e}") from None
    try:
        model.check_ep(o.tp, o.ep)
    except ValueError as e:
        raise TuneInputError("ep", f"{{ep}}: {e}") from None
    if o.backend == "engine" and not Path(o.model).is_dir():
        raise TuneInputError(
            "model",
            f"{{model}}: {{backend}} engine needs a local checkpoint folder "
            f"(got {o.model!r}; `slotune init-model DIR` makes one)",
        )
    if o.backend == "engine":
        try:
            require("torch", extra="engine")
        except MissingExtra as e:
            raise TuneInputError("backend", f"{{backend}} engine: {e}") from None
    try:
        model.check_tp(o.tp)
    except ValueError as e:
        raise TuneInputError("tp", f"{{tp}}: {e}") from None
    return gpu


def _stack_name(stack: str | None) -> str:
    """The serving stack the study simulates: checked now, stored by the name given."""
    from slotune.engine.sim.stack import DEFAULT_STACK, load_stack

    try:
        load_stack(stack)
    except ValueError as e:  # UnknownNameError is a ValueError
        raise TuneInputError("stack", f"{{stack}}: {e}") from None
    return stack or DEFAULT_STACK


def _default_objective(o: TuneOptions, trace: Any) -> str:
    if o.rate is None and o.concurrency is None and not trace.has_timestamps:
        return "goodput"
    return "weighted"


def _load(o: TuneOptions, trace: Any) -> LoadSpec:
    if o.rate is not None:
        return LoadSpec(
            rate=o.rate, burstiness=o.burstiness, concurrency=o.concurrency, duration_s=o.duration
        )
    if trace.has_timestamps and o.burstiness == 1.0 and o.duration is None:
        native = trace.stats().get("mean_rate")
        return LoadSpec(timestamps=True, native_rate=native, concurrency=o.concurrency)
    # no rate yet: the goodput search or the baseline's goodput sets it (burstiness applies)
    return LoadSpec(burstiness=o.burstiness, concurrency=o.concurrency, duration_s=o.duration)


def baseline_config(p: Prepared) -> Any:
    """The target's defaults with the space's fixed fields (max_model_len, memory, ...)."""
    fixed = {k: v for k, v in p.space.fixed.items() if k != "max_model_len"}
    card = p.gpu if p.gpu is not None else _SmallCard()
    return p.target.defaults(card, max_model_len=p.space.max_model_len, **fixed)


class _SmallCard:
    name = "local"
    memory_gib = 0.0


def measure_baseline(p: Prepared, evaluator: Evaluator) -> tuple[TuneSetup, dict[str, Any]]:
    """Measure the target's defaults: their goodput when the study searches rates, then their
    metrics at the study's load. Without a load of its own, the weighted and pareto
    objectives are measured at the defaults' goodput: the load the target's defaults just meet."""
    setup = p.setup
    config = baseline_config(p)
    baseline: dict[str, Any] = {"config": config.to_dict()}
    found = None
    if evaluator.ladder is not None:
        found = evaluator.goodput(config, _first_rung(evaluator), exact=True)
        baseline.update(
            goodput_rps=found.rate,
            goodput_rung=found.rung,
            goodput_value=found.value,
            probes=[[r, a] for r, a in sorted(found.probes.items())],
        )
        if p.reference_from_baseline:
            rate = found.rate or evaluator.ladder.base
            why = (
                "the highest rate the target's defaults sustain"
                if found.rate
                else "the target's defaults miss the SLO at every rate tried"
            )
            setup = replace(
                setup,
                load=replace(setup.load, rate=rate),
                notes=(*setup.notes, f"load {rate:.3g} req/s: {why} (set --rate to choose)"),
            )
            evaluator.setup = setup
    # a goodput study has no load of its own: the defaults are described at their goodput
    if setup.objective == "goodput" and found is not None:
        m = found.at
    else:
        m = evaluator.measure(config)
    baseline.update(
        metrics=m.summary, rate=m.rate, score=m.score, attainment=m.attainment, feasible=m.feasible
    )
    return setup, baseline


def _first_rung(evaluator: Evaluator) -> int:
    """Where the baseline's rate search starts: ``--rate`` when given, else 16 req/s."""
    ladder = evaluator.ladder
    assert ladder is not None
    return ladder.rung(evaluator.setup.load.rate or 16.0)


def default_study_name(o: TuneOptions, objective: str) -> str:
    model = Path(o.model).name if Path(o.model).exists() else o.model
    trace = Path(o.trace).stem if Path(o.trace).exists() else o.trace
    gpu = Path(o.gpu).stem if o.gpu and o.gpu.endswith(".json") else (o.gpu or "local")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{gpu}-{model}-{trace}-{objective}")
    return name.lstrip("._-")[: STUDY_NAME_MAX - 4]  # room for a -N suffix


STUDY_NAME_MAX = 128
_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_study_name(name: str) -> None:
    """A study name is also a folder name (``slotune-out/<name>``): letters, digits, ``.``,
    ``_`` and ``-``, starting with a letter or digit, at most 128 characters, so that it
    can never be a path (``../x``, ``/abs``) nor a hidden or special entry."""
    if len(name) > STUDY_NAME_MAX or not _STUDY_NAME.fullmatch(name):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise TuneInputError(
            "study_name",
            f"{{study_name}}: {shown!r} is not a valid study name; use letters, digits, "
            f"'.', '_' and '-', starting with a letter or digit (at most {STUDY_NAME_MAX})",
        )


def check_places(o: TuneOptions) -> None:
    """Before anything loads or runs: the study name is a name, and the output folder and
    a storage file can be written."""
    from slotune.outputs import OutputError, check_folder
    from slotune.tuner.storage import check_writable

    if o.study_name:
        check_study_name(o.study_name)
    try:
        check_folder(Path(o.out) if o.out else DEFAULT_OUT_ROOT)
    except OutputError as e:
        raise TuneInputError("out", f"{{out}}: {e}") from None
    if o.storage:
        try:
            check_writable(o.storage)
        except OutputError as e:
            raise TuneInputError("storage", f"{{storage}}: {e}") from None


@dataclass(frozen=True)
class StudyPlace:
    name: str
    storage: str
    out_dir: Path
    exists: bool


def place_study(o: TuneOptions, objective: str) -> StudyPlace:
    """Where the study lives. Without ``--study-name``, a new run takes the first free name
    of ``<gpu>-<model>-<trace>-<objective>[-N]`` and ``--resume`` the last taken one. With
    ``--storage`` and ``--study-name``, an existing study is joined (workers on other
    machines start the same command), provided its settings are the same."""

    def where(name: str) -> tuple[str, Path]:
        out = Path(o.out) if o.out else DEFAULT_OUT_ROOT / name
        return (o.storage or default_storage(out)), out

    def taken(name: str) -> bool:
        url, _ = where(name)
        try:
            return name in study_names(url)
        except StudyError as e:
            raise TuneInputError("storage", str(e)) from None

    if o.study_name:
        name = o.study_name
        exists = taken(name)
        if exists and not o.resume and not o.storage:
            raise TuneInputError(
                "study_name",
                f"{{study_name}}: study {name!r} already exists in "
                f"{where(name)[0]}; add {{resume}} to continue it, or pick "
                "another name",
            )
        if o.resume and not exists:
            raise TuneInputError(
                "resume", f"{{resume}}: no study named {name!r} in {where(name)[0]}"
            )
    else:
        base = default_study_name(o, objective)
        candidates = [base, *(f"{base}-{i}" for i in range(2, 1000))]
        used = []
        for cand in candidates:
            if not taken(cand):
                break
            used.append(cand)
        if o.resume:
            if not used:
                raise TuneInputError(
                    "resume",
                    f"{{resume}}: no study {base!r} to resume in "
                    f"{where(base)[0]}; give {{study_name}} (and {{storage}})",
                )
            name, exists = used[-1], True
        else:
            name, exists = cand, False
    url, out = where(name)
    return StudyPlace(name, url, out, exists)
