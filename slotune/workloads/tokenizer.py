"""Turning trace text into token ids, offline.

By default text is counted with the exact BPE vocabulary of the simulated model's family,
shipped inside the ``quicktok-v1`` package (nothing is downloaded): Llama-3's for the
Llama-3 models, Qwen2.5's for the Qwen models, and OpenAI's cl100k for models whose
vocabulary is not shipped (Llama-2 and Mistral's SentencePiece vocabularies; the name
says it is an approximation). Counts follow ``vllm bench serve``: a Hugging Face
tokenizer called on the text, so Llama-3 counts its ``<|begin_of_text|>`` token. An
exact ``tokenizer.json`` (or a folder holding one) is read with ``tokenizers``; an
encoding can be named (``llama3``, ``qwen3``, ``cl100k_base``, ``o200k_base``); ``bytes``
counts one token per UTF-8 byte (about 4x too many for English).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from slotune.engine.tokenizer import ByteTokenizer


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


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
        return self._tok.encode(text).ids  # with the BOS token, as vLLM's benchmark counts

    def decode(self, token_ids: list[int]) -> str:
        return self._tok.decode(list(token_ids))


class BPETokenizer:
    """An exact BPE vocabulary shipped in ``quicktok-v1`` (tiktoken's algorithm)."""

    def __init__(self, encoding: str, *, note: str = "") -> None:
        import quicktok

        if encoding not in ENCODINGS:
            raise ValueError(
                f"tokenizer: unknown encoding {encoding!r}; known: {', '.join(ENCODINGS)}"
            )
        self._enc = quicktok.get_encoding(encoding)
        bos = ENCODINGS[encoding]
        self._bos = [] if bos is None else [self._enc.encode_single_token(bos)]
        self.encoding = encoding
        self.name = f"{encoding} BPE (offline){note}"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._enc.encode_ordinary(text)
        return self._bos + ids if add_special_tokens else ids

    @property
    def max_token_bytes(self) -> int:
        """The longest token's length in bytes (so in characters too)."""
        return max(map(len, self._enc.token_byte_values()))

    def decode(self, token_ids: list[int]) -> str:
        return self._enc.decode(list(token_ids))


# encoding -> the BOS token a Hugging Face tokenizer of that family adds (None: none)
ENCODINGS: dict[str, str | None] = {
    "llama3": "<|begin_of_text|>",
    "qwen3": None,  # Qwen2, Qwen2.5 and Qwen3 share it
    "cl100k_base": None,
    "o200k_base": None,
}
_ENCODING_OF_VOCAB_SIZE = {128256: "llama3", 151936: "qwen3", 152064: "qwen3", 151646: "qwen3"}
_ENCODING_OF_NAME = {"llama-3": "llama3", "llama3": "llama3", "qwen2": "qwen3", "qwen3": "qwen3"}
DEFAULT_MODEL = "llama-3-8b"


def family_encoding(model: str | None) -> tuple[str, bool]:
    """The shipped encoding of ``model``'s family (a catalogue name, an HF config path or
    a served name such as ``meta-llama/Llama-3.1-8B``) and whether it is exact."""
    from slotune.engine.sim.models import get_model

    try:
        vocab = get_model(model or DEFAULT_MODEL).vocab_size
        if vocab in _ENCODING_OF_VOCAB_SIZE:
            return _ENCODING_OF_VOCAB_SIZE[vocab], True
    except (ValueError, OSError):
        pass
    name = (model or "").lower().rsplit("/", 1)[-1].replace("_", "-")
    for prefix, encoding in _ENCODING_OF_NAME.items():
        if name.startswith(prefix) or name.replace("meta-", "").startswith(prefix):
            return encoding, True
    return "cl100k_base", False


def family_tokenizer(model: str | None) -> BPETokenizer:
    encoding, exact = family_encoding(model)
    note = "" if exact else f"; approximates {model}'s vocabulary, pass --tokenizer for it"
    return BPETokenizer(encoding, note=note)


def get_tokenizer(tokenizer: str | Path | Tokenizer | None, model: str | None = None) -> Tokenizer:
    """A tokenizer from a ``tokenizer.json`` path, an encoding name, ``bytes``, an existing
    tokenizer object, or (None) ``model``'s own: a checkpoint folder's ``tokenizer.json``,
    else the shipped vocabulary of its family."""
    if tokenizer is None:
        if model is not None and (Path(model) / "tokenizer.json").is_file():
            return HFTokenizer(model)  # a checkpoint's own tokenizer
        return family_tokenizer(model)
    if isinstance(tokenizer, str) and tokenizer == "bytes":
        return ByteTokenizer()
    if isinstance(tokenizer, str) and tokenizer in ENCODINGS and not Path(tokenizer).exists():
        return BPETokenizer(tokenizer)
    if isinstance(tokenizer, (str, Path)):
        return HFTokenizer(tokenizer)
    return tokenizer
