"""Top-k logprobs through the openai client, streamed and not: on the real tiny checkpoint
they equal transformers' log-softmax of its logits; on the simulated server they follow the
documented synthetic distribution."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from tests.server.conftest import ServerThread
from tests.server.helpers import post

PROMPT = [5, 77, 123, 300, 41, 9, 250]
MAX_TOKENS = 5
USER = [{"role": "user", "content": "Name a colour."}]

# (token text, logprob, alternatives in vLLM's order: the sampled token, then the top others)
Step = tuple[str, float, list[tuple[str, float]]]


def _client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> Callable[[list[int], int], list[Step]]:
    """``reference(prompt_ids, k)``: transformers' greedy continuation of the prompt, with
    each step's logprobs, in float32."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_dir, local_files_only=True, dtype=torch.float32
    ).eval()
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))

    def decode(t: int) -> str:
        return tok.decode([t], skip_special_tokens=True)

    def steps(prompt: list[int], k: int) -> list[Step]:
        ids, out = list(prompt), []
        for _ in range(MAX_TOKENS):
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1)
            token = int(lp.argmax())
            order = [token] + [t for t in torch.topk(lp, k).indices.tolist() if t != token]
            out.append(
                (decode(token), lp[token].item(), [(decode(t), lp[t].item()) for t in order])
            )
            ids.append(token)
        return out

    return steps


def _greedy(**extra: Any) -> dict[str, Any]:
    return (
        dict(model="tiny", max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
        | extra
    )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("k", [1, 4])
def test_completions_top_logprobs_match_transformers(
    server: ServerThread, reference: Any, stream: bool, k: int
) -> None:
    args = _greedy(prompt=PROMPT, logprobs=k)
    client = _client(server)
    if stream:
        chunks = [c for c in client.completions.create(stream=True, **args) if c.choices]
        parts = [c.choices[0].logprobs for c in chunks]
    else:
        parts = [client.completions.create(**args).choices[0].logprobs]
    tokens = [t for p in parts for t in p.tokens]
    expected = reference(PROMPT, k)
    assert tokens == [text for text, _, _ in expected]
    token_lps = [x for p in parts for x in p.token_logprobs]
    assert token_lps == pytest.approx([lp for _, lp, _ in expected], abs=1e-4)
    tops = [d for p in parts for d in p.top_logprobs]
    for top, (_, _, alternatives) in zip(tops, expected, strict=True):
        want = dict(alternatives)
        assert list(top) == list(want) and len(top) <= k  # greedy: the sampled is the top
        assert list(top.values()) == pytest.approx(list(want.values()), abs=1e-4)
    offsets = [o for p in parts for o in p.text_offset]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_top_logprobs_match_transformers(
    server: ServerThread, reference: Any, stream: bool
) -> None:
    k = 3
    status, tokenized = post(server, "/tokenize", {"messages": USER})
    assert status == 200
    args = _greedy(messages=USER, logprobs=True, top_logprobs=k)
    client = _client(server)
    if stream:
        chunks = [c for c in client.chat.completions.create(stream=True, **args) if c.choices]
        content = [
            e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content
        ]
    else:
        content = client.chat.completions.create(**args).choices[0].logprobs.content
    expected = reference(tokenized["tokens"], k)
    assert len(content) == MAX_TOKENS
    for entry, (text, lp, alternatives) in zip(content, expected, strict=True):
        assert entry.token == text and entry.bytes == list(text.encode())
        assert entry.logprob == pytest.approx(lp, abs=1e-4)
        assert [t.token for t in entry.top_logprobs] == [t for t, _ in alternatives[:k]]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(
            [v for _, v in alternatives[:k]], abs=1e-4
        )
        assert all(t.bytes == list(t.token.encode()) for t in entry.top_logprobs)


def test_sampled_tokens_come_first_among_the_alternatives(server: ServerThread) -> None:
    """At a high temperature the sampled token is often not the most likely one; vLLM puts
    it first: k + 1 entries for completions, the first k for chat."""
    client = _client(server)
    r = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=40,
        temperature=5.0,
        seed=3,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    sizes = set()
    for token, token_lp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert next(iter(top)) == token and all(v <= 0 for v in top.values())
        sizes.add(len(top))
        if "\ufffd" not in top:  # byte tokens share that text, and so one key
            assert top[token] == token_lp
    assert sizes <= {1, 2, 3} and 3 in sizes  # some tokens were outside the top 2
    chat = client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=40,
        temperature=5.0,
        seed=3,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    for entry in chat.choices[0].logprobs.content:
        assert len(entry.top_logprobs) == 2
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (
            entry.token,
            entry.logprob,
        )


def test_simulated_logprobs_are_the_documented_synthetic_ones(sim_server: ServerThread) -> None:
    client = _client(sim_server)
    model = sim_server.served.name
    r = client.completions.create(model=model, prompt="hello", max_tokens=6, logprobs=3)
    lp = r.choices[0].logprobs
    half = math.log(0.5)
    assert lp.token_logprobs == pytest.approx([half] * 6)
    for token, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert next(iter(top)) == token
        assert list(top.values()) == pytest.approx([half, 2 * half, 3 * half])
    chunks = client.chat.completions.create(
        model=model,
        messages=USER,
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    content = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert len(content) == 4
    assert all(
        [t.logprob for t in e.top_logprobs] == pytest.approx([half, 2 * half]) for e in content
    )


def test_over_the_limit_is_refused_by_name(server: ServerThread) -> None:
    client = _client(server)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model="tiny", prompt="hi", logprobs=21)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="tiny", messages=USER, logprobs=True, top_logprobs=21)
