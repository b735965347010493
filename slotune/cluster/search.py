"""How to spend N GPUs: an Optuna search over deployments at a given load, under an SLO.

A trial is a deployment: co-located replicas (count, TP, PP, router) or prefill/decode
disaggregation (prefill and decode counts — the P:D ratio — each side's TP, the router
in front of the prefill instances), each kind's expert-parallel size for a MoE model
where the export target runs EP, with each instance kind's engine flags
(``max_num_batched_tokens``, ``max_num_seqs``). Its score is the goodput per GPU at the
study's load (requests per second that meet every SLO, over the GPUs the deployment
uses, so that 4 GPUs that meet the SLO beat 8 that meet it no better) where the share of
requests meeting the SLO reaches the attainment target (as ``slotune tune``'s
``--attainment``); below it a deployment ranks after every one that reaches it, by
attainment. A deployment that does not fit (the model on its TP, GPUs beyond the budget) is
pruned without a run. The *single-instance answer* is the same search restricted to one
co-located instance (what ``slotune tune`` answers), for comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from slotune.cluster.run import ClusterResult, run_cluster
from slotune.cluster.spec import ROUTERS, ClusterSpec, InstanceSpec, Link, Role, RouterSpec
from slotune.engine.config import EngineConfig

if TYPE_CHECKING:
    import optuna

    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.slo import SLO
    from slotune.workloads.trace import Trace

BATCHED_TOKENS = (2048, 4096, 8192, 16384)
MAX_SEQS = (64, 128, 256, 512)
MODES = ("co-located", "disaggregated")


@dataclass(frozen=True)
class DeploySpace:
    """What the search may choose. ``tps``: the tensor-parallel sizes tried (each kept
    only where the model fits); ``modes``, ``routers``: the choices of each. With
    ``expert_parallel`` and a MoE model, each instance kind also chooses its expert-parallel
    size among those its ``target`` (the export engine: ``targets.expert_parallel_sizes``;
    None: any) says on its TP and the model's experts divide (``ModelSpec.check_ep``)."""

    gpus: int
    gpu: str = "h100"
    model: str = "llama-3-8b"
    stack: str | None = None
    base: EngineConfig = field(default_factory=EngineConfig)
    tps: tuple[int, ...] = (1, 2, 4, 8)
    pps: tuple[int, ...] = (1,)
    modes: tuple[str, ...] = MODES
    routers: tuple[str, ...] = ROUTERS
    link: Link | None = None
    target: str | None = None
    expert_parallel: bool = True

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"--gpus: must be at least 1 (got {self.gpus})")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes: {bad or 'none'} — choose from {', '.join(MODES)}")
        for r in self.routers:
            RouterSpec(r)  # validates
        if not [t for t in self.tps if t <= self.gpus]:
            raise ValueError(f"no tensor-parallel size in {self.tps} fits {self.gpus} GPUs")
        if self.expert_parallel:
            self.eps(1)  # an unknown model or target is refused here, with its name

    def eps(self, tp: int) -> tuple[int, ...]:
        """The expert-parallel sizes an instance on ``tp`` GPUs may use (``(1,)``: none)."""
        return _ep_sizes(self.model, self.target, tp) if self.expert_parallel else (1,)

    def instance(
        self,
        tp: int,
        role: Role = "mixed",
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        pp: int = 1,
        ep: int = 1,
    ) -> InstanceSpec:
        """An instance on ``tp`` GPUs with the base config and the flags given."""
        changes: dict[str, Any] = {}
        if max_num_batched_tokens is not None:
            changes["max_num_batched_tokens"] = max_num_batched_tokens
        if max_num_seqs is not None:
            changes["max_num_seqs"] = max_num_seqs
        config = replace(self.base, **changes)
        return InstanceSpec(config, self.gpu, self.model, tp, self.stack, ep=ep, role=role, pp=pp)


