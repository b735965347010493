"""Rejection sampling of n-gram drafts for sampled requests: every token keeps the
distribution sampling without a draft would draw it from (checked by Monte Carlo against
the softmax itself), and a seeded run stays reproducible."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from slotune.engine import Engine, EngineConfig, SamplingParams
from slotune.engine.model.sampler import Sampler, SampleRow

DRAWS = 12_000


def _draws(
    logits: torch.Tensor, draft: list[int], params: SamplingParams, n: int = DRAWS
) -> list[list[int]]:
    sampler = Sampler()
    row = SampleRow("r", params, 1)
    torch.manual_seed(0)
    return [sampler.speculative_sample(logits, draft, row).token_ids for _ in range(n)]


def test_each_token_is_distributed_as_without_a_draft() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 5, generator=g) * 1.5
    draft = [int(logits[0].argmax()), int(logits[1].argmin())]  # a likely and an unlikely one
    params = SamplingParams(temperature=0.9)
    p = torch.softmax(logits / 0.9, dim=-1)
    draws = _draws(logits, draft, params)
    assert all(1 <= len(d) <= 3 and d[:-1] == draft[: len(d) - 1] for d in draws)
    first = Counter(d[0] for d in draws)
    for t in range(5):
        assert first[t] / DRAWS == pytest.approx(float(p[0, t]), abs=0.015)
    second = Counter(d[1] for d in draws if len(d) > 1)  # given the first draft token
    n = sum(second.values())
    assert n > 1000
    for t in range(5):
        assert second[t] / n == pytest.approx(float(p[1, t]), abs=0.03)


def test_top_k_bounds_what_is_accepted_and_drawn() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    draws = _draws(logits, [3], SamplingParams(temperature=1.0, top_k=2), n=1000)
    assert all(d[0] in (0, 1) for d in draws)  # draft token 3 is outside the top 2
    assert all(len(d) == 1 for d in draws)


def test_a_seeded_sampled_run_with_drafts_is_reproducible(tiny_dir: Path) -> None:
    prompt = (list(range(10, 30)) * 3)[:50]

    def run() -> tuple[list[int], dict]:
        config = EngineConfig(
            max_model_len=256,
            num_gpu_blocks=32,
            num_speculative_tokens=3,
            prompt_lookup_min=1,
            prompt_lookup_max=2,
        )
        engine = Engine.local(config, model=str(tiny_dir), device="cpu", attention="torch")
        params = SamplingParams(temperature=0.7, seed=4, max_tokens=40, ignore_eos=True)
        engine.add_request("r", prompt, params)
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for o in engine.step():
                tokens += o.new_token_ids
        return tokens, engine.stats()

    (first, stats), (again, _) = run(), run()
    assert first == again and len(first) == 40
    assert stats["spec_num_drafts"] > 0
