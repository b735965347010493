"""Fast paths give what the plain ones give: the column-wise Azure reader, token drawing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slotune.workloads.readers.csv_traces import _read_azure_fast, read_azure

HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _generated(n: int) -> str:
    rng = np.random.default_rng(3)
    rows = [HEAD]
    t = 0.0
    for _ in range(n):
        t += float(rng.exponential(0.2))
        day, rest = divmod(t, 86400)
        h, rest = divmod(rest, 3600)
        m, s = divmod(rest, 60)
        frac = f"{s:010.7f}"
        ctx, gen = int(rng.integers(0, 5000)), int(rng.integers(0, 600))
        rows.append(f"2023-11-{16 + int(day):02d} {int(h):02d}:{int(m):02d}:{frac},{ctx},{gen}\n")
    return "".join(rows)


FAST = [
    _generated(500),
    HEAD + "2023-11-16 18:15:46,3,4\n2023-11-16T18:15:46.5,5,0\n2023-11-16 18:15:47.1234567,0,2\n",
    "GeneratedTokens,TIMESTAMP,Extra,ContextTokens\n7,2024-02-29 23:59:59.9999999,x,11\n",
    HEAD + "2023-11-16 18:15:46.1,3,4\n\n2023-11-16 18:15:46.12,3,4\n",
]
ROW_BY_ROW = [
    HEAD + "2023-11-16 18:15:46Z,3,4\n2023-11-16 20:15:47+01:00,3,4\n",
    HEAD + " 2023-11-16 18:15:46 , 3 ,4\n",
    HEAD + '"2023-11-16 18:15:46",3,4\n',
    HEAD + "2023-11-16 18:15:46,3.0,4\n",
    HEAD + "2023-11-16 18:15:46,3,4\n,,\n",
]


@pytest.mark.parametrize("content", FAST + ROW_BY_ROW)
def test_same_trace_either_way(tmp_path: Path, content: str) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(content)
    fast, slow = read_azure(path, seed=1), read_azure(path, seed=1, fast=False)
    assert fast == slow
    assert fast.dropped == slow.dropped and list(fast.dropped) == list(slow.dropped)


@pytest.mark.parametrize("content", FAST)
def test_plain_files_take_the_column_path(tmp_path: Path, content: str) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(content)
    assert _read_azure_fast(path, 0) is not None


@pytest.mark.parametrize("content", ROW_BY_ROW)
def test_odd_files_take_the_row_path(tmp_path: Path, content: str) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(content)
    assert _read_azure_fast(path, 0) is None


def test_synthetic_tokens_keep_the_int64_stream() -> None:
    from slotune.workloads.trace import TOKEN_ID_HIGH, TOKEN_ID_LOW, synthetic_tokens

    for key, n in [(0, 1), (1, 17), (7, 4099), (123, 20000)]:
        rng = np.random.default_rng([5, 1, key])
        assert (
            synthetic_tokens(5, 1, key, n)
            == rng.integers(TOKEN_ID_LOW, TOKEN_ID_HIGH, size=n).tolist()
        )
