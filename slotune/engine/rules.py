"""The scheduling rules, one function each.

The step-by-step scheduler (``slotune.engine.scheduler``) and the stretch planner
(``slotune.engine.stretch``) both call these, so the two cannot drift apart. The planner
keeps decoding requests as aggregates and asks in which step one of them first meets a
rule: the ``*_step`` functions answer that in closed form for a request that computes one
token per step from (1-based) step ``first_step`` on, with ``computed`` tokens before it;
the tests check each against its rule applied step by step.
"""

from __future__ import annotations

from collections.abc import Callable

from slotune.engine.request import Request, RequestStatus


def is_decoding(num_left: int, has_output: bool) -> bool:
    """A request decodes (takes one token, the one it sampled last) when exactly one of
    its tokens is not computed yet and it has output; otherwise it prefills."""
    return num_left == 1 and has_output


def is_decoder(req: Request) -> bool:
    return is_decoding(len(req.all_token_ids) - req.num_computed_tokens, bool(req.output_token_ids))


def counts_as_prefill(num_tokens: int, has_output: bool) -> bool:
    """Whether a running request's ``num_tokens`` in a step count as prefill tokens."""
    return num_tokens > 1 or not has_output


def running_chunk(
    num_left: int, computed: int, threshold: int, budget: int, max_model_len: int
) -> int:
    """The tokens a running request takes in a step: all it has left, at most the long
    prefill threshold, the budget left and what the model length allows."""
    if num_left > 1:
        return min(num_left, threshold, budget, max_model_len - computed)
    return num_left


def first_chunk(num_left: int, threshold: int, budget: int, prefill_first: bool) -> int | None:
    """The tokens a waiting request starts (or resumes) with; None when prefill-first
    would not split it to fit the budget left (it waits)."""
    n = min(num_left, threshold)
    if n > budget:
        if prefill_first:
            return None
        n = budget
    return n


def num_samples(has_output: bool, n: int) -> int:
    """Tokens sampled by a request whose computed tokens reach its length: one, or the
    ``n`` of its first sample (the parent and its forks)."""
    return 1 if has_output else n


def has_seat(num_seated: int, fork_seats: int, seats: int, max_num_seqs: int) -> bool:
    """Whether a request taking ``seats`` fits next to ``num_seated`` running requests and
    the seats reserved for forks still to come."""
    return num_seated + fork_seats + seats <= max_num_seqs


def prompts_first(prefill_first: bool, head: Request | None) -> bool:
    """Under prefill-first, a step whose waiting head is a prompt (not a swapped request)
    tries the waiting queue before the running requests."""
    return prefill_first and head is not None and head.status is not RequestStatus.SWAPPED


def queue_key(
    by_priority: bool, tiered: bool, budgeted: bool = False
) -> Callable[[Request], tuple] | None:
    """The order of both queues: with a decode budget (``budgeted``) the requests that
    earned priority first, then tier when ``tiered`` (0 first), then lower ``priority``
    values under priority scheduling (vLLM's convention), then earlier arrivals; the
    last running request in this order is preempted first. None: plain FIFO waiting and
    admission-order running (FCFS without tiers or budget)."""
    if budgeted:
        base = queue_key(by_priority, tiered) or _arrival

        def boosted_first(req: Request) -> tuple:
            return (not req.boosted, *base(req))

        return boosted_first
    if by_priority and tiered:
        return _tier_priority_arrival
    if by_priority:
        return _priority_arrival
    if tiered:
        return _tier_arrival
    return None


def _tier_priority_arrival(req: Request) -> tuple[int, int, float]:
    return (req.tier, req.priority, req.arrival_time)


def _priority_arrival(req: Request) -> tuple[int, float]:
    return (req.priority, req.arrival_time)


def _tier_arrival(req: Request) -> tuple[int, float]:
    return (req.tier, req.arrival_time)


def _arrival(req: Request) -> tuple[float]:
    return (req.arrival_time,)


def earns_priority(req: Request, now: float, budget_s: float) -> bool:
    """Decode budget: whether a waiting request, preempted once it had output, has waited
    past ``budget_s`` (its TPOT target) and goes first from now on."""
    return may_earn_priority(req.boosted, bool(req.output_token_ids)) and (
        now - req.preempted_at > budget_s
    )


def may_earn_priority(boosted: bool, has_output: bool) -> bool:
    """Decode budget: whether a request preempted now may earn priority by waiting (it
    has output, and it never went first before)."""
    return has_output and not boosted


def swaps(mode: str, num_computed: int, swap_threshold: int) -> bool:
    """Whether a victim holding ``num_computed`` computed tokens is swapped to the CPU
    pool (when it has room) rather than recomputed: always under ``preemption_mode``
    swap, from ``swap_threshold`` tokens on under hybrid, never under recompute."""
    return mode == "swap" or (mode == "hybrid" and num_computed >= swap_threshold)


def reaches_length(num_tokens: int, max_num_tokens: int) -> bool:
    """A request that samples its ``num_tokens``-th token finishes with reason "length"."""
    return num_tokens >= max_num_tokens


def length_step(first_step: int, num_tokens: int, max_num_tokens: int) -> int:
    """The step in which a decoder with ``num_tokens`` tokens ``reaches_length``."""
    return first_step + max_num_tokens - num_tokens - 1


def blocks_for(num_tokens: int, block_size: int) -> int:
    """The blocks that hold ``num_tokens`` tokens (the last one maybe partly full)."""
    return -(-num_tokens // block_size)


def swap_in_blocks(num_tokens: int, num_cpu_blocks: int, block_size: int) -> int:
    """The GPU blocks a swapped request takes back to hold ``num_tokens`` tokens: at least
    as many as its CPU copy holds."""
    return max(blocks_for(num_tokens, block_size), num_cpu_blocks)


def needs_blocks(computed: int, num_tokens: int, num_slots: int) -> bool:
    """Whether computing ``num_tokens`` more needs slots beyond the ``num_slots`` held."""
    return computed + num_tokens > num_slots


def alloc_step(first_step: int, computed: int, num_slots: int) -> int:
    """The step in which a decoder ``needs_blocks``."""
    return first_step + num_slots - computed


def fills_block(computed: int, num_tokens: int, block_size: int) -> bool:
    """Whether a step that brought a request's computed tokens to ``computed`` by
    ``num_tokens`` filled a block (its contents may go into the prefix cache)."""
    return computed % block_size < num_tokens


def fill_step(first_step: int, computed: int, block_size: int) -> int:
    """The step in which a decoder ``fills_block``."""
    return first_step - 1 + block_size - computed % block_size
