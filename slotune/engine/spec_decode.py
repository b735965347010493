"""Speculative decoding: n-gram (prompt lookup) drafts and their verification.

Named after vLLM V1's ``NgramProposer`` and ``RejectionSampler``. A decoding request with
a draft of ``k`` tokens is scheduled ``1 + k`` tokens (its last sampled token and the
draft); the executor samples at every one of those ``1 + k`` positions and keeps the
draft's longest prefix that the model itself would have sampled, plus one more token (the
model's own at the first mismatch, or the "bonus" token after a fully accepted draft). So
a greedy output is exactly the output without speculation, one to ``k + 1`` tokens a step.
A sampled request's draft goes through rejection sampling instead, which keeps each
token's distribution (not the draws of a seeded request: they differ from a run without).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from slotune.engine.request import Request

Proposer = Callable[[Request, int], list[int]]  # (request, at most k) -> draft tokens


@runtime_checkable
class SlotProposer(Protocol):
    """A proposer that writes KV as it drafts (a draft model, ``model.draft``): the
    scheduler allocates the step's ``1 + k`` slots first and hands it the block table."""

    def propose_in_slots(self, request: Request, k: int, block_table: list[int]) -> list[int]:
        """``k`` draft tokens (or [] when ``request`` does not speculate)."""
        ...


def ngram_propose(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Up to ``k`` tokens following the earliest earlier occurrence of the longest suffix of
    ``tokens`` of ``min_n``..``max_n`` tokens (vLLM's rule); [] when no such suffix recurs."""
    total = len(tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        first = suffix[0]
        start = 0
        while True:
            try:
                start = tokens.index(first, start, total - n)
            except ValueError:
                break
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
            start += 1
    return []


class NgramProposer:
    """Prompt lookup over a request's prompt and output so far."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def __call__(self, request: Request, k: int) -> list[int]:
        if not speculates(request):
            return []
        return ngram_propose(request.all_token_ids, self.min_n, self.max_n, k)


def speculates(request: Request) -> bool:
    """Requests that may get drafts: one completion, no top logprobs asked. A greedy one is
    verified by ``verified``; a sampled one by rejection sampling
    (``Sampler.speculative_sample``)."""
    p = request.sampling_params
    return p.n == 1 and not p.logprobs


def num_accepted(draft: Sequence[int], target: Sequence[int]) -> int:
    """How many leading draft tokens equal the model's own (``target`` has one more)."""
    for i, (d, t) in enumerate(zip(draft, target, strict=False)):
        if d != t:
            return i
    return len(draft)


def verified(draft: Sequence[int], target: Sequence[int]) -> list[int]:
    """The tokens a step appends: the accepted draft prefix and the model's next token."""
    return list(target[: num_accepted(draft, target) + 1])
