"""The byte-level tokenizer the engine's server uses for simulated models (one token per byte)."""

from __future__ import annotations


class ByteTokenizer:
    """One token per UTF-8 byte; ``decode`` replaces invalid byte sequences."""

    name = "byte-level (1 token per UTF-8 byte)"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t & 0xFF for t in token_ids).decode("utf-8", errors="replace")
