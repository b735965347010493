"""A deployment in one simulation: every instance an ``Engine`` on a simulated executor, all
on one virtual clock, behind a router.

Events are handled in time order: a request's arrival (routed at once), a prefill
instance's finish reaching the router (a decode instance is chosen, the KV transfer is
queued on that instance's link), a KV cache landing on a decode instance, and the end of
an instance's step. Each instance runs exactly the loop of ``drive_engine`` for one engine
(requests that arrived during a step join after it; ``schedule_ahead`` stacks take one
that arrived by the step's start; client latency, deadlines and the horizon the same), so
a cluster of one instance gives the single engine's result, record for record. An
instance may run a stretch of steps at once (``Engine.run_stretch``) up to the next event
that could reach it: the next arrival or landing KV, its next deadline, and, where
finishes elsewhere can send it work (sessions, a concurrency cap, a decode instance
behind prefill instances), the clock of those instances; a router's view of an instance
(outstanding requests, KV usage) is taken as of the decision's time, so results do not
depend on stretches.

Disaggregation: a prefill instance runs the prompt with ``max_tokens=1``; its output is the
router's, not the client's. The KV of the whole prompt (``capacity.kv_bytes`` at the
prefill side's ``kv_cache_dtype``) crosses the link, one transfer at a time into each
decode instance (``min(tp)`` lanes in parallel); the decode instance admits the request
with all but its last prompt token computed (it recomputes the last one for its logits,
as vLLM does when the whole prompt is cached) and streams every output token to the
client. The request's per-request costs outside the engine are paid on both instances.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right, insort
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from slotune.cluster.router import Decision, Router
from slotune.cluster.spec import ClusterSpec, InstanceSpec, RouterSpec
from slotune.engine.sampling_params import exact_length
from slotune.workloads.arrivals import ALL_AT_ONCE, ArrivalSpec
from slotune.workloads.result import RunResult
from slotune.workloads.runner.dispatch import Dispatcher
from slotune.workloads.runner.engine_loop import TokenPrompts, _cyclic_gc_paused, _end_step
from slotune.workloads.runner.record import Recorder
from slotune.workloads.runner.timeouts import (
    TIMEOUT_ERROR,
    UNFINISHED_ERROR,
    Deadlines,
    earliest,
)
from slotune.workloads.trace import Trace

if TYPE_CHECKING:
    from slotune.engine.engine import Engine
    from slotune.engine.outputs import StepStats


@dataclass(frozen=True)
class Transfer:
    """One prompt's KV cache crossing the link (engine clock)."""

    index: int
    prefill: int
    decode: int
    num_bytes: float
    start: float
    end: float
    handed: float  # when the router heard the prefill finish (the link may be busy then)


@dataclass(frozen=True)
class InstanceStats:
    index: int
    role: str
    num_gpus: int
    busy_s: float  # the sum of its step durations
    num_steps: int
    routed: int  # requests sent to it
    engine_stats: dict[str, Any]


@dataclass(frozen=True)
class ClusterResult:
    """The client's view (``result``: one record per request, as a single engine's run
    gives) and what happened inside: per-instance work, routing decisions, KV transfers."""

    spec: ClusterSpec
    result: RunResult
    instances: tuple[InstanceStats, ...]
    decisions: tuple[Decision, ...]
    transfers: tuple[Transfer, ...]


@dataclass(slots=True)
class _Item:
    """A request waiting in an instance's inbox from ``ready`` on."""

    ready: float
    index: int
    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival: float  # when the client sent it (its deadline counts from here)
    external: int = 0  # prompt tokens whose KV came over the link


