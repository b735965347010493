"""What the cost model reads of a step's batch, as one rule for everything that prices a
step: the simulated executor, the calibration fits and the stretch planner (which adds
its aggregate decoders, one token each, in closed form)."""

from __future__ import annotations

from collections.abc import Iterable


def batch_totals(scheduled: Iterable[tuple[int, int]]) -> tuple[int, int, list[tuple[int, int]]]:
    """``(num_decodes, context_sum, chunks)`` of a step that schedules ``n`` tokens for each
    request after ``computed`` ones, given as ``(n, computed)`` in batch order: a one-token
    entry is priced as a decode reading ``computed + 1`` KV tokens (its new one included),
    any other as a prefill chunk ``(n, computed)``."""
    num_decodes = context_sum = 0
    chunks: list[tuple[int, int]] = []
    for n, computed in scheduled:
        if n == 1:
            num_decodes += 1
            context_sum += computed + 1
        else:
            chunks.append((n, computed))
    return num_decodes, context_sum, chunks


def prefill_context_sum(chunks: Iterable[tuple[int, int]]) -> int:
    """The KV tokens a step's prefill chunks ``(n, computed)`` attend to: each its prior
    ones and itself."""
    return sum([n + computed for n, computed in chunks])
