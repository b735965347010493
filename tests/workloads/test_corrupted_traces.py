"""Every reader under corrupted input: a clean error naming the file and line, or a valid trace.

Files in each format are corrupted as real files get corrupted (truncated, bytes flipped,
garbage inserted, separators changed, numbers replaced by huge, non-finite or negative
ones); reading them may only raise ``TraceFormatError`` or return a trace whose every
number is usable.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.workloads import TraceFormatError, load_trace
from slotune.workloads.fit import fit_trace
from slotune.workloads.limits import MAX_SECONDS, MAX_TOKENS

SAMPLES: dict[str, tuple[str, str]] = {
    "slotune": (
        "t.jsonl",
        '{"slotune_trace": 1, "name": "t", "seed": 3}\n'
        '{"id": "a", "arrival_time": 0.5, "prompt_len": 40, "output_len": 12}\n'
        '{"id": "b", "arrival_time": 1.25, "prompt": "hello there", "output_len": 9,'
        ' "session_id": "s", "turn": 0}\n'
        '{"id": "c", "prompt_len": 7, "output_len": 3, "session_id": "s", "turn": 1,'
        ' "think_time_s": 0.2, "parent_id": "b"}\n'
        '{"id": "d", "arrival_time": 2, "segments": [[1, 16], [2, 5]], "output_len": 4}\n',
    ),
    "sharegpt": (
        "sg.json",
        json.dumps(
            [
                {
                    "id": f"c{i}",
                    "conversations": [
                        {"from": "human", "value": "tell me about the sea " * (i + 1)},
                        {"from": "gpt", "value": "the sea is wide and deep " * (i + 2)},
                    ],
                }
                for i in range(4)
            ],
            indent=1,
        ),
    ),
    "mooncake": (
        "mc.jsonl",
        '{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}\n'
        '{"timestamp": 150, "input_length": 512, "output_length": 7, "hash_ids": [1]}\n'
        '{"timestamp": 1200, "input_length": 100, "output_length": 30, "hash_ids": [9]}\n',
    ),
    "azure": (
        "az.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.1200000,879,0\n"
        "2023-11-16 18:16:03.4000000,102,12\n",
    ),
    "burstgpt": (
        "bg.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
        "130.5,ChatGPT,12,9,21,API log\n",
    ),
}
SAMPLES["spec"] = (
    "spec.json",
    json.dumps(fit_trace(load_trace("agent", num_requests=40)), indent=1),
)
ODD_NUMBERS = ["1e309", "-1e309", "NaN", "Infinity", "-7", "1e30", "9" * 400, "0.5", "-0", "1e-320"]
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?")


@st.composite
def corruptions(draw: st.DrawFn, data: bytes) -> bytes:
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "separator", "number"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "truncate":
            data = data[:pos]
        elif kind == "flip" and data:
            data = data[:pos] + bytes([data[pos] ^ draw(st.integers(1, 255))]) + data[pos + 1 :]
        elif kind == "insert":
            data = data[:pos] + draw(st.binary(min_size=1, max_size=8)) + data[pos:]
        elif kind == "separator":
            old = draw(st.sampled_from([b",", b":", b"\n", b'"', b"."]))
            new = draw(st.sampled_from([b";", b"\t", b"", b",,", b"\r\n", b"'"]))
            data = data.replace(old, new, draw(st.integers(1, 3)))
        elif kind == "number":
            numbers = list(_NUMBER.finditer(data))
            if numbers:
                m = numbers[draw(st.integers(0, len(numbers) - 1))]
                odd = draw(st.sampled_from(ODD_NUMBERS)).encode()
                data = data[: m.start()] + odd + data[m.end() :]
    return data


def _check_valid(trace) -> None:
    for r in trace:
        assert 1 <= r.prompt_len <= MAX_TOKENS and 1 <= r.output_len <= MAX_TOKENS
        assert r.arrival_time is None or 0 <= r.arrival_time <= MAX_SECONDS
        assert math.isfinite(r.think_time_s)
    json.dumps(trace.stats(), allow_nan=False)  # every statistic is a finite number


@pytest.mark.parametrize("fmt", sorted(SAMPLES))
def test_samples_are_valid(tmp_path: Path, fmt: str) -> None:
    name, text = SAMPLES[fmt]
    path = tmp_path / name
    path.write_text(text)
    assert len(load_trace(path)) >= 2  # the corruptions below start from a file that reads


@pytest.mark.parametrize("fmt", sorted(SAMPLES))
@settings(
    max_examples=int(os.environ.get("SLOTUNE_CORRUPT_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data(), detect=st.booleans())
def test_corrupted_file_gives_clean_error_or_valid_trace(
    tmp_path: Path, fmt: str, data: st.DataObject, detect: bool
) -> None:
    name, text = SAMPLES[fmt]
    path = tmp_path / name
    path.write_bytes(data.draw(corruptions(text.encode())))
    try:
        trace = load_trace(
            path,
            format=None if detect else fmt,
            num_requests=30 if fmt == "spec" else None,  # a spec can be asked for any number
        )
    except TraceFormatError as exc:
        assert str(exc).startswith(f"{path}:")
        assert re.match(r"(line|row) \d+$", exc.where), exc.where
        return
    _check_valid(trace)


@pytest.mark.parametrize(
    ("fmt", "old", "new", "where"),
    [
        ("mooncake", '"timestamp": 150', '"timestamp": 1e309', "line 2"),
        ("mooncake", '"output_length": 7', '"output_length": NaN', "line 2"),
        ("mooncake", '"timestamp": 1200', '"timestamp": 10000000000000000000000', "line 3"),
        ("burstgpt", "ChatGPT,12,9,21", "ChatGPT,1e309,9,21", "row 5"),
        ("burstgpt", "118,GPT-4", "1e309,GPT-4", "row 4"),
        ("burstgpt", "472,18", "472,nan", "row 2"),
        ("azure", "396,109", "396,1e30", "row 3"),
        ("slotune", '"arrival_time": 1.25', '"arrival_time": Infinity', "line 3"),
        ("slotune", '"think_time_s": 0.2', '"think_time_s": -1', "line 4"),
        ("slotune", '"turn": 1,', '"turn": 1e309,', "line 4"),
        ("slotune", '"seed": 3', '"seed": "x"', "line 1"),
        ("slotune", "[2, 5]", "[2, 500000000000]", "line 5"),
        ("sharegpt", '"id": "c0"', '"id": ' + "1" * 5000, "line 2"),
    ],
)
def test_absurd_numbers_name_file_and_line(
    tmp_path: Path, fmt: str, old: str, new: str, where: str
) -> None:
    name, text = SAMPLES[fmt]
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(TraceFormatError) as err:
        load_trace(path, format=fmt)
    assert str(err.value).startswith(f"{path}:{where}:")


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "mc.jsonl"
    path.write_bytes(SAMPLES["mooncake"][1].encode().replace(b"150", b"1\xff0"))
    with pytest.raises(TraceFormatError, match=r"line 2: not UTF-8 text \(byte 0xff\)"):
        load_trace(path, format="mooncake")


def test_cli_corrupted_trace_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bg.csv"
    path.write_text(SAMPLES["burstgpt"][1].replace("472,18", "472,1e309"))
    result = CliRunner().invoke(app, ["traces", "show", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "row 2" in result.output and "Response tokens" in result.output
