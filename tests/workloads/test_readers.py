"""Each reader on small files in the real format, including malformed ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotune.workloads import TraceFormatError, load_trace
from slotune.workloads.readers import detect_format
from slotune.workloads.readers.sharegpt import vllm_filter

WORD = "word "  # 5 bytes = 5 byte-level tokens


def _conv(cid: str, *turns: tuple[str, str]) -> dict:
    return {"id": cid, "conversations": [{"from": f, "value": v} for f, v in turns]}


def _write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def _write_lines(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ShareGPT ----------------------------------------------------------------------------


def test_vllm_filter_rules() -> None:
    assert vllm_filter(3, 100) == "prompt < 4 tokens"
    assert vllm_filter(100, 3) == "output < 4 tokens"
    assert vllm_filter(1025, 10) == "prompt > 1024 tokens"
    assert vllm_filter(1024, 1025) == "prompt + output > 2048 tokens"
    assert vllm_filter(4, 4) is None
    assert vllm_filter(1024, 1024) is None


def test_sharegpt_sampling_follows_vllm(tmp_path: Path) -> None:
    data = [
        _conv("ok1", ("human", "hello there friend"), ("gpt", "hi! how can I help")),
        _conv("short_prompt", ("human", "hi"), ("gpt", "hello hello")),
        _conv("short_answer", ("human", "tell me"), ("gpt", "no")),
        _conv("long_prompt", ("human", "x" * 1025), ("gpt", "fine, okay")),
        _conv("too_long", ("human", "y" * 1000), ("gpt", "z" * 1100)),
        _conv("one_msg", ("human", "anyone there?")),
        _conv(
            "ok2",
            ("system", "be brief"),
            ("human", "what is up"),
            ("gpt", "the sky"),
            ("human", "and?"),
            ("gpt", "that's all"),
        ),
    ]
    path = _write_json(tmp_path / "sg.json", data)
    trace = load_trace(path, seed=0, tokenizer="bytes")
    assert detect_format(path) == "sharegpt"
    assert sorted(r.request_id.split("-")[0] for r in trace) == ["ok1", "ok2"]
    assert trace.dropped == {
        "prompt < 4 tokens": 1,
        "output < 4 tokens": 1,
        "prompt > 1024 tokens": 1,
        "prompt + output > 2048 tokens": 1,
        "fewer than 2 messages": 1,
    }
    ok1 = next(r for r in trace if r.request_id.startswith("ok1"))
    assert ok1.prompt_len == len("hello there friend")  # byte-level tokenizer
    assert ok1.output_len == len("hi! how can I help")
    assert ok1.prompt_token_ids == tuple(b"hello there friend")
    ok2 = next(r for r in trace if r.request_id.startswith("ok2"))
    assert ok2.prompt_text == "be brief\nwhat is up"  # system message kept in front
    assert "byte-level" in trace.tokenizer


def test_sharegpt_seeded_shuffle_and_num_requests(tmp_path: Path) -> None:
    data = [_conv(f"c{i}", ("human", WORD * (i + 1)), ("gpt", WORD * 3)) for i in range(40)]
    path = _write_json(tmp_path / "sg.json", data)
    a = [r.request_id for r in load_trace(path, seed=1, num_requests=10, tokenizer="bytes")]
    b = [r.request_id for r in load_trace(path, seed=1, num_requests=10, tokenizer="bytes")]
    c = [r.request_id for r in load_trace(path, seed=2, num_requests=10, tokenizer="bytes")]
    assert a == b and a != c and len(a) == 10
    with pytest.raises(ValueError, match="has only 40 requests"):
        load_trace(path, num_requests=41, tokenizer="bytes")


def test_sharegpt_multi_turn_sessions(tmp_path: Path) -> None:
    data = [
        _conv(
            "a",
            ("human", "first question"),
            ("gpt", "first answer"),
            ("human", "second question"),
            ("gpt", "second answer"),
            ("human", "third"),
            ("gpt", "third answer"),
        ),
        _conv("b", ("human", "only one"), ("gpt", "one answer")),
    ]
    trace = load_trace(_write_json(tmp_path / "mt.json", data), multi_turn=True, tokenizer="bytes")
    assert len(trace) == 4
    a = [r for r in trace if r.session_id.startswith("a")]
    assert [r.turn for r in a] == [0, 1, 2]
    assert a[1].parent_id == a[0].request_id and a[2].parent_id == a[1].request_id
    assert a[1].prompt_text == "second question"  # only what the turn appends
    assert a[1].output_len == len("second answer")
    stats = trace.stats()
    assert stats["sessions"] == 2
    # turn 2's full prompt = t0 + answer0 + t1 + answer1 + t2
    full = trace.full_prompt_lengths()
    assert full[2] == sum(
        len(s)
        for s in ["first question", "first answer", "second question", "second answer", "third"]
    )


@pytest.mark.parametrize(
    ("content", "where", "fragment"),
    [
        (
            '[{"id": "a", "conversations": []},\n {"id": "b", "conversations": [}',
            "line 2",
            "invalid JSON",
        ),
        ('{"not": "a list"}', "line 1", "expected a JSON array"),
        ('[\n{"id": "a", "conversations": []},\n{"id": "b"}\n]', "line 3", '"conversations" list'),
        ('[\n{"id": "a", "conversations": [{"from": "human"}]}\n]', "line 2", "conversations[0]"),
    ],
)
def test_sharegpt_malformed(tmp_path: Path, content: str, where: str, fragment: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as err:
        load_trace(path, format="sharegpt")
    assert str(err.value).startswith(f"{path}:{where}:")
    assert fragment in str(err.value)


# Mooncake ----------------------------------------------------------------------------


def test_mooncake_hash_ids_become_shared_tokens(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 1100, "output_length": 10, "hash_ids": [7, 8, 9]},
        {"timestamp": 1500, "input_length": 1024, "output_length": 5, "hash_ids": [7, 8]},
        {"timestamp": 2750, "input_length": 600, "output_length": 5, "hash_ids": [7, 11]},
        {"timestamp": 3000, "input_length": 300, "output_length": 5, "hash_ids": [12]},
    ]
    path = _write_lines(tmp_path / "mooncake.jsonl", rows)
    assert detect_format(path) == "mooncake"
    trace = load_trace(path)
    assert [r.arrival_time for r in trace] == [0.0, 0.5, 1.75, 2.0]
    assert trace.requests[0].prompt_segments == ((7, 512), (8, 512), (9, 76))
    ids = trace.own_prompt_token_ids()
    assert [len(x) for x in ids] == [1100, 1024, 600, 300]
    assert ids[0][:1024] == ids[1]  # blocks 7, 8 shared
    assert ids[0][:512] == ids[2][:512]  # block 7 shared
    assert ids[0][512:600] != ids[2][512:600]  # block 8 vs 11 differ
    assert ids[3][:300] != ids[0][:300]
    assert trace.stats()["prefix_sharing_ratio"] > 0.4


@pytest.mark.parametrize(
    ("rows", "where", "fragment"),
    [
        (
            [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}, "{oops"],
            "line 2",
            "invalid JSON",
        ),
        (
            [{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [1]}],
            "line 1",
            "'input_length': expected an integer in [1, ",
        ),
        ([{"timestamp": 0, "output_length": 1, "hash_ids": [1]}], "line 1", "'input_length'"),
        (
            [{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}],
            "line 1",
            "needs 3 hash ids",
        ),
        (
            [
                {"timestamp": 50, "input_length": 5, "output_length": 1, "hash_ids": [1]},
                {"timestamp": 40, "input_length": 5, "output_length": 1, "hash_ids": [2]},
            ],
            "line 2",
            "expected non-decreasing timestamps",
        ),
    ],
)
def test_mooncake_malformed(tmp_path: Path, rows: list, where: str, fragment: str) -> None:
    path = _write_lines(tmp_path / "mc.jsonl", rows)
    with pytest.raises(TraceFormatError) as err:
        load_trace(path, format="mooncake")
    assert str(err.value).startswith(f"{path}:{where}:")
    assert fragment in str(err.value)


# Azure and BurstGPT -----------------------------------------------------------------

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,879,0
2023-11-16 18:16:01.5000000,2048,31
"""


