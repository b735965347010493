"""Drive our model directly over a paged cache, without the engine: the tests' harness."""

from __future__ import annotations

import random

import torch

from slotune.engine.model.attention import AttentionBackend, AttentionMetadata, select_backend
from slotune.engine.model.llama import ForwardBatch, LlamaForCausalLM


class PagedRunner:
    """Keeps per-request token counts and block tables; blocks are handed out shuffled."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        block_size: int,
        num_blocks: int = 64,
        backend: AttentionBackend | None = None,
        seed: int = 0,
    ) -> None:
        c = model.config
        self.model = model
        self.block_size = block_size
        shape = (c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        dtype = next(model.parameters()).dtype
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}
        self.backend = backend or select_backend("torch", torch.device("cpu"), block_size, dtype)

    def step(self, chunks: list[tuple[str, list[int]]]) -> list[torch.Tensor]:
        """Run each request's new tokens in one batch; logits [len(chunk), vocab] per request."""
        ids, positions, slots, qlens, klens, tables = [], [], [], [], [], []
        for rid, new in chunks:
            start = self.lens.get(rid, 0)
            end = start + len(new)
            table = self.tables.setdefault(rid, [])
            while len(table) * self.block_size < end:
                table.append(self.free.pop())
            ids += new
            positions += range(start, end)
            slots += [
                table[p // self.block_size] * self.block_size + p % self.block_size
                for p in range(start, end)
            ]
            qlens.append(len(new))
            klens.append(end)
            tables.append(table)
            self.lens[rid] = end
        width = max(map(len, tables))
        cu_q = torch.tensor([0, *qlens]).cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0, *klens]).cumsum(0).to(torch.int32)
        meta = AttentionMetadata(
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            seq_lens_k=torch.tensor(klens, dtype=torch.int32),
            block_tables=torch.tensor(
                [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32
            ),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            max_seqlen_q=max(qlens),
            max_seqlen_k=max(klens),
            query_lens=tuple(qlens),
            context_lens=tuple(klens),
        )
        batch = ForwardBatch(
            input_ids=torch.tensor(ids),
            positions=torch.tensor(positions),
            attention=meta,
            logits_indices=torch.arange(len(ids)),
        )
        logits = self.model(batch, self.k, self.v, self.backend)
        return list(logits.split(qlens))
