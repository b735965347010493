"""Draft-model speculation: a small checkpoint of the target's vocabulary drafts greedily.

The draft keeps its own paged KV cache (its layers and heads are not the target's, so the
two caches cannot be shared) indexed by the target's block ids: one block table and slot
mapping, two sets of tensors. So rolling back a rejected token's block frees it for both,
and a block the prefix cache holds has the draft's keys of the same verified tokens.

A step runs the draft twice over:

- ``catch_up`` (in the executor's step, after the target): the draft over exactly the
  target's batch, writing its KV: prefill chunks (the draft's prefill runs in the same step
  as the target's chunk), plain decodes and verifying requests' last token and draft;
- ``propose_in_slots`` (at the next schedule, into slots the scheduler allocated first):
  ``k`` single-token greedy steps from the request's last token.

vLLM's ``draft_model`` method folds the catch-up into its first draft pass (it drafts after
verifying, in the same step), so it runs ``k`` draft passes a step where this runs ``k + 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from slotune.engine.hf_config import ModelConfig
from slotune.engine.kv_dtype import kv_block_bytes
from slotune.engine.model.attention import AttentionBackend, AttentionMetadata
from slotune.engine.model.kv_cache import KVCache, allocate_kv_cache
from slotune.engine.model.llama import ForwardBatch
from slotune.engine.model.loader import load_model
from slotune.engine.request import Request
from slotune.engine.spec_decode import speculates


class DraftModel:
    """A draft checkpoint loaded beside the target, with its KV cache and a greedy proposer.

    ``dtype`` and ``device`` are the target's; the vocabularies must match (the draft's
    token ids are verified by the target as they are)."""

    def __init__(
        self,
        path: str | Path,
        target: ModelConfig,
        device: torch.device,
        dtype: torch.dtype,
        timer: Callable[[], float],
    ) -> None:
        loaded = load_model(path, device=str(device), dtype=str(dtype).removeprefix("torch."))
        if loaded.config.vocab_size != target.vocab_size:
            raise ValueError(
                f"EngineConfig.speculative_model {str(path)!r}: vocabulary of "
                f"{loaded.config.vocab_size} tokens, the target's has {target.vocab_size}; "
                "a draft model must share the target's tokenizer"
            )
        self.path = loaded.path
        self.model = loaded.model
        self.config = loaded.config
        self.device, self.dtype = device, dtype
        self.timer = timer
        self.kv: tuple[KVCache, KVCache] | None = None
        self.cpu_kv: tuple[KVCache, KVCache] | None = None
        self.backend: AttentionBackend | None = None
        self.block_size = 0
        self.pending_s = 0.0  # proposing time, added to the next step the executor times

    def block_bytes(self, block_size: int, kv_cache_dtype: str) -> int:
        c = self.config
        per_layer = kv_block_bytes(
            kv_cache_dtype, block_size, c.num_key_value_heads, c.head_dim, self.dtype.itemsize
        )
        return c.num_hidden_layers * per_layer

    def initialize_cache(
        self,
        kv_cache_dtype: str,
        block_size: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        backend: AttentionBackend,
    ) -> None:
        """The draft's KV tensors: as many blocks as the target's, of the same size."""
        c = self.config
        self.block_size, self.backend = block_size, backend
        gpu = (c.num_hidden_layers, num_gpu_blocks, block_size, c.num_key_value_heads, c.head_dim)
        cpu = (*gpu[:1], num_cpu_blocks, *gpu[2:])
        self.kv = allocate_kv_cache(kv_cache_dtype, gpu, self.dtype, self.device)
        pin = self.device.type == "cuda"
        self.cpu_kv = allocate_kv_cache(
            kv_cache_dtype, cpu, self.dtype, "cpu", pin_memory=pin, zeroed=False
        )

    def catch_up(self, batch: ForwardBatch) -> None:
        """Run the draft over the target's batch for its KV only (no logits)."""
        assert self.kv is not None and self.backend is not None
        none = batch.logits_indices[:0]
        self.model(replace(batch, logits_indices=none), self.kv[0], self.kv[1], self.backend)

    def propose_in_slots(self, request: Request, k: int, block_table: list[int]) -> list[int]:
        """``k`` greedy draft tokens after ``request``'s last token, whose KV and that of
        the first ``k - 1`` draft tokens go to the request's next slots (allocated)."""
        if k <= 0 or not speculates(request):
            return []
        assert self.kv is not None and self.backend is not None
        start = self.timer()
        dev, bs = self.device, self.block_size
        position = request.num_computed_tokens
        token = request.all_token_ids[position]
        table = torch.tensor([block_table], dtype=torch.int32, device=dev)
        one = torch.zeros(1, dtype=torch.int64, device=dev)
        draft: list[int] = []
        for p in range(position, position + k):
            context = p + 1
            meta = AttentionMetadata(
                cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32, device=dev),
                cu_seqlens_k=torch.tensor([0, context], dtype=torch.int32, device=dev),
                seq_lens_k=torch.tensor([context], dtype=torch.int32, device=dev),
                block_tables=table,
                slot_mapping=torch.tensor(
                    [block_table[p // bs] * bs + p % bs], dtype=torch.int64, device=dev
                ),
                max_seqlen_q=1,
                max_seqlen_k=context,
                query_lens=(1,),
                context_lens=(context,),
            )
            batch = ForwardBatch(
                input_ids=torch.tensor([token], dtype=torch.int64, device=dev),
                positions=torch.tensor([p], dtype=torch.int64, device=dev),
                attention=meta,
                logits_indices=one,
            )
            logits = self.model(batch, self.kv[0], self.kv[1], self.backend)
            token = int(torch.argmax(logits[0]).item())
            draft.append(token)
        self.pending_s += self.timer() - start
        return draft

    def take_pending_seconds(self) -> float:
        seconds, self.pending_s = self.pending_s, 0.0
        return seconds
