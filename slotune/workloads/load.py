"""``load_trace``: a bundled trace by name, or a trace file in any supported format."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from slotune.workloads.readers import TEXT_FORMATS, detect_format, read_trace_file
from slotune.workloads.tokenizer import ByteTokenizer, Tokenizer, get_tokenizer
from slotune.workloads.trace import Trace

DATA_DIR = Path(__file__).parent / "data"
BUNDLED = {
    "sharegpt-like": "chat lengths as ShareGPT (mean ~230 in / ~200 out tokens)",
    "agent": "agent sessions: shared system prompt + tools, closed-loop turns",
    "shared-prefix": "groups of requests sharing a long system prompt",
    "long-context": "long prompts (2k-7k tokens) with short answers",
    "reasoning": "reasoning model: short prompts (~200 tokens), long outputs (~4k tokens)",
    "shared-prefix-chat": "inference-perf shared_prefix: 10 system prompts x 10 users, 4 rounds",
    "agent-tiers": "the agent sessions, a quarter of them pro (tier 0), the rest free (tier 1)",
}


def bundled_path(name: str) -> Path:
    return DATA_DIR / f"{name}.jsonl"


def load_trace(
    name_or_path: str | Path,
    *,
    format: str | None = None,
    num_requests: int | None = None,
    tokenizer: str | Path | Tokenizer | None = None,
    seed: int = 0,
    multi_turn: bool = False,
    model: str | None = None,
) -> Trace:
    """Load a bundled trace (``sharegpt-like``, ``agent``, ``shared-prefix``,
    ``long-context``) or a file (slotune JSONL, ShareGPT JSON, Mooncake JSONL, Azure or
    BurstGPT CSV; detected unless ``format`` is given).

    ``num_requests`` keeps the first N requests (ShareGPT: the first N that pass the
    filters after the seeded shuffle) and is an error when the trace has fewer. Rows the
    readers drop are counted in ``trace.dropped``. Text is tokenized with ``tokenizer``,
    by default with the vocabulary of ``model``'s family (see ``tokenizer.py``).
    """
    key = str(name_or_path)
    bundled = key in BUNDLED and not Path(key).exists()
    if bundled:
        path = bundled_path(key)
        if format not in (None, "slotune"):
            raise ValueError(f"bundled trace {key!r} is in slotune's own format, not {format!r}")
        fmt: str | None = "slotune"
    else:
        path = Path(key)
        fmt = format
        if not path.is_file():
            raise ValueError(
                f"trace {key!r}: no such file and not a bundled trace; "
                f"bundled: {', '.join(BUNDLED)}"
            )
    fmt = fmt or detect_format(path)
    # length-only formats never tokenize: skip building the model family's vocabulary
    needs_tokenizer = fmt in TEXT_FORMATS or tokenizer is not None
    tok = get_tokenizer(tokenizer, model) if needs_tokenizer else ByteTokenizer()
    try:
        trace = read_trace_file(
            path, fmt, tok, num_requests=num_requests, seed=seed, multi_turn=multi_turn
        )
    except MemoryError:  # past what the readers' bounds keep out, on a small machine
        raise ValueError(
            f"{path}: not enough memory to read this trace; use a smaller one"
        ) from None
    if bundled:
        trace = replace(trace, name=key, source=f"bundled:{key}", _cache={})
    return trace.head(num_requests)