@dataclass(eq=False)
class _Instance:
    index: int
    spec: InstanceSpec
    engine: Engine
    latency_s: float
    schedule_ahead: bool
    deadlines: Deadlines
    t: float = 0.0
    active: bool = False
    stopped: bool = False
    step_start: float | None = None
    inbox: deque[_Item] = field(default_factory=deque)
    pending: set[int] = field(default_factory=set)
    routed: int = 0
    finishes: list[float] = field(default_factory=list)  # client-side, sorted
    step_ends: list[float] = field(default_factory=list)
    kv_usage: list[float] = field(default_factory=list)
    busy_s: float = 0.0
    link_free: float = 0.0  # when its incoming KV link is next free
    coupled: list[_Instance] = field(default_factory=list)  # whose finishes may send it work
    prefilling: dict[int, _Item] = field(default_factory=dict)
    steps: Recorder | None = None  # its step rows

    def outstanding(self, t: float) -> int:
        return self.routed - bisect_right(self.finishes, t)

    def kv_at(self, t: float) -> float:
        k = bisect_right(self.step_ends, t)
        return self.kv_usage[k - 1] if k else 0.0


def run_cluster(
    spec: ClusterSpec,
    trace: Trace,
    *,
    arrivals: ArrivalSpec = ALL_AT_ONCE,
    seed: int = 0,
    stretches: bool = True,
    timeout_s: float | None = None,
    horizon_s: float | None = None,
) -> ClusterResult:
    """Replay ``trace`` through the deployment ``spec`` on a virtual clock (the options
    mean what they mean for ``run_simulated``)."""
    with _cyclic_gc_paused():
        return _ClusterRun(spec, trace, arrivals, seed, stretches, timeout_s, horizon_s).run()


def _make_instance(j: int, spec: InstanceSpec, timeout_s: float | None, trace: Trace) -> _Instance:
    from slotune.engine.engine import Engine
    from slotune.engine.sim import SimExecutor

    if spec.pp > 1:
        from slotune.engine.sim.pipeline import PipelineSimExecutor

        executor = PipelineSimExecutor(
            spec.gpu,
            spec.model,
            spec.tp,
            spec.stack,
            pp=spec.pp,
            micro_batches=spec.micro_batches,
            quantization=spec.quantization,
        )
        engine = Engine(spec.config, executor)
    else:
        from slotune.workloads.backends import SimBackend

        backend = SimBackend(spec.gpu, spec.model, spec.tp, spec.ep, spec.quantization, spec.stack)
        engine = backend.engine(spec.config)
    n = len(trace)
    stack = cast(SimExecutor, engine.executor).stack
    lat = stack.request_latency_s
    # the client's clock runs request_latency_s ahead of the engine's (as run_simulated)
    timeout = None if timeout_s is None else max(timeout_s - lat, 1e-9)
    x = _Instance(j, spec, engine, lat, stack.schedule_ahead, Deadlines(timeout, n))
    x.steps = Recorder(trace)
    return x


