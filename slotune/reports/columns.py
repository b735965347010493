"""Column names of the stored per-request and per-step tables, in one place.

Keys are the names the report code uses; values are the column names the workload runner
writes to ``requests.csv`` and ``steps.csv``. If the runner renames a column, change the
value here and nothing else.
"""

from __future__ import annotations

REQUEST_COLUMNS: dict[str, str] = {
    "request_id": "request_id",
    "arrival": "arrival_time",
    "first_token": "first_token_time",
    "token_times": "token_times",
    "finish": "finish_time",
    "prompt_tokens": "prompt_tokens",
    "output_tokens": "output_tokens",
    "cached_tokens": "cached_tokens",
    "preemptions": "num_preemptions",
    "error": "error",
}

STEP_COLUMNS: dict[str, str] = {
    "time": "time",
    "scheduled": "num_scheduled_tokens",
    "prefill": "num_prefill_tokens",
    "decode": "num_decode_tokens",
    "running": "num_running",
    "waiting": "num_waiting",
    "kv_usage": "kv_cache_usage",
    "step_time": "duration_s",
    "preempted": "num_preempted",
    "decode_context": "decode_context_sum",
    "prefill_context": "prefill_context_sum",
}

TRACE_PREFIX_SHARING_KEYS: tuple[str, ...] = (
    "prefix_sharing_ratio",
    "shares_prefixes",
    "shared_prefix_fraction",
    "prefix_share",
    "prefix_sharing",
    "shared_prefix_ratio",
)
"""Keys of a trace's statistics that say whether its prompts share prefixes (bool or share).

``prefix_sharing_ratio`` is what ``slotune.workloads.Trace.stats`` writes."""
PREFIX_SHARING_MIN = 0.10
"""A trace "shares prefixes" when at least this share of its prompt tokens is shareable."""