def test_azure_csv(tmp_path: Path) -> None:
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text(AZURE)
    assert detect_format(path) == "azure"
    trace = load_trace(path)
    assert len(trace) == 3
    assert trace.dropped == {"GeneratedTokens = 0": 1}
    assert trace.requests[0].arrival_time == 0.0
    assert trace.requests[1].arrival_time == pytest.approx(4.314579)
    assert trace.requests[2].arrival_time == pytest.approx(14.81941)
    assert [r.prompt_len for r in trace] == [374, 396, 2048]
    assert [r.output_len for r in trace] == [44, 109, 31]
    assert trace.has_timestamps


@pytest.mark.parametrize(
    ("content", "where", "fragment"),
    [
        (
            "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,3\n",
            "row 1",
            "missing column(s) ['GeneratedTokens']",
        ),
        (
            AZURE_HEAD + "2023-11-16 18:15:46.68,3,4\n2023-11-16 18:15:47,-3,4\n",
            "row 3",
            "'ContextTokens': expected an integer in [0, ",
        ),
        (
            AZURE_HEAD + "2023-11-16 18:15:46.68,3,4\n2023-11-16 18:15:40,3,4\n",
            "row 3",
            "expected rows in time order",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "row 2", "cannot read time"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3\n",
            "row 2",
            "expected 3 fields",
        ),
    ],
)
def test_azure_malformed(tmp_path: Path, content: str, where: str, fragment: str) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(content)
    with pytest.raises(TraceFormatError) as err:
        load_trace(path, format="azure")
    assert str(err.value).startswith(f"{path}:{where}:")
    assert fragment in str(err.value)


BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,276,693,API log
118.5,ChatGPT,0,20,20,Conversation log
130,ChatGPT,1360,0,1360,API log
"""


def test_burstgpt_drops_and_counts_failed_rows(tmp_path: Path) -> None:
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT)
    assert detect_format(path) == "burstgpt"
    trace = load_trace(path)
    assert [(r.arrival_time, r.prompt_len, r.output_len) for r in trace] == [
        (0.0, 472, 18),
        (113.0, 417, 276),
    ]
    assert trace.dropped == {"failed (Response tokens = 0)": 2, "Request tokens = 0": 1}
    assert trace.stats()["dropped"] == trace.dropped


def test_burstgpt_malformed(tmp_path: Path) -> None:
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT.replace("417,276", "417,many"))
    with pytest.raises(TraceFormatError) as err:
        load_trace(path, format="burstgpt")
    assert str(err.value).startswith(f"{path}:row 4:")
    assert "'Response tokens': expected a number, got 'many'" in str(err.value)


def test_unknown_csv_header_names_both_formats(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError, match=r"Azure columns .* BurstGPT columns"):
        load_trace(path)


# slotune JSONL and conversion -------------------------------------------------------


def test_every_format_converts_to_slotune_jsonl_and_back(tmp_path: Path) -> None:
    azure = tmp_path / "azure.csv"
    azure.write_text(AZURE)
    mooncake = _write_lines(
        tmp_path / "mc.jsonl",
        [
            {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 10, "input_length": 512, "output_length": 3, "hash_ids": [1]},
        ],
    )
    sharegpt = _write_json(
        tmp_path / "sg.json",
        [
            _conv(
                "a",
                ("human", "first question"),
                ("gpt", "first answer"),
                ("human", "second question"),
                ("gpt", "second answer"),
            )
        ],
    )
    for src, kwargs in [(azure, {}), (mooncake, {}), (sharegpt, {"multi_turn": True})]:
        trace = load_trace(src, **kwargs)
        out = tmp_path / f"{src.stem}.slotune.jsonl"
        trace.to_jsonl(out)
        assert detect_format(out) == "slotune"
        back = load_trace(out)
        assert back.requests == trace.requests
        assert back.own_prompt_token_ids() == trace.own_prompt_token_ids()
        assert back.dropped == trace.dropped


@pytest.mark.parametrize(
    ("rows", "where", "fragment"),
    [
        ([{"id": "a", "prompt_len": 5, "output_len": 2}, "not json"], "line 2", "invalid JSON"),
        ([{"id": "a", "prompt_len": 5}], "line 1", "missing field 'output_len'"),
        (
            [{"id": "a", "prompt_len": -1, "output_len": 2}],
            "line 1",
            "prompt_len: expected an integer in [1, ",
        ),
        (
            [{"id": "a", "prompt_len": 5, "output_len": 2, "parent_id": "zz"}],
            "line 1",
            "parent_id 'zz' is not an earlier request",
        ),
        (
            [
                {"id": "a", "prompt_len": 5, "output_len": 2, "arrival_time": 3.0},
                {"id": "b", "prompt_len": 5, "output_len": 2, "arrival_time": 1.0},
            ],
            "line 2",
            "expected non-decreasing arrival times",
        ),
        (
            [{"id": "a", "prompt_len": 5, "output_len": 2, "colour": "red"}],
            "line 1",
            "unknown field(s) ['colour']",
        ),
        (
            [
                {"id": "a", "prompt_len": 5, "output_len": 2},
                {"id": "a", "prompt_len": 5, "output_len": 2},
            ],
            "line 2",
            "duplicate id 'a'",
        ),
    ],
)
def test_slotune_jsonl_malformed(tmp_path: Path, rows: list, where: str, fragment: str) -> None:
    path = _write_lines(tmp_path / "t.jsonl", rows)
    with pytest.raises(TraceFormatError) as err:
        load_trace(path, format="slotune")
    assert str(err.value).startswith(f"{path}:{where}:")
    assert fragment in str(err.value)


def test_slotune_jsonl_text_prompts_are_tokenized(tmp_path: Path) -> None:
    path = _write_lines(tmp_path / "t.jsonl", [{"id": "a", "prompt": "héllo", "output_len": 3}])
    trace = load_trace(path, tokenizer="bytes")
    assert trace.requests[0].prompt_len == 6  # é is two UTF-8 bytes
    assert trace.own_prompt_token_ids()[0] == list("héllo".encode())


def test_real_tokenizer_by_path(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"hello": 0, "world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    path = _write_lines(
        tmp_path / "t.jsonl", [{"id": "a", "prompt": "hello world hello", "output_len": 3}]
    )
    trace = load_trace(path, tokenizer=tmp_path)
    assert trace.own_prompt_token_ids()[0] == [0, 1, 0]
    assert "tokenizers" in trace.tokenizer


def test_unknown_trace_lists_bundled_names() -> None:
    with pytest.raises(
        ValueError, match="bundled: sharegpt-like, agent, shared-prefix, long-context, reasoning"
    ):
        load_trace("no-such-trace")
