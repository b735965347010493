"""Built-in English text to train the init-model tokenizer on, so nothing is downloaded."""

from __future__ import annotations

import importlib
import warnings

_TEXT = """\
A language model reads a prompt and writes an answer one token at a time. Serving many
users at once is a scheduling problem: every step, the engine decides which requests run,
how many of their prompt tokens are processed, and which ones must wait. The key-value
cache holds what the model has already computed for each request, split into fixed-size
blocks so that memory is not wasted, and shared between requests that begin with the same
words. When memory runs out, a request is preempted: its blocks are freed and recomputed
later, or swapped out to host memory and brought back.
Time to first token measures how long a user waits before the answer starts. Time per
output token measures how fast the rest of the answer streams. A service-level objective
says how much of each is acceptable, for example three hundred milliseconds to the first
token and fifty milliseconds per token after it. Chunked prefill splits long prompts into
pieces that share each step with the decoding requests, trading a little first-token
latency for a steadier stream. The right budget depends on the hardware, the model, and
the traffic: short chat questions, long documents, agents that call tools in a loop.
The quick brown fox jumps over the lazy dog. Numbers like 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
10, 42, 100, 256, 1024 and 2048 appear in logs; so do words such as request, response,
token, latency, throughput, memory, block, cache, batch, queue, server, client, and GPU.
def generate(prompt, max_tokens=16):
    tokens = tokenizer.encode(prompt)
    for _ in range(max_tokens):
        tokens.append(model.next_token(tokens))
    return tokenizer.decode(tokens)
"""

# Standard-library modules whose docstrings add varied English and code to the corpus.
_MODULES = (
    "argparse", "asyncio", "collections", "csv", "dataclasses", "datetime", "decimal",
    "email", "functools", "heapq", "http.client", "inspect", "itertools", "json", "logging",
    "pathlib", "random", "re", "shutil", "socket", "statistics", "string", "subprocess",
    "textwrap", "threading", "typing", "unittest", "urllib.parse", "uuid", "zipfile",
)  # fmt: skip


def corpus() -> list[str]:
    """Paragraphs of built-in text: a fixed passage plus standard-library docstrings."""
    texts = [p for p in _TEXT.split("\n\n") if p]
    with warnings.catch_warnings():  # typing.io and friends warn when touched
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in _MODULES:
            module = importlib.import_module(name)
            objects = [module] + [getattr(module, a) for a in sorted(dir(module)) if a[0] != "_"]
            texts += [
                d for d in (getattr(o, "__doc__", None) for o in objects) if isinstance(d, str)
            ]
    return [t for t in texts if t.strip()]
