"""Speculative decoding, priced: acceptance by position, and what it does to a decode step.

The acceptance model is the standard one (Leviathan et al.): each draft token is accepted
with probability ``alpha`` given that the ones before it were, so draft position ``i``
(1-based) is accepted with probability ``alpha**i`` and a step with a ``k``-token draft
appends ``1 + alpha + ... + alpha**k`` tokens on average. A verifying request is a
decode with ``k + 1`` query tokens: ``k + 1`` tokens through the dense layers and the LM
head, and one decode-attention read of its context (the draft's queries share it, as
FlashAttention-style kernels read the KV once per query block), priced by the cost
model's own ``step_seconds``, as ``SimExecutor`` prices it.

A draft model costs what the engine's draft path (``slotune.engine.model.draft``) runs:
one pass over the step's own tokens, which writes its KV (``catch_up_seconds``), and
``k`` single-token decode passes over the verifying requests (``draft_seconds``), all on
the GPU inside the target's step. Its weights and its KV in every block come out of the
target's pool (``capacity.determine_capacity``). vLLM's ``draft_model`` folds the
catch-up into its first draft pass, so this prices one pass more than vLLM runs.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from slotune.engine.sim.cost_model import CostModel

NGRAM_ACCEPTANCE = 0.82
"""Default ``alpha`` for n-gram drafts: measured on the real engine (tiny preset, CPU) on
the first 4 sessions of the bundled agent trace with k=4 and prompt lookup 1..3
(``benchmarks/spec_decode.py``; docs/BENCHMARKS.md, "Speculative decoding"). A model with
random weights repeats itself more than a trained one: pass the rate of your own model and
traffic (``SimExecutor(spec_acceptance=...)``) where you know it."""


DRAFT_ACCEPTANCE = 0.76
"""Default ``alpha`` for a draft model: vLLM's ``draft_model`` method measured in
vllm-project/vllm#24322 (Qwen3-32B target, Qwen3-1.7B draft, greedy, 100 MT-Bench
prompts): mean acceptance length 2.79 at k=3 and 3.12 at k=4, which are
``1 + alpha + ... + alpha**k`` at alpha 0.763 and 0.762. A draft of another family or
size, sampled requests or other traffic accept at other rates: pass your own."""


def default_acceptance(draft_model: bool) -> float:
    """The default rate of a draft model's drafts, or of n-gram drafts."""
    return DRAFT_ACCEPTANCE if draft_model else NGRAM_ACCEPTANCE


def check_acceptance(alpha: float) -> float:
    if not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"speculative acceptance rate: must be in [0, 1] (got {alpha!r})")
    return float(alpha)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Tokens a request appends per step with a ``k``-token draft: accepted ones plus one."""
    return sum(alpha**i for i in range(k + 1))


def draw_accepted(rng: random.Random, alpha: float, k: int) -> int:
    """Accepted draft tokens of one step: leading successes of ``alpha`` trials, at most k."""
    accepted = 0
    while accepted < k and rng.random() < alpha:
        accepted += 1
    return accepted


def draft_seconds(draft: CostModel, batch: int, context_sum: int, k: int) -> float:
    """A draft model proposing ``k`` tokens for ``batch`` requests that read
    ``context_sum`` tokens together: ``k`` decode forward passes on the GPU (inside the
    target's step: no host cost of their own), the context growing by one each."""
    return sum(
        draft.gpu_step_seconds(batch, batch, batch, context_sum + j * batch) for j in range(k)
    )


def catch_up_seconds(
    draft: CostModel,
    num_tokens: int,
    num_decodes: int,
    context_sum: int,
    chunks: Sequence[tuple[int, int]] = (),
) -> float:
    """The draft model over the target's step (the same tokens, contexts and prefill
    chunks), for its KV: no logits, no host cost of its own."""
    return draft.gpu_step_seconds(num_tokens, 0, num_decodes, context_sum, chunks)


def decode_step_seconds(
    cost: CostModel, batch: int, context: int, k: int = 0, draft: CostModel | None = None
) -> float:
    """One step of ``batch`` decoding requests of ``context`` tokens each: plain (k=0), or
    each verifying a ``k``-token draft (``k + 1`` query tokens, ``k + 1`` sampled rows),
    after ``draft`` proposed it (None: n-gram drafts, free)."""
    n = k + 1
    t = cost.step_seconds(batch * n, batch * n, batch, batch, batch * (context + n))
    if draft is not None and k:
        t += catch_up_seconds(draft, batch * n, batch, batch * (context + n))
        t += draft_seconds(draft, batch, batch * (context + 1), k)
    return t


@dataclass(frozen=True)
class SpecPoint:
    """Steady decoding of ``batch`` requests, without and with speculation."""

    batch: int
    tpot_s: float  # without: one token per request per step
    spec_tpot_s: float  # with: step time over expected tokens per step
    throughput: float  # output tokens/s
    spec_throughput: float

    @property
    def speedup(self) -> float:
        return self.spec_throughput / self.throughput


def speculation_curve(
    cost: CostModel,
    alpha: float,
    k: int,
    context: int,
    batches: list[int],
    draft: CostModel | None = None,
) -> list[SpecPoint]:
    """TPOT and throughput with and without ``k``-token speculation at each batch size."""
    per_step = expected_tokens_per_step(alpha, k)
    points = []
    for b in batches:
        plain = decode_step_seconds(cost, b, context)
        spec = decode_step_seconds(cost, b, context, k, draft)
        points.append(SpecPoint(b, plain, spec / per_step, b / plain, b * per_step / spec))
    return points


def crossover_batch_size(points: list[SpecPoint]) -> int | None:
    """The smallest batch from which speculation no longer pays (speed-up below 1)."""
    return next((p.batch for p in points if p.speedup < 1.0), None)
