"""Logprobs in OpenAI's two shapes, from the engine's per-token logprobs and top-k.

Each generated token carries its logprob and, with ``SamplingParams.logprobs = k``, the
step's alternatives in vLLM's order: the sampled token first, then the k most likely tokens
(the sampled one not repeated). ``/v1/completions`` returns them all, so k or k + 1 per
token, as vLLM does; chat returns the first k. Logprobs are clamped to -9999 (JSON has no
-inf), as in vLLM.

A simulated engine has no model and so no logprobs: the server reports synthetic ones (see
:func:`synthetic`), so that clients that read logprobs run unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slotune.engine.outputs import RequestOutput

_FLOOR = -9999.0
_SYNTHETIC_DECAY = math.log(2.0)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float | None  # None: the executor reported none
    alternatives: tuple[tuple[str, float], ...] = ()  # vLLM's order; see the module doc


def token_logprobs(
    out: RequestOutput,
    decode: Callable[[list[int]], str],
    *,
    top: int,
    synthetic_vocab: int | None = None,
) -> list[TokenLogprob]:
    """One entry per new token of ``out``; with ``synthetic_vocab``, outputs without
    logprobs (a simulated engine's) get synthetic ones over that vocabulary."""
    ids = out.new_token_ids
    sampled: Sequence[float | None] = out.logprobs
    alternatives: Sequence[dict[int, float]] = out.top_logprobs
    if not sampled and synthetic_vocab is not None:
        pairs = [synthetic(t, top, synthetic_vocab) for t in ids]
        sampled = [lp for lp, _ in pairs]
        alternatives = [alt for _, alt in pairs] if top else ()
    entries = []
    for i, token_id in enumerate(ids):
        lp = sampled[i] if i < len(sampled) else None
        step = alternatives[i] if top and i < len(alternatives) else {}
        ordered = {token_id: lp} | step if step and lp is not None else step
        entries.append(
            TokenLogprob(
                decode([token_id]),
                None if lp is None else max(lp, _FLOOR),
                tuple((decode([t]), max(v, _FLOOR)) for t, v in ordered.items()),
            )
        )
    return entries


def synthetic(token_id: int, top: int, vocab_size: int) -> tuple[float, dict[int, float]]:
    """Simulated logprobs: the sampled token is the most likely, at probability 1/2, and
    the next ids of the vocabulary follow at 1/4, 1/8, ... (the k most likely, with it)."""
    alternatives = {
        (token_id + rank) % vocab_size: -(rank + 1) * _SYNTHETIC_DECAY for rank in range(top)
    }
    return -_SYNTHETIC_DECAY, alternatives


def completion_logprobs(
    entries: Sequence[TokenLogprob], text_offset: int, top: int
) -> dict[str, Any]:
    """``/v1/completions``' shape; ``text_offset``: the text length before ``entries``."""
    offsets = []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [dict(e.alternatives) for e in entries] if top else None,
        "text_offset": offsets,
    }


def chat_logprobs(entries: Sequence[TokenLogprob], top: int) -> dict[str, Any]:
    """Chat's shape: ``content``, a list of tokens with their ``top_logprobs``."""
    return {
        "content": [
            _chat_token(e.token, e.logprob)
            | {"top_logprobs": [_chat_token(t, lp) for t, lp in e.alternatives[:top]]}
            for e in entries
        ]
    }


def _chat_token(token: str, logprob: float | None) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "replace"))}
