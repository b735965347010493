"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds, logprobs.

Each row of logits belongs to one request and yields ``n`` tokens (``n > 1`` only at the
end of the prompt of a request that the engine then forks). A seeded request draws from
its own generator, kept across steps, so that its whole output is reproducible whatever
else shares the batch; a forked child ``"{parent}#{i}"`` seeds its own from ``seed + i``
(modulo 2**64, so any integer seed is valid). Temperatures below
``sampling_params.GREEDY_BELOW`` sample greedily, as vLLM's do.

Sampling is safe by construction: top-p always keeps the most likely token (a ``top_p``
that rounds to 0 in float32, such as 1e-46, keeps just that one), and a row whose
distribution still is not one (no finite, positive probability) is drawn greedily, so
one request's parameters can never fail the batch's step.

Logprobs are those of the model's raw distribution (the log-softmax of the logits before
temperature, top-k and top-p), as vLLM V1 reports them by default: the sampled tokens'
always, and with ``SamplingParams.logprobs = k`` the row's k most likely tokens as well.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from slotune.engine.sampling_params import SamplingParams

_SEED_MODULUS = 1 << 64

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleRow:
    request_id: str
    params: SamplingParams
    num_samples: int
    index: int = 0  # the completion index of a forked child, for its seed


@dataclass(frozen=True)
class Sampled:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: dict[int, float] | None = None  # token id -> logprob, most likely first


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> list[Sampled]:
        """One result per row of ``logits`` [rows, vocab] (float32)."""
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens: list[list[int] | None] = [None] * len(rows)
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        plain = [i for i, r in enumerate(rows) if _plain(r)]
        if greedy:
            best = logits[greedy].argmax(dim=-1).tolist()
            for i, t in zip(greedy, best, strict=True):
                tokens[i] = [t] * rows[i].num_samples
        if plain:
            temps = torch.tensor([rows[i].params.temperature for i in plain], device=logits.device)
            probs = torch.softmax(logits[plain] / temps[:, None], dim=-1)
            valid = torch.isfinite(probs).all(dim=-1)
            if not bool(valid.all()):  # such rows go one by one (and greedy) below
                plain = [i for i, ok in zip(plain, valid.tolist(), strict=True) if ok]
                probs = probs[valid]
            if plain:
                picks = torch.multinomial(probs, 1).flatten().tolist()
                for i, t in zip(plain, picks, strict=True):
                    tokens[i] = [t]
        top = _top_logprobs(logprobs, rows)
        results = []
        for i, row in enumerate(rows):
            drawn = tokens[i]
            if drawn is None:
                drawn = self._draw(logits[i], row)
            results.append(Sampled(drawn, logprobs[i, drawn].tolist(), top.get(i)))
        return results

    def speculative_sample(self, logits: torch.Tensor, draft: list[int], row: SampleRow) -> Sampled:
        """The tokens a sampled (not greedy) request appends after verifying ``draft``, from
        ``logits`` [len(draft) + 1, vocab] at its last token and each draft token: vLLM's
        rejection sampling for a draft without probabilities (each draft token certain).
        Draft token ``d`` is accepted with probability ``p(d)``; at the first rejection the
        step ends with a token drawn from ``p`` without ``d``; after a fully accepted draft,
        with one drawn from the last row's ``p``. Each token is thereby distributed as
        sampling without a draft would draw it (``p``: temperature, top-k and top-p applied).
        """
        params = row.params
        generator = self._generator(row, logits.device)
        tokens: list[int] = []
        for i in range(len(draft) + 1):
            probs = torch.softmax(restrict(logits[i] / params.temperature, params), dim=-1)
            if i == len(draft):
                tokens += torch.multinomial(probs, 1, generator=generator).tolist()
                break
            d = draft[i]
            u = torch.rand((), generator=generator, device=logits.device)
            if u < probs[d]:
                tokens.append(d)
                continue
            probs[d] = 0.0
            tokens += torch.multinomial(probs, 1, generator=generator).tolist()
            break
        logprobs = torch.log_softmax(logits[: len(tokens)], dim=-1)
        picked = logprobs[torch.arange(len(tokens)), torch.tensor(tokens)]
        return Sampled(tokens, picked.tolist())

    def _draw(self, logits: torch.Tensor, row: SampleRow) -> list[int]:
        probs = torch.softmax(restrict(logits / row.params.temperature, row.params), dim=-1)
        if not bool(torch.isfinite(probs).all()) or not float(probs.sum()) > 0:
            logger.warning("request %s: no distribution to sample; greedy", row.request_id)
            return [int(logits.argmax())] * row.num_samples
        generator = self._generator(row, logits.device)
        drawn = torch.multinomial(probs, row.num_samples, replacement=True, generator=generator)
        return drawn.tolist()

    def _generator(self, row: SampleRow, device: torch.device) -> torch.Generator | None:
        seed = row.params.seed
        if seed is None:
            return None
        gen = self._generators.get(row.request_id)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed((seed + row.index) % _SEED_MODULUS)
            self._generators[row.request_id] = gen
        return gen


def _top_logprobs(logprobs: torch.Tensor, rows: list[SampleRow]) -> dict[int, dict[int, float]]:
    """Row index -> its ``params.logprobs`` most likely tokens, for the rows that ask."""
    wanted = [i for i, r in enumerate(rows) if r.params.logprobs > 0]
    if not wanted:
        return {}
    k = min(max(rows[i].params.logprobs for i in wanted), logprobs.shape[-1])
    values, ids = torch.topk(logprobs[wanted], k, dim=-1)
    top = {}
    for i, row_values, row_ids in zip(wanted, values.tolist(), ids.tolist(), strict=True):
        n = rows[i].params.logprobs
        top[i] = dict(zip(row_ids[:n], row_values[:n], strict=True))
    return top


def _plain(row: SampleRow) -> bool:
    """Unseeded single draws from the whole distribution: sampled together in one call."""
    p = row.params
    return (
        not p.greedy and p.seed is None and row.num_samples == 1 and p.top_k <= 0 and p.top_p >= 1.0
    )


def restrict(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the top-p nucleus."""
    if params.top_k <= 0 and params.top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    keep = torch.ones_like(sorted_logits, dtype=torch.bool)
    if 0 < params.top_k < logits.shape[-1]:
        keep[params.top_k :] = False
    if params.top_p < 1.0:
        probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs
        keep &= before < params.top_p
        keep[0] = True  # the most likely token, whatever top_p rounds to
    out = torch.full_like(logits, float("-inf"))
    out[order[keep]] = logits[order[keep]]
    return out
