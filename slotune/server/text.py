"""Text in and out of the server: prompt encoding, chat prompts, streamed detokenization.

A real checkpoint is served with its own ``tokenizer.json`` (through ``tokenizers``). The
simulated engine has no text: its sampled tokens are hashes. It is served with
:class:`SimTextTokenizer`, which counts prompts with the simulated model family's BPE
vocabulary (the workloads' offline tokenizer: what vLLM serving that model counts) and
shows each sampled token as one printable ASCII character, so that every token streams as
one visible chunk, as a client timing tokens needs. A checkpoint without
``tokenizer.json`` is served the same way, with byte-level prompts (``ByteTokenizer``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from slotune.engine.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizerModel

_PRINTABLE_LOW, _PRINTABLE_SPAN = 32, 95
_REPLACEMENT = "\ufffd"
_LONG = 4096  # characters or tokens from which the tokenizer releases the GIL


class TextTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class CheckpointTokenizer:
    """A checkpoint's ``tokenizers.Tokenizer``: special tokens (BOS) added to plain prompts
    as vLLM adds them, skipped in output text.

    Long inputs go through the ``*_batch`` calls, which release the GIL (``encode`` holds it
    for seconds on a megabyte of text, stalling the event loop even from a worker thread).
    """

    def __init__(self, tokenizer: HFTokenizerModel) -> None:
        self._tok = tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > _LONG:
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int]) -> str:
        if len(token_ids) > _LONG:
            return self._tok.decode_batch([list(token_ids)], skip_special_tokens=True)[0]
        return self._tok.decode(list(token_ids), skip_special_tokens=True)


class PromptEncoder(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...


class SimTextTokenizer:
    """Prompts encoded with ``prompts`` (byte-level without one); one printable ASCII
    character per simulated output token."""

    def __init__(self, prompts: PromptEncoder | None = None) -> None:
        self._bytes = ByteTokenizer()
        self._prompts = prompts

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._prompts is None:
            return self._bytes.encode(text)
        return self._prompts.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: list[int]) -> str:
        return self._bytes.decode(
            [
                t
                if _PRINTABLE_LOW <= t < _PRINTABLE_LOW + _PRINTABLE_SPAN
                else _PRINTABLE_LOW + t % _PRINTABLE_SPAN
                for t in token_ids
            ]
        )


class IncrementalDetokenizer:
    """The new text of a growing token sequence, as vLLM streams it.

    It decodes a short window (the tokens of the last emitted piece and the new ones) and
    emits the text past the window's old part, holding it back while it ends in an
    incomplete UTF-8 character (U+FFFD) unless the sequence is final.
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tok = tokenizer
        self.token_ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def add(self, new_token_ids: list[int], final: bool = False) -> str:
        ids = self.token_ids
        ids.extend(new_token_ids)
        old = self._tok.decode(ids[self._prefix : self._read])
        new = self._tok.decode(ids[self._prefix :])
        if len(new) <= len(old) or (new.endswith(_REPLACEMENT) and not final):
            return ""
        self._prefix, self._read = self._read, len(ids)
        return new[len(old) :]


def read_chat_template(model_dir: str | Path) -> tuple[str | None, dict[str, str]]:
    """The checkpoint's chat template (``tokenizer_config.json``) and its special tokens."""
    file = Path(model_dir) / "tokenizer_config.json"
    if not file.is_file():
        return None, {}
    data = json.loads(file.read_text())
    template = data.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    specials = {}
    for key in ("bos_token", "eos_token"):
        value = data.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            specials[key] = value
    return (template if isinstance(template, str) else None), specials


def render_chat(
    messages: list[dict[str, str]], template: str | None, specials: dict[str, str]
) -> str:
    """The prompt text of a chat.

    With the checkpoint's Jinja chat template it is rendered as transformers'
    ``apply_chat_template(..., add_generation_prompt=True)`` does. Without one, each message
    becomes a ``"role: content"`` line and a final ``"assistant:"`` line asks for the reply.
    Raises ``ValueError`` when the template rejects the messages.
    """
    if template is None:
        lines = [f"{m['role']}: {m['content']}" for m in messages]
        return "\n".join([*lines, "assistant:"])
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> Any:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, **specials
        )
    except TemplateError as exc:
        raise ValueError(f"the model's chat template rejected the messages: {exc}") from exc
