"""A request inside the engine: its tokens and how far their KV has been computed.

As in vLLM V1 there is no prefill or decode phase: a request simply has
``num_computed_tokens`` catching up with ``num_tokens`` (prompt plus output so far).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from slotune.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # recompute: waits again, KV freed
    SWAPPED = "swapped"  # swap: waits again, KV held in the CPU pool
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = frozenset(
    {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}
)


@dataclass(eq=False)
class Request:
    """One sequence. A request with ``n > 1`` is forked into ``n`` of these after its prompt.

    ``request_id`` is the engine-internal id (``"{parent}#{index}"`` for forked children);
    ``parent_id`` and ``index`` name the user's request and the completion within it.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    eos_token_id: int | None = None
    parent_id: str = ""
    index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache on first schedule
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    # prompt tokens whose KV another instance computed and sent (prefill/decode
    # disaggregation): a first admission takes their blocks without computing them
    num_external_tokens: int = 0
    priority: int = 0  # scheduling_policy="priority": lower runs first (vLLM's convention)
    tier: int = 0  # service tier: 0 the highest (pro), larger ones (free) below it
    queue_seq: int = -1  # when it first joined a priority queue (ties keep that order)
    boosted: bool = False  # decode budget: it waited past its TPOT target once preempted
    preempted_at: float = 0.0  # the scheduler's clock when it was last preempted

    def __post_init__(self) -> None:
        if not self.parent_id:
            self.parent_id = self.request_id
        # the prompt list itself until the request is seated (``own_token_ids``): a third
        # of an overloaded replay's requests never is
        self.all_token_ids: list[int] = self.prompt_token_ids
        sp = self.sampling_params
        eos = () if sp.ignore_eos or self.eos_token_id is None else (self.eos_token_id,)
        self.stop_ids: frozenset[int] = frozenset((*sp.stop_token_ids, *eos))  # reason "stop"
        # prompt + max_tokens (reason "length"); the engine caps it at max_model_len
        self.max_num_tokens: int = len(self.prompt_token_ids) + sp.max_tokens

    @property
    def needs_fork(self) -> bool:
        """An ``n > 1`` request before its first sample (then it forks into ``n``)."""
        return self.sampling_params.n > 1 and not self.output_token_ids

    @property
    def seats(self) -> int:
        """The running seats (``max_num_seqs``) admitting this request takes."""
        return self.sampling_params.n if self.needs_fork else 1

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def own_token_ids(self) -> list[int]:
        """``all_token_ids`` as a list of the request's own, to append to: until the
        scheduler seats the request it is the prompt list itself, which the caller keeps (a
        trace's serves every run of a study). The KV cache knows a request's list by its
        identity, so it is copied before the request's blocks are committed."""
        if self.all_token_ids is self.prompt_token_ids:
            self.all_token_ids = self.prompt_token_ids.copy()
        return self.all_token_ids

    def append_output_token(self, token_id: int) -> None:
        self.own_token_ids().append(token_id)
        self.output_token_ids.append(token_id)