@lru_cache(maxsize=64)
def _ep_sizes(model: str, target: str | None, tp: int) -> tuple[int, ...]:
    from slotune.engine.sim.models import get_model
    from slotune.targets import expert_parallel_sizes, get_target

    spec = get_model(model)
    if spec.moe is None:
        return (1,)
    said = (
        expert_parallel_sizes(get_target(target), tp)
        if target is not None
        else tuple(k for k in range(1, tp + 1) if tp % k == 0)
    )
    out = []
    for ep in said:
        try:
            spec.check_ep(tp, ep)
        except ValueError:
            continue
        out.append(ep)
    return tuple(out) or (1,)


def _suggest_ep(
    trial: optuna.trial.BaseTrial, space: DeploySpace, tp: int, pp: int, name: str
) -> int:
    """The trial's EP size for an instance kind on ``tp`` GPUs (one parameter per TP size:
    Optuna keeps a categorical's choices fixed)."""
    eps = space.eps(tp) if pp == 1 else (1,)  # the pipeline executor prices no EP
    return trial.suggest_categorical(f"{name}_tp{tp}", list(eps)) if len(eps) > 1 else 1


class Unfit(Exception):
    """A deployment that cannot be run (the reason is the message)."""


def suggest(trial: optuna.trial.BaseTrial, space: DeploySpace, single: bool = False) -> ClusterSpec:
    """The deployment of ``trial``; ``Unfit`` when the choices do not fit the budget."""
    tps = [t for t in space.tps if t <= space.gpus]
    mode = "co-located" if single else trial.suggest_categorical("mode", list(space.modes))
    routers = list(space.routers)
    if mode == "co-located":
        tp = trial.suggest_categorical("tp", tps)
        pp = trial.suggest_categorical("pp", list(space.pps)) if len(space.pps) > 1 else 1
        n = 1 if single else trial.suggest_int("replicas", 1, space.gpus)
        if n * tp * pp > space.gpus:
            raise Unfit(f"{n} replicas × TP {tp} × PP {pp} > {space.gpus} GPUs")
        inst = space.instance(
            tp,
            pp=pp,
            ep=_suggest_ep(trial, space, tp, pp, "ep"),
            max_num_batched_tokens=trial.suggest_categorical(
                "max_num_batched_tokens", list(BATCHED_TOKENS)
            ),
            max_num_seqs=trial.suggest_categorical("max_num_seqs", list(MAX_SEQS)),
        )
        router = trial.suggest_categorical("router", routers) if n > 1 else "round-robin"
        return ClusterSpec.replicas(n, inst, router)
    tp_p = trial.suggest_categorical("prefill_tp", tps)
    tp_d = trial.suggest_categorical("decode_tp", tps)
    n_p = trial.suggest_int("prefill_instances", 1, max(space.gpus - 1, 1))
    n_d = trial.suggest_int("decode_instances", 1, max(space.gpus - 1, 1))
    if n_p * tp_p + n_d * tp_d > space.gpus:
        raise Unfit(f"{n_p}×TP{tp_p} prefill + {n_d}×TP{tp_d} decode > {space.gpus} GPUs")
    prefill = space.instance(
        tp_p,
        ep=_suggest_ep(trial, space, tp_p, 1, "prefill_ep"),
        max_num_batched_tokens=trial.suggest_categorical(
            "prefill_max_num_batched_tokens", list(BATCHED_TOKENS)
        ),
    )
    decode = space.instance(
        tp_d,
        ep=_suggest_ep(trial, space, tp_d, 1, "decode_ep"),
        max_num_seqs=trial.suggest_categorical("decode_max_num_seqs", list(MAX_SEQS)),
    )
    router = trial.suggest_categorical("router", routers) if n_p > 1 else "round-robin"
    return ClusterSpec.disaggregate(
        prefill, n_p, decode, n_d, router=router, link=space.link or "rdma"
    )


