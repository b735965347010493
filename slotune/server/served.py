"""What the server serves: an engine and the model facts its requests are checked against."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slotune.engine.config import EngineConfig
from slotune.engine.engine import Engine
from slotune.server.text import (
    CheckpointTokenizer,
    SimTextTokenizer,
    TextTokenizer,
    read_chat_template,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedModel:
    """``pace``: hold each step's tokens for its (virtual) duration, for simulated engines.
    ``max_token_chars``: at most this many characters of text make one token, so a longer
    text than ``max_model_len * max_token_chars`` is refused without tokenizing it.
    ``synthetic_logprobs``: the engine reports no logprobs (a simulated one); the server
    makes them up (see ``logprobs.synthetic``)."""

    name: str
    tokenizer: TextTokenizer
    vocab_size: int
    max_model_len: int
    chat_template: str | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)
    pace: bool = False
    max_token_chars: int = 1
    synthetic_logprobs: bool = False
    max_num_seqs: int | None = None  # the engine's: ``n`` above it could never run together
    request_delay_s: float = 0.0  # a simulated stack's per-request latency (HTTP, tokenizer)


def local_model(
    config: EngineConfig,
    model: str | Path,
    *,
    served_model_name: str | None = None,
    device: str = "auto",
    attention: str = "auto",
) -> tuple[Engine, ServedModel]:
    """A real checkpoint (e.g. one made by ``slotune init-model``) on this machine."""
    engine = Engine.local(config, model=str(model), device=device, attention=attention)
    executor: Any = engine.executor
    template, specials = read_chat_template(model)
    max_token_chars = 1
    if executor.tokenizer is None:
        logger.warning("%s has no tokenizer.json: serving byte-level text", model)
        tokenizer: TextTokenizer = SimTextTokenizer()
    else:
        tokenizer = CheckpointTokenizer(executor.tokenizer)
        # twice the longest vocabulary entry: room for normalizers that expand text
        max_token_chars = 2 * max(map(len, executor.tokenizer.get_vocab()), default=1)
    served = ServedModel(
        name=served_model_name or str(model),
        tokenizer=tokenizer,
        vocab_size=executor.model_config.vocab_size,
        max_model_len=config.max_model_len,
        chat_template=template,
        special_tokens=specials,
        max_token_chars=max_token_chars,
        max_num_seqs=config.max_num_seqs,
    )
    return engine, served


def simulated_model(
    config: EngineConfig,
    *,
    gpu: str = "h100",
    model: str = "llama-3-8b",
    tp: int = 1,
    served_model_name: str | None = None,
    stack: str | None = None,
) -> tuple[Engine, ServedModel]:
    """A simulated GPU: responses are paced by the cost model's step durations, on the
    serving ``stack`` that ``slotune bench`` simulates (its per-request latency delays
    each request before the engine sees it, as the bench runner's client clock does);
    prompts are counted with the model family's tokenizer (``workloads.tokenizer``)."""
    from slotune.workloads.backends import SimBackend
    from slotune.workloads.tokenizer import family_tokenizer

    engine = SimBackend(gpu, model, tp, stack=stack).engine(config)
    executor: Any = engine.executor
    prompts = family_tokenizer(model)
    served = ServedModel(
        name=served_model_name or model,
        tokenizer=SimTextTokenizer(prompts),
        vocab_size=executor.model.vocab_size,
        max_model_len=config.max_model_len,
        pace=True,
        max_token_chars=prompts.max_token_bytes,
        synthetic_logprobs=True,
        max_num_seqs=config.max_num_seqs,
        request_delay_s=executor.stack.request_latency_s,
    )
    return engine, served


def checkpoint_max_len(model: str | Path) -> int | None:
    """``max_position_embeddings`` of a checkpoint's config.json, without loading it."""
    try:
        data = json.loads((Path(model) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    value = data.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None
