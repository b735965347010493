"""Driving an in-process ``Engine``: on a virtual clock (simulated executor) or the wall clock.

One loop serves both. Virtual time: each step advances the clock by the executor's
``last_step.duration_s``; requests whose arrival passed during a step are added after it
(their arrival time stays the true one, so the wait counts in their TTFT); an idle engine
jumps to the next arrival. Nothing sleeps. On a virtual clock the engine may also run a
whole stretch of steps at once (``Engine.run_stretch``): up to the next arrival, or on
through the arrivals (handed to it as they fall due) when no finish can release a
request (no sessions, no concurrency cap). Each covered step is recorded and each token
gets its own step's end time, exactly as if the steps had run one by one. Wall time: the
same loop, the clock is ``perf_counter`` and an idle engine sleeps until the next arrival.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from slotune.engine.sampling_params import exact_length
from slotune.workloads.arrivals import ALL_AT_ONCE, ArrivalSpec
from slotune.workloads.result import RunResult
from slotune.workloads.runner.dispatch import Dispatcher
from slotune.workloads.runner.record import Recorder
from slotune.workloads.runner.timeouts import (
    TIMEOUT_ERROR,
    UNFINISHED_ERROR,
    Deadlines,
    earliest,
)
from slotune.workloads.trace import Trace

if TYPE_CHECKING:
    from slotune.engine.config import EngineConfig
    from slotune.engine.engine import Engine
    from slotune.engine.outputs import StepStats
    from slotune.engine.request import Request
    from slotune.engine.sim.profile import GpuProfile
    from slotune.engine.sim.stack import StackProfile

Progress = Callable[[int, int], None]


def _end_step(entry: tuple[int, int, Any]) -> int:
    return entry[0]


class VirtualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def wait_until(self, t: float) -> None:
        if t > self.t:
            self.t = t

    def advance_steps(self, steps: list[StepStats]) -> list[float]:
        """Advance by each step's duration in turn; the times the steps end."""
        t = self.t
        ends = []
        for step in steps:
            t += step.duration_s
            ends.append(t)
        self.t = t
        return ends


class WallClock:
    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def advance(self, seconds: float) -> None:
        """The step itself took the time."""

    def wait_until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def advance_steps(self, steps: list[StepStats]) -> list[float]:
        """The steps took the time: they all end now."""
        return [self.now()] * len(steps)


class _Feed:
    """The dispatcher's arrivals as ``Engine.run_stretch`` takes them."""

    def __init__(
        self,
        disp: Dispatcher[list[int]],
        due: Callable[[float], list[Request]],
        at_step_start: bool,
    ):
        self.next_time = disp.next_time
        self.due = due
        self.at_step_start = at_step_start


class TokenPrompts:
    """Token-id prompts: a turn's prompt is its parent's prompt + output + its own tokens."""

    def __init__(self, trace: Trace) -> None:
        self._own = trace.own_prompt_token_ids()

    def prompt(self, index: int, parent_context: list[int] | None) -> list[int]:
        """The trace's own list for a first turn (the engine copies what it keeps)."""
        own = self._own[index]
        return own if parent_context is None else parent_context + own

    def context_after(self, prompt: list[int], output: list[int]) -> list[int]:
        return prompt + output