@dataclass(frozen=True)
class Scored:
    """One deployment's run at the study's load."""

    spec: ClusterSpec
    goodput: float  # requests/s meeting every SLO
    attainment: float
    summary: dict[str, Any]
    target: float = 0.99
    run: ClusterResult | None = None

    @property
    def per_gpu(self) -> float:
        return self.goodput / self.spec.num_gpus

    @property
    def feasible(self) -> bool:
        return self.attainment >= self.target

    @property
    def value(self) -> float:
        """The objective: goodput per GPU when feasible, else attainment − 1 (< 0)."""
        return self.per_gpu if self.feasible else self.attainment - 1.0


def score(
    spec: ClusterSpec,
    trace: Trace,
    arrivals: ArrivalSpec,
    slo: SLO,
    *,
    seed: int = 0,
    timeout_s: float | None = None,
    target: float = 0.99,
    keep_run: bool = False,
) -> Scored:
    from slotune.workloads import summarize

    try:
        run = run_cluster(spec, trace, arrivals=arrivals, seed=seed, timeout_s=timeout_s)
    except ValueError as exc:  # the model does not fit an instance's GPUs
        raise Unfit(str(exc)) from None
    s = summarize(run.result, slo)
    return Scored(
        spec,
        float(s["goodput"]),
        float(s["slo_attainment"]),
        s,
        target,
        run if keep_run else None,
    )


@dataclass(frozen=True)
class DeployStudy:
    best: Scored
    single: Scored | None
    trials: tuple[Scored, ...]
    seconds: float
    runs: int


def search(
    space: DeploySpace,
    trace: Trace,
    arrivals: ArrivalSpec,
    slo: SLO,
    *,
    trials: int = 30,
    single_trials: int = 8,
    seed: int = 0,
    timeout_s: float | None = None,
    target: float = 0.99,
    progress: Callable[[int, Scored], None] | None = None,
) -> DeployStudy:
    """``trials`` deployments (TPE, seeded), then ``single_trials`` single instances; each
    distinct deployment runs once. The best of each is run again to keep its records."""
    t0 = time.perf_counter()
    seen: dict[ClusterSpec, Scored] = {}

    def study(n: int, single: bool) -> list[Scored]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(8, n))
        st = optuna.create_study(direction="maximize", sampler=sampler)
        done: list[Scored] = []
        attempts = 0
        while len(done) < n and attempts < 20 * n:
            attempts += 1
            trial = st.ask()
            try:
                spec = suggest(trial, space, single)
                scored = seen.get(spec)
                if scored is None:
                    scored = seen[spec] = score(
                        spec, trace, arrivals, slo, seed=seed, timeout_s=timeout_s, target=target
                    )
                    done.append(scored)
                    if progress is not None:
                        progress(len(done), scored)
            except Unfit:
                st.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            st.tell(trial, scored.value)
        return done

    found = study(trials, single=False)
    singles = study(single_trials, single=True) if single_trials else []
    if not found:
        raise ValueError("no deployment fits: raise --gpus or choose a smaller model")
    best = _rerun(_best(found + singles), trace, arrivals, slo, seed, timeout_s)
    singles += [s for s in found if len(s.spec.instances) == 1]  # a subset of the space
    single = _rerun(_best(singles), trace, arrivals, slo, seed, timeout_s) if singles else None
    return DeployStudy(
        best, single, tuple(found), time.perf_counter() - t0, len(seen) + 1 + bool(single)
    )


def _best(scored: Sequence[Scored]) -> Scored:
    """The highest objective; ties to the fewer GPUs, then the higher attainment."""
    return max(scored, key=lambda s: (s.value, -s.spec.num_gpus, s.attainment))


def _rerun(
    s: Scored, trace: Trace, arrivals: ArrivalSpec, slo: SLO, seed: int, timeout_s: float | None
) -> Scored:
    return score(
        s.spec, trace, arrivals, slo, seed=seed, timeout_s=timeout_s, target=s.target, keep_run=True
    )
