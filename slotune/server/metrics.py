"""Prometheus metrics under vLLM's names, so that its dashboards and AIPerf read them.

Gauges (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``) follow the engine after each step; counters (prompt and
generation tokens, prefix-cache queries and hits in tokens, preemptions, finished requests
by reason) and histograms (TTFT, inter-token latency, end-to-end latency, queue time) follow
requests. Times come from the clock the engine loop passes in: the wall clock for a real
model, the virtual clock (summed simulated step durations) for a simulated one, so that a
simulated server's histograms hold simulated times. Histogram counts: TTFT and queue time
one per request that got that far, inter-token latency one per later token, end-to-end
one per request that finished (not aborted). ``slotune:engine_step_seconds`` sums the
engine's step durations (simulated ones on a simulated GPU), to set against wall time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from slotune.engine.engine import Engine
from slotune.engine.outputs import RequestOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets (vllm/v1/metrics/loggers.py)
_TTFT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
)
_TTFT_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
)
_ITL_BUCKETS += (2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
)
_LATENCY_BUCKETS += (50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass
class _Timing:
    arrival: float
    num_prompt_tokens: int
    open_completions: int
    first_token: bool = False
    last_token: dict[int, float] = field(default_factory=dict)  # completion index -> time


class ServerMetrics:
    """One registry per server (tests run several in one process)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self._requests: dict[str, _Timing] = {}
        self._unscheduled: dict[str, float] = {}  # request id -> arrival
        self._engine_counts = (0, 0, 0)  # preemptions, prefix queries, prefix hits so far
        r, labels = self.registry, ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(model_name)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Share of KV-cache blocks in use (0-1).")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found there.")
        self.preemptions = counter("vllm:num_preemptions", "Preemptions of running requests.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of served requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self._success = Counter(
            "vllm:request_success",
            "Requests finished, by reason.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self._model_name = model_name
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Time between tokens.", _ITL_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds", "Arrival to first scheduled.", _LATENCY_BUCKETS
        )
        self.step_seconds = counter(
            "slotune:engine_step_seconds",
            "Summed engine step durations: simulated seconds on a simulated GPU.",
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # -- what the engine loop reports --------------------------------------------------------

    def admitted(self, request_id: str, num_prompt_tokens: int, n: int, now: float) -> None:
        self._requests[request_id] = _Timing(now, num_prompt_tokens, n)
        self._unscheduled[request_id] = now

    def aborted(self, request_id: str, now: float, finished: bool) -> None:
        """``finished``: the server ended it for its client (a stop string), as a stop."""
        self._unscheduled.pop(request_id, None)
        t = self._requests.pop(request_id, None)
        if t is None:
            return
        if finished:
            self.e2e.observe(now - t.arrival)
        self._success.labels(self._model_name, "stop" if finished else "abort").inc()

    def stepped(self, engine: Engine, step_start: float, duration_s: float) -> None:
        """After a step: requests it scheduled for the first time leave the queue."""
        self.step_seconds.inc(duration_s)
        live = engine.scheduler.requests
        for rid, arrival in list(self._unscheduled.items()):
            req = live.get(rid)
            if req is None or req.num_computed_tokens > 0:
                del self._unscheduled[rid]
                self.queue.observe(max(step_start - arrival, 0.0))

    def output(self, out: RequestOutput, now: float) -> None:
        t = self._requests.get(out.request_id)
        if t is None:
            return
        n = len(out.new_token_ids)
        self.generation_tokens.inc(n)
        if n:
            if not t.first_token:
                t.first_token = True
                self.ttft.observe(now - t.arrival)
                self.prompt_tokens.inc(t.num_prompt_tokens)
            elif out.index in t.last_token:
                self.itl.observe(now - t.last_token[out.index])
            t.last_token[out.index] = now
        if out.finished:
            t.open_completions -= 1
            if t.open_completions <= 0:
                del self._requests[out.request_id]
                self.e2e.observe(now - t.arrival)
                self._success.labels(self._model_name, out.finish_reason or "stop").inc()

    def engine_state(self, engine: Engine, num_queued: int) -> None:
        """Gauges and engine-wide counters; ``num_queued``: requests not yet handed to it."""
        s = engine.scheduler
        kv = engine.kv_cache
        self.running.set(len(s.running))
        self.waiting.set(len(s.waiting) + num_queued)
        self.kv_usage.set(kv.usage)
        counts = (s.num_preemptions, kv.prefix_cache_queries_tokens, kv.prefix_cache_hit_tokens)
        before, self._engine_counts = self._engine_counts, counts
        for counter, now, then in zip(
            (self.preemptions, self.prefix_queries, self.prefix_hits), counts, before, strict=True
        ):
            if now > then:
                counter.inc(now - then)
