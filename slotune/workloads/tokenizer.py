"""Turning trace text into token ids.

With a ``tokenizers`` file (``tokenizer.json``, or a folder holding one) text is tokenized
as the model would. Without one, slotune uses its byte-level tokenizer: every UTF-8 byte
of the text is one token, id = byte value (0..255). It is deterministic and needs no
files, but English text comes out about 4x longer than with a BPE tokenizer such as
Llama-3's, so length filters (ShareGPT's 1024/2048 limits) drop more. Pass a real
tokenizer when the lengths matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class ByteTokenizer:
    """One token per UTF-8 byte; ``decode`` replaces invalid byte sequences."""

    name = "byte-level (1 token per UTF-8 byte; pass --tokenizer for real lengths)"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t & 0xFF for t in token_ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from ``tokenizer.json``."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise ValueError(
                f"tokenizer: {file} not found; "
                "expected a tokenizer.json file or a folder holding one"
            )
        try:
            self._tok = _Tokenizer.from_file(str(file))
        except Exception as exc:
            raise ValueError(f"tokenizer: cannot load {file}: {exc}") from exc
        self.name = f"tokenizers ({file})"

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(list(token_ids))


def get_tokenizer(tokenizer: str | Path | Tokenizer | None) -> Tokenizer:
    """A tokenizer from a path, an existing tokenizer object, or the byte-level default."""
    if tokenizer is None:
        return ByteTokenizer()
    if isinstance(tokenizer, (str, Path)):
        return HFTokenizer(tokenizer)
    return tokenizer
