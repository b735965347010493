"""What the engine returns to its caller each step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(slots=True)
class RequestOutput:
    """New tokens of one completion. ``index`` is the completion within an ``n > 1`` request."""

    request_id: str
    index: int
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    logprobs: Sequence[float] = ()  # a list when the executor reports them
    # with ``SamplingParams.logprobs = k``: per new token, the k most likely token ids of
    # its distribution and their logprobs, most likely first
    top_logprobs: Sequence[dict[int, float]] = ()


class StepStats(NamedTuple):
    """One engine step, as the runner records it. Immutable; a named tuple because the
    simulator builds one per step, tens of thousands per run, and a tuple is built fastest
    (and turned into columns fastest)."""

    duration_s: float
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # share of GPU blocks referenced by requests
    num_preempted: int
    decode_context_sum: int = 0  # KV tokens the step's decodes read (0: executor did not say)
    prefill_context_sum: int = 0  # KV tokens its prefill chunks attend to (prior + chunk)