class _ClusterRun:
    def __init__(
        self,
        spec: ClusterSpec,
        trace: Trace,
        arrivals: ArrivalSpec,
        seed: int,
        stretches: bool,
        timeout_s: float | None,
        horizon_s: float | None,
    ) -> None:
        self.spec = spec
        self.trace = trace
        self.stretches = stretches
        self.horizon_s = horizon_s
        self.insts = [_make_instance(j, s, timeout_s, trace) for j, s in enumerate(spec.instances)]
        self.front = [x for x in self.insts if x.spec.role != "decode"]
        self.back = [x for x in self.insts if x.spec.role == "decode"]
        self.router = Router(spec.router, len(self.front))
        self.back_router = Router(RouterSpec("least-outstanding"), max(len(self.back), 1))
        self.disp: Dispatcher[list[int]] = Dispatcher(
            trace, arrivals, TokenPrompts(trace), seed=seed
        )
        self.rec = Recorder(trace)
        self.keep_output = self.disp.has_children
        self.capped = arrivals.concurrency is not None
        self.stop_at_finish = any(self.keep_output) or self.capped
        for x in self.insts:
            if self.stop_at_finish:
                x.coupled = [o for o in self.insts if o is not x]
            elif x.spec.role == "decode":
                x.coupled = list(self.front)
        self.outputs: dict[int, list[int]] = {}
        self.events: list[tuple[float, int, int, Any]] = []  # (time, seq, kind, payload)
        self._seq = 0
        self.decisions: list[Decision] = []
        self.transfers: list[Transfer] = []
        self.prefill_cached: dict[int, tuple[int, int]] = {}  # cached tokens, preemptions

    # -- events --------------------------------------------------------------------------

    _DECIDE, _LAND = 0, 1

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, payload))

    def _next_event(self) -> float | None:
        return earliest(self.disp.next_time(), self.events[0][0] if self.events else None)

    def run(self) -> ClusterResult:
        disp, horizon = self.disp, self.horizon_s
        end_time: float | None = None
        while True:
            t_ev = self._next_event()
            busy = [x for x in self.insts if x.active]
            inst = min(busy, key=lambda x: (x.t, x.index)) if busy else None
            if t_ev is not None and (inst is None or t_ev <= inst.t):
                if horizon is not None and t_ev >= horizon and inst is None:
                    # nothing runs and nothing more is sent: an idle engine's clock
                    # would wait for this arrival, then stop
                    if not any(x.stopped for x in self.insts):
                        end_time = t_ev
                    break
                self._handle_events(t_ev)
                continue
            if inst is None:
                if disp.done() and not self.events:
                    break
                raise RuntimeError("cluster: requests in flight but no instance has work")
            self._act(inst)
        ends = [x.t + x.latency_s for x in self.insts]
        duration = max(ends)
        if end_time is not None:
            duration = max(duration, end_time + self.insts[0].latency_s)
        if horizon is not None:
            for rel in disp.pop_due(horizon):  # sent before the horizon, never routed
                self.rec.sent(rel.index, rel.arrival_time, len(rel.prompt))
        for i in self.rec.pending():  # in transit at the horizon
            self._end(i, None, duration, error=UNFINISHED_ERROR)
        return self._result(duration)

    def _handle_events(self, t: float) -> None:
        """Everything due at ``t``: arrivals first (a tie goes to the arrival, as an
        engine takes a request that arrives as a step ends), then handoffs."""
        self._arrive(t)
        while self.events and self.events[0][0] <= t:
            when, _, kind, payload = heapq.heappop(self.events)
            if kind == self._DECIDE:
                self._hand_over(when, *payload)
            else:
                inst, item = payload
                self._deliver(inst, item, when)

    def _arrive(self, t: float, polled: bool = False) -> None:
        """Route what the dispatcher sends at ``t`` (``polled``: as an instance takes its
        requests). A flow that waited for a free concurrency slot joins its instance's
        next step, whatever its send time, as in ``drive_engine``."""
        for rel in self.disp.pop_due(t):
            x = self._route(rel.index, rel.prompt, t)
            waited = self.capped and self.trace.requests[rel.index].parent_id is None
            waited = waited and (polled or rel.arrival_time != t)
            item = _Item(
                -math.inf if waited else rel.arrival_time,
                rel.index,
                rel.request_id,
                rel.prompt,
                rel.max_tokens,
                rel.arrival_time,
            )
            self._deliver(x, item, t)

    def _route(self, i: int, prompt: list[int], t: float) -> _Instance:
        insts = self.front
        j, reason, matched = self.router.choose(
            prompt, [x.outstanding(t) for x in insts], [x.kv_at(t) for x in insts]
        )
        x = insts[j]
        x.routed += 1
        self.decisions.append(Decision(t, i, x.index, reason, matched))
        return x

    def _deliver(self, x: _Instance, item: _Item, t: float) -> None:
        """Put ``item`` in ``x``'s inbox at ``t``; an idle instance wakes then."""
        if x.stopped:
            return
        x.inbox.append(item)
        if not x.active:
            x.active = True
            x.t = max(x.t, t)

    def _hand_over(self, t: float, p: _Instance, item: _Item) -> None:
        """A prefill finished (the router hears of it at ``t``): pick a decode instance and
        queue the prompt's KV on its link."""
        from slotune.engine.sim.capacity import kv_bytes
        from slotune.engine.sim.executor import SimExecutor

        back = self.back
        j, _, _ = self.back_router.choose(item.prompt, [x.outstanding(t) for x in back], [])
        d = back[j]
        d.routed += 1
        cfg = p.spec.config
        model = cast(SimExecutor, p.engine.executor).model
        size = kv_bytes(model, len(item.prompt), cfg.block_size, cfg.kv_cache_dtype)
        start = max(t, d.link_free)
        ready = start + self.spec.link.seconds(size, min(p.spec.tp, d.spec.tp))
        d.link_free = ready
        self.transfers.append(Transfer(item.index, p.index, d.index, size, start, ready, t))
        item.ready = ready
        item.external = len(item.prompt) - 1
        self._push(ready, self._LAND, (d, item))

    # -- one instance --------------------------------------------------------------------

    def _act(self, x: _Instance) -> None:
        """One turn of ``drive_engine``'s loop for instance ``x`` at its clock."""
        now = x.t
        engine = x.engine
        if self.horizon_s is not None and now >= self.horizon_s:
            for item in x.inbox:  # sent during its last step: in flight
                if not item.external and item.arrival <= self.horizon_s:
                    self.rec.sent(item.index, item.arrival, len(item.prompt))
                    x.pending.add(item.index)
            for i in sorted(x.pending):
                self._end(i, x, now, error=UNFINISHED_ERROR)
            x.stopped, x.active = True, False
            return
        busy = x.schedule_ahead and x.step_start is not None and engine.has_unfinished_requests()
        cut = x.step_start if busy and x.step_start is not None else now
        if self.capped:
            self._arrive(cut, polled=True)  # flows that finishes let start
        self._take(x, cut, now)
        if not engine.has_unfinished_requests():
            x.active = False
            return
        stretch = None
        if self.stretches:
            waiting = x.inbox[0].ready if x.inbox else None  # due after this step
            until = earliest(self._next_event(), x.deadlines.next_time(), waiting, self.horizon_s)
            for o in x.coupled:
                if o.active:
                    until = o.t if until is None else min(until, o.t)
            stretch = engine.run_stretch(now, until, stop_at_finish=self.stop_at_finish)
        if stretch is not None:
            pairs = stretch
            steps = engine.last_steps
        else:
            pairs = [(out, 0) for out in engine.step()]
            steps = [engine.last_step] if engine.last_step is not None else []
        times = _advance(x, steps)
        now = times[-1] if times else now
        lat = x.latency_s
        seen = [lat + t for t in times] if lat else times
        prefill = x.spec.role == "prefill"
        index = self.rec.index
        ended = []
        for out, first in pairs:
            i = index[out.request_id]
            new = out.new_token_ids
            if new and not prefill:
                self.rec.token_times[i].extend(seen[first : first + len(new)])
                if self.keep_output[i]:
                    self.outputs[i].extend(new)
            if out.finished:
                ended.append((first + len(new), i, out))
        if ended:
            ended.sort(key=_end_step)
            for last, i, out in ended:
                finish = times[last - 1] if last else now
                if x.deadlines.missed(i, finish):
                    self._give_up(i, x)
                    continue
                if prefill and out.finish_reason != "abort":
                    self._prefilled(i, x, finish, out)
                    continue
                cached, preempted = self.prefill_cached.pop(i, (0, 0))
                self._end(
                    i,
                    x,
                    finish,
                    error="aborted" if out.finish_reason == "abort" else None,
                    cached_tokens=out.num_cached_tokens + cached,
                    preemptions=out.num_preemptions + preempted,
                    prompt_tokens=out.num_prompt_tokens or None,
                )
        for i in x.deadlines.pop_expired(now):
            engine.abort_request(self.trace.requests[i].request_id)
            self._give_up(i, x)

    def _take(self, x: _Instance, cut: float, now: float) -> None:
        """What ``drive_engine``'s ``due`` does: the inbox's requests ready by ``cut``."""
        inbox, rec, engine = x.inbox, self.rec, x.engine
        prefill = x.spec.role == "prefill"
        while inbox and inbox[0].ready <= cut:
            item = inbox.popleft()
            i = item.index
            if not item.external:
                rec.sent(i, item.arrival, len(item.prompt))
            if self.keep_output[i] and not prefill:
                self.outputs[i] = []
            try:
                req = engine.new_request(
                    item.request_id,
                    item.prompt,
                    exact_length(1 if prefill else item.max_tokens),
                    arrival_time=item.ready,
                )
            except ValueError as exc:
                x.pending.add(i)
                self._end(i, x, now, error=f"rejected: {exc}")
                continue
            req.num_external_tokens = item.external
            x.deadlines.start(i, item.arrival)
            x.pending.add(i)
            if prefill:
                x.prefilling[i] = item
            engine.enqueue(req)

    def _prefilled(self, i: int, x: _Instance, finish: float, out: Any) -> None:
        item = x.prefilling.pop(i)
        x.deadlines.resolve(i)
        x.pending.discard(i)
        seen = finish + x.latency_s
        insort(x.finishes, seen)
        self.prefill_cached[i] = (out.num_cached_tokens, out.num_preemptions)
        self._push(seen, self._DECIDE, (x, item))

    def _give_up(self, i: int, x: _Instance) -> None:
        """The client gave up at the deadline: keep what had arrived by then."""
        deadline = x.deadlines.at[i]
        times = self.rec.token_times[i]
        seen_by = x.latency_s + deadline
        while times and times[-1] > seen_by:
            times.pop()
        if self.keep_output[i]:
            del self.outputs[i][len(times) :]
        self._end(i, x, deadline, error=TIMEOUT_ERROR, output_tokens=len(times))

    def _end(self, i: int, x: _Instance | None, now: float, **kw: Any) -> None:
        """Request ``i`` ended on ``x`` at engine time ``now`` (None: in transit, at client
        time ``now``)."""
        seen = now
        if x is not None:
            x.deadlines.resolve(i)
            x.pending.discard(i)
            seen = now + x.latency_s
            insort(x.finishes, seen)
            if x.spec.role == "prefill":
                x.prefilling.pop(i, None)
        if kw.get("error") in (UNFINISHED_ERROR, TIMEOUT_ERROR) and "output_tokens" not in kw:
            kw["output_tokens"] = len(self.rec.token_times[i])
        self.rec.done(i, seen, **kw)
        self.disp.finish(i, seen, self.outputs.pop(i, []))

    def _result(self, duration: float) -> ClusterResult:
        insts = self.insts
        if len(insts) == 1:
            stats = dict(insts[0].engine.stats())
        else:
            stats = {}
            for x in insts:
                for k, v in x.engine.stats().items():
                    if isinstance(v, int | float):
                        stats[k] = stats.get(k, 0) + v
        stats["stack"] = _stack_name(insts[0])
        result = self.rec.result(duration, stats)
        result = _with_steps(result, insts)
        return ClusterResult(
            self.spec,
            result,
            tuple(
                InstanceStats(
                    x.index,
                    x.spec.role,
                    x.spec.num_gpus,
                    x.busy_s,
                    len(x.step_ends),
                    x.routed,
                    x.engine.stats(),
                )
                for x in insts
            ),
            tuple(self.decisions),
            tuple(self.transfers),
        )


