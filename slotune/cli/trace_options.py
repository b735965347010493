"""The trace flags that several commands share (``bench``, ``tune``, ``traces``), and
loading a trace with a clean error."""

from __future__ import annotations

from typing import Annotated, Any

from slotune.cli.common import fail, opt

TraceName = Annotated[str, opt("--trace", "Bundled trace name or trace file.")]
TraceFormat = Annotated[
    str | None, opt("--format", "sharegpt | mooncake | azure | burstgpt | slotune (detected).")
]
NumRequests = Annotated[int | None, opt("--num-requests", "Use the first N requests.")]
MultiTurn = Annotated[bool, opt("--multi-turn", "ShareGPT: whole conversations as sessions.")]
Tokenizer = Annotated[
    str | None,
    opt(
        "--tokenizer",
        "Text traces: a tokenizer.json (or its folder), an encoding (llama3, qwen3, "
        "cl100k_base, o200k_base) or bytes. Default: the model family's own, offline.",
    ),
]

TokenizerModel = Annotated[
    str | None,
    opt("--model", "Model whose vocabulary counts text without --tokenizer (llama-3-8b)."),
]


def load_trace_or_fail(
    name: str,
    fmt: str | None,
    num_requests: int | None,
    tokenizer: str | None,
    seed: int,
    multi_turn: bool,
    where: str = "",
    model: str | None = None,
) -> Any:
    """``load_trace`` with these flags; bad input ends the command (``where``: its flag)."""
    from slotune.workloads import load_trace

    try:
        return load_trace(
            name,
            format=fmt,
            num_requests=num_requests,
            tokenizer=tokenizer,
            seed=seed,
            multi_turn=multi_turn,
            model=model,
        )
    except (ValueError, OSError) as exc:
        fail(f"{where}: {exc}" if where else str(exc))