def run_simulated(
    config: EngineConfig,
    trace: Trace,
    *,
    gpu: str | GpuProfile = "h100",
    model: str = "llama-3-8b",
    tp: int = 1,
    stack: str | StackProfile | None = None,
    arrivals: ArrivalSpec = ALL_AT_ONCE,
    seed: int = 0,
    progress: Progress | None = None,
    stretches: bool = True,
    timeout_s: float | None = None,
    quantization: str | None = None,
    ep: int = 1,
    horizon_s: float | None = None,
) -> RunResult:
    """Replay ``trace`` through the simulated engine on a virtual clock (``quantization``
    overrides the model's weight format; ``ep``: expert-parallel GPUs of a MoE model).

    ``stack`` is the serving engine around the kernels (default: current vLLM V1); its
    per-request costs outside the engine delay every client-side time of a request (the
    result's token, first-token and finish times, and its duration). ``stretches`` runs
    stretches of steps planned in advance at once (``Engine.run_stretch``); the result is
    identical either way, only faster. Turn it off to debug or compare.
    ``timeout_s``: the client gives up on a request this long after sending it (see
    ``runner.timeouts``); None waits for ever. ``horizon_s``: the run ends at this time
    (engine clock); requests still in flight then fail as unfinished, those not yet sent
    stay unsent.
    """
    from slotune.engine.engine import Engine
    from slotune.engine.sim import SimExecutor

    engine = Engine.simulated(
        config, gpu=gpu, model=model, tp=tp, stack=stack, quantization=quantization, ep=ep
    )
    stack = cast(SimExecutor, engine.executor).stack
    with _cyclic_gc_paused():
        result = drive_engine(
            engine,
            trace,
            arrivals,
            VirtualClock(),
            seed=seed,
            progress=progress,
            stretches=stretches,
            client_latency_s=stack.request_latency_s,
            # the client's clock runs request_latency_s ahead of the engine's
            timeout_s=None if timeout_s is None else max(timeout_s - stack.request_latency_s, 1e-9),
            horizon_s=horizon_s,
            schedule_ahead=stack.schedule_ahead,
        )
        del engine  # see _cyclic_gc_paused
    result.engine_stats["stack"] = stack.name
    return result


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a simulation runs.

    A run allocates millions of short-lived containers (token lists, outputs) but leaves no
    cyclic garbage until the engine itself is dropped; the collector's passes over the
    growing heap then cost a quarter of the run for nothing. Reference counting still frees
    everything as usual; the collector resumes (and finds the engine's cycles) afterwards.
    The engine goes before it resumes: the requests an overloaded run leaves in it hold
    long token lists, which its first pass would scan (0.12 s after an hour's replay,
    against 0.07 s to drop the engine and then collect its cycles).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run_engine(
    engine: Engine,
    trace: Trace,
    arrivals: ArrivalSpec = ALL_AT_ONCE,
    *,
    seed: int = 0,
    progress: Progress | None = None,
    timeout_s: float | None = None,
) -> RunResult:
    """Replay ``trace`` through an in-process engine with a real executor, in wall time.
    An executor that can say what its steps ran on (``TorchExecutor.hardware``) records it
    under ``engine_stats["hardware"]``, after the run."""
    result = drive_engine(
        engine, trace, arrivals, WallClock(), seed=seed, progress=progress, timeout_s=timeout_s
    )
    hardware = getattr(getattr(engine, "executor", None), "hardware", None)
    if callable(hardware):
        result.engine_stats["hardware"] = hardware()
    return result


def drive_engine(
    engine: Engine,
    trace: Trace,
    arrivals: ArrivalSpec,
    clock: VirtualClock | WallClock,
    *,
    seed: int = 0,
    progress: Progress | None = None,
    stretches: bool = False,
    client_latency_s: float = 0.0,
    timeout_s: float | None = None,
    horizon_s: float | None = None,
    schedule_ahead: bool = False,
) -> RunResult:
    """The loop of both clocks. ``stretches`` need a virtual clock: a stretch of steps
    is computed before its time has passed. ``client_latency_s`` is how much later than
    the engine a client learns of a finish (so a session's next turn starts that much
    later), and every recorded token and finish time (and the duration) is the client's. With
    ``timeout_s`` a stretch also ends at the next deadline, where the timed-out requests
    are aborted. With ``schedule_ahead`` (a scheduler that plans each step while the one
    before runs, as vLLM V1's async scheduling does) a request that arrives while the
    engine is busy joins after the step that starts after it arrived, not the one it
    arrived in; an idle engine takes it at once. At ``horizon_s`` (or the first step end
    after it) the run stops: what is still in flight fails as unfinished."""
    if stretches and not isinstance(clock, VirtualClock):
        raise ValueError("drive_engine: stretches need a VirtualClock")
    disp: Dispatcher[list[int]] = Dispatcher(trace, arrivals, TokenPrompts(trace), seed=seed)
    rec = Recorder(trace, client_latency_s)
    keep_output = disp.has_children
    classes = [(r.priority, r.tier) for r in trace.requests]
    # a first turn's prompt is the trace's own, checked once for the whole trace
    checked = [
        ok and r.parent_id is None
        for ok, r in zip(trace.prompts_checked(), trace.requests, strict=True)
    ]
    # a finish may release a turn or a capped flow: a stretch must not run past it
    stop_at_finish = any(keep_output) or arrivals.concurrency is not None
    outputs: dict[int, list[int]] = {}
    index = rec.index
    token_times = rec.token_times
    total = len(trace)
    deadlines = Deadlines(timeout_s, total)

    def end(i: int, now: float, **kw: Any) -> None:
        deadlines.resolve(i)
        rec.done(i, now, **kw)
        disp.finish(i, rec.seen_at(now), outputs.pop(i, []))
        if progress is not None:
            progress(rec.num_done, total)

    def give_up(i: int) -> None:
        """The client gave up at the deadline: keep what had arrived by then."""
        deadline = deadlines.at[i]
        times = token_times[i]
        seen_by = rec.seen_at(deadline)
        while times and times[-1] > seen_by:
            times.pop()
        if keep_output[i]:
            del outputs[i][len(times) :]
        end(i, deadline, error=TIMEOUT_ERROR, output_tokens=len(times))

    def due(now: float) -> list[Request]:
        """Send what is due by ``now``: the engine's requests (rejected ones end here)."""
        requests = []
        for rel in disp.pop_due(now):
            i = rel.index
            rec.sent(i, rel.arrival_time, len(rel.prompt))
            if keep_output[i]:
                outputs[i] = []
            try:
                requests.append(
                    engine.new_request(
                        rel.request_id,
                        rel.prompt,
                        exact_length(rel.max_tokens),
                        arrival_time=rel.arrival_time,
                        priority=classes[i][0],
                        tier=classes[i][1],
                        tokens_checked=checked[i],
                    )
                )
            except ValueError as exc:
                end(i, now, error=f"rejected: {exc}")
                continue
            deadlines.start(i, rel.arrival_time)
        return requests

    # without finishes that release requests, a stretch runs on through arrivals, up to
    # the horizon or the first deadline: requests are sent in arrival order, so one taken
    # in during the stretch has no earlier deadline than those already in the engine
    feed = _Feed(disp, due, schedule_ahead) if stretches and not stop_at_finish else None
    step_start: float | None = None  # of the last step run, while the engine stays busy
    while True:
        now = clock.now()
        if horizon_s is not None and now >= horizon_s:
            for rel in disp.pop_due(horizon_s):  # sent during the last step: in flight
                rec.sent(rel.index, rel.arrival_time, len(rel.prompt))
            for i in rec.pending():
                end(i, now, error=UNFINISHED_ERROR, output_tokens=len(token_times[i]))
            break
        busy = schedule_ahead and step_start is not None and engine.has_unfinished_requests()
        for request in due(step_start if busy and step_start is not None else now):
            engine.enqueue(request)
        if not engine.has_unfinished_requests():
            nxt = disp.next_time()
            if nxt is None:
                if disp.done():
                    break
                raise RuntimeError("runner: requests in flight but the engine has none unfinished")
            clock.wait_until(nxt)
            continue
        if (
            stretches
            and (
                stretch := engine.run_stretch(
                    now,
                    earliest(
                        horizon_s,
                        deadlines.next_time(),
                        None if feed is not None else disp.next_time(),
                    ),
                    stop_at_finish=stop_at_finish,
                    arrivals=feed,
                )
            )
            is not None
        ):
            pairs = stretch
            steps = engine.last_steps
        else:
            pairs = [(out, 0) for out in engine.step()]
            steps = [engine.last_step] if engine.last_step is not None else []
        times = clock.advance_steps(steps)
        if steps:
            step_start = times[-1] - steps[-1].duration_s
        rec.steps(times, steps)
        now = times[-1] if times else clock.now()
        seen = list(map(rec.seen_at, times)) if client_latency_s else times
        ended = []
        for out, first in pairs:
            i = index[out.request_id]
            new = out.new_token_ids
            # one token a step from ``first`` on; a speculative step's extra tokens share it
            span = min(len(new), len(seen) - first)
            if new:
                at = seen[first : first + span]
                token_times[i].extend(at + at[-1:] * (len(new) - span))
                if keep_output[i]:
                    outputs[i].extend(new)
            if out.finished:
                ended.append((first + span, i, out))
        if ended:
            ended.sort(key=_end_step)  # in step order, as single steps would report them
            for last, i, out in ended:
                finish = times[last - 1] if last else now
                if deadlines.missed(i, finish):
                    give_up(i)
                    continue
                end(
                    i,
                    finish,
                    error="aborted" if out.finish_reason == "abort" else None,
                    cached_tokens=out.num_cached_tokens,
                    preemptions=out.num_preemptions,
                    prompt_tokens=out.num_prompt_tokens or None,
                )
        for i in deadlines.pop_expired(now):
            engine.abort_request(trace.requests[i].request_id)
            give_up(i)
    return rec.result(clock.now(), engine.stats())
