"""Our paged model against transformers on the same saved weights, logit by logit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slotune.engine.model.loader import load_model
from tests.model.paged import PagedRunner

ATOL = 2e-5


def hf_logits(folder: Path, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def prompt(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(
    params=[
        "tiny_dir",
        "llama3_dir",
        "qwen2_dir",
        "qwen3_dir",
        "mixtral_dir",
        "qwen2_moe_dir",
        "qwen3_moe_dir",
    ]
)
def checkpoint(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("block_size", [16, 32])
def test_prefill_chunks_and_decodes_match_transformers(checkpoint: Path, block_size: int) -> None:
    ids = prompt(90, seed=block_size)
    ref = hf_logits(checkpoint, ids)
    model = load_model(checkpoint, device="cpu").model

    full = PagedRunner(model, block_size).step([("a", ids)])[0]
    torch.testing.assert_close(full, ref, atol=ATOL, rtol=0)

    runner = PagedRunner(model, block_size, seed=1)
    pieces = [runner.step([("a", ids[s:e])])[0] for s, e in [(0, 5), (5, 37), (37, 70), (70, 85)]]
    pieces += [runner.step([("a", [t])])[0] for t in ids[85:]]  # decode steps
    torch.testing.assert_close(torch.cat(pieces), ref, atol=ATOL, rtol=0)


def test_mixed_batch_equals_requests_alone(tiny_dir: Path) -> None:
    """A prefill chunk, a decode and a fresh prompt in one step see only their own context."""
    model = load_model(tiny_dir, device="cpu").model
    a, b, c = prompt(40, 1), prompt(21, 2), prompt(18, 3)
    refs = {k: hf_logits(tiny_dir, v) for k, v in {"a": a, "b": b, "c": c}.items()}
    runner = PagedRunner(model, 16)
    runner.step([("a", a[:30]), ("b", b[:20])])
    got = runner.step([("a", a[30:]), ("b", b[20:]), ("c", c)])
    for rid, logits in zip("abc", got, strict=True):
        torch.testing.assert_close(logits, refs[rid][-len(logits) :], atol=ATOL, rtol=0)


def test_llama3_rope_scaling_changes_frequencies(llama3_dir: Path) -> None:
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = load_model(llama3_dir, device="cpu").config
    assert config.rope_scaling.rope_type == "llama3"
    from slotune.engine.model.rope import inverse_frequencies

    ours = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    hf_config = AutoConfig.from_pretrained(llama3_dir, local_files_only=True)
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    torch.testing.assert_close(ours, theirs)
    plain = inverse_frequencies(config.head_dim, config.rope_theta, type(config.rope_scaling)())
    assert not torch.allclose(ours, plain)
