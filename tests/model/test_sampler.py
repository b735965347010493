from __future__ import annotations

import torch

from slotune.engine.model.sampler import Sampler, SampleRow, restrict
from slotune.engine.sampling_params import SamplingParams


def logits(seed: int = 0, vocab: int = 50) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_takes_the_argmax_with_its_logprob() -> None:
    x = logits()
    [out] = Sampler().sample(x[None], [SampleRow("a", SamplingParams(temperature=0.0), 1)])
    assert out.token_ids == [int(x.argmax())]
    assert abs(out.logprobs[0] - torch.log_softmax(x, -1).max().item()) < 1e-6


def test_seeded_requests_reproduce_whatever_else_is_in_the_batch() -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    rows = [SampleRow("a", params, 1)]
    first = [Sampler().sample(logits(i)[None], rows)[0].token_ids[0] for i in range(1)]
    sampler_a, sampler_b = Sampler(), Sampler()
    seq_a = [sampler_a.sample(logits(i)[None], rows)[0].token_ids[0] for i in range(20)]
    other = SampleRow("b", SamplingParams(temperature=1.0), 1)
    seq_b = [
        sampler_b.sample(torch.stack([logits(99), logits(i)]), [other, *rows])[1].token_ids[0]
        for i in range(20)
    ]
    assert seq_a == seq_b
    assert seq_a[:1] == first
    assert len(set(seq_a)) > 1


def test_forked_children_draw_differently() -> None:
    params = SamplingParams(temperature=1.0, seed=3)
    sampler = Sampler()
    rows = [SampleRow("r#0", params, 1, index=0), SampleRow("r#1", params, 1, index=1)]
    draws = [
        tuple(s.token_ids[0] for s in sampler.sample(logits(0, 1000)[None].expand(2, -1) * 0, rows))
        for _ in range(10)
    ]
    assert any(a != b for a, b in draws)


def test_n_samples_from_one_row() -> None:
    [out] = Sampler().sample(logits()[None], [SampleRow("a", SamplingParams(seed=1), 4)])
    assert len(out.token_ids) == 4 and len(out.logprobs) == 4


def test_top_k_and_top_p_restrict_the_support() -> None:
    x = logits(1)
    top5 = set(x.topk(5).indices.tolist())
    kept = restrict(x, SamplingParams(top_k=5)).isfinite().nonzero().flatten().tolist()
    assert set(kept) == top5

    probs = torch.softmax(x, -1)
    sorted_p, order = probs.sort(descending=True)
    need = int((sorted_p.cumsum(0) < 0.6).sum()) + 1
    kept = restrict(x, SamplingParams(top_p=0.6)).isfinite().nonzero().flatten().tolist()
    assert set(kept) == set(order[:need].tolist())

    sampler = Sampler()
    row = SampleRow("a", SamplingParams(top_k=3, top_p=0.99, seed=0), 200)
    drawn = set(sampler.sample(x[None], [row])[0].token_ids)
    assert drawn <= set(x.topk(3).indices.tolist())


def test_a_mixed_batch_samples_each_row_by_its_own_params() -> None:
    x = torch.full((4, 50), -5.0)
    for row, token in enumerate((3, 7, 11, 13)):
        x[row, token] = 20.0
    rows = [
        SampleRow("greedy", SamplingParams(temperature=0.0), 1),
        SampleRow("plain", SamplingParams(temperature=0.7), 1),
        SampleRow("seeded", SamplingParams(seed=4), 1),
        SampleRow("topk", SamplingParams(top_k=2), 2),
    ]
    out = Sampler().sample(x, rows)
    assert [o.token_ids for o in out] == [[3], [7], [11], [13, 13]]
    assert all(lp > -1e-3 for o in out for lp in o.logprobs)
