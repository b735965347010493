"""What the scheduler decided for one step: the contract between scheduler and executors."""

from __future__ import annotations

from dataclasses import dataclass, field

from slotune.engine.request import Request


@dataclass
class SchedulerOutput:
    """One step's batch.

    ``num_scheduled_tokens`` is in batch order (running requests first, then new ones).
    While an executor runs, each scheduled request's ``num_computed_tokens`` is still the
    count *before* this step; its scheduled tokens are
    ``request.all_token_ids[num_computed_tokens : num_computed_tokens + n]``. A request
    samples when that chunk reaches the end of its tokens; ``num_samples`` says how many
    tokens to sample for it (``n`` at the end of a prompt of an ``n > 1`` request, which
    the engine then forks; otherwise 1).

    Block copies must be performed in this order, before the step's compute:
    ``swap_out`` (gpu block -> cpu block), ``swap_in`` (cpu block -> gpu block),
    ``copy_on_write`` (src gpu block -> dst gpu block).

    ``requests`` and ``block_tables`` are live views owned by the scheduler and the KV-cache
    manager: index them with the ids of ``num_scheduled_tokens`` during ``execute`` (they
    may hold other requests too, and change after the step); copy what you keep.
    ``spec_token_ids[rid]`` is the draft of a decoding request that speculates: its
    scheduled tokens are its last token then the draft, and the executor samples at each of
    them and returns the verified tokens (``slotune.engine.spec_decode.verified``).
    ``resumed_request_ids`` names requests that were preempted before (recompute: they
    restart from a prefix-cache hit or token 0; swap: their blocks come back through
    ``swap_in``).
    """

    requests: dict[str, Request] = field(default_factory=dict)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    token_budget: int = 0  # the step's budget: max_num_batched_tokens, or adaptive chunking's
    num_prefill_tokens: int = 0  # of the total: tokens of requests still in a (re)prefill
    block_tables: dict[str, list[int]] = field(default_factory=dict)
    num_samples: dict[str, int] = field(default_factory=dict)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    new_request_ids: list[str] = field(default_factory=list)
    resumed_request_ids: list[str] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    finished_request_ids: set[str] = field(default_factory=set)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copy_on_write: list[tuple[int, int]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0