def _stack_name(x: _Instance) -> str:
    from slotune.engine.sim.executor import SimExecutor

    return cast(SimExecutor, x.engine.executor).stack.name


def _advance(x: _Instance, steps: list[StepStats]) -> list[float]:
    """Advance the instance's clock by each step in turn (as ``VirtualClock``); the ends."""
    t = x.t
    ends = []
    for s in steps:
        t += s.duration_s
        ends.append(t)
        x.busy_s += s.duration_s
    x.t = t
    if steps:
        x.step_start = t - steps[-1].duration_s
        x.step_ends.extend(ends)
        x.kv_usage.extend(s.kv_cache_usage for s in steps)
        assert x.steps is not None
        x.steps.steps(ends, steps)
    return ends


def _with_steps(result: RunResult, insts: list[_Instance]) -> RunResult:
    """The run's step rows: every instance's, in time order (with an ``instance`` column
    when there are several)."""
    import pandas as pd

    frames = []
    for x in insts:
        assert x.steps is not None
        frame = x.steps.steps_frame()
        if len(insts) > 1:
            frame["instance"] = x.index
        frames.append(frame)
    if len(frames) == 1:
        return replace(result, steps=frames[0])
    steps = pd.concat(frames, ignore_index=True).sort_values("time", kind="stable")
    return replace(result, steps=steps.reset_index(drop=True))
