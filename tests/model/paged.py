"""Drive our model directly over a paged cache, without the engine: the tests' harness."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from slotune.engine.model.attention import AttentionBackend, AttentionMetadata, select_backend
from slotune.engine.model.kv_cache import allocate_kv_cache
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
        kv_cache_dtype: str = "auto",
    ) -> None:
        c = model.config
        self.model = model
        self.block_size = block_size
        shape = (c.num_hidden_layers, num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        dtype = next(model.parameters()).dtype
        self.k, self.v = allocate_kv_cache(kv_cache_dtype, shape, dtype, "cpu")
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}
        self.backend = backend or select_backend(
            "torch", torch.device("cpu"), block_size, dtype, kv_cache_dtype
        )

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


@dataclass(frozen=True)
class LogitError:
    """Logits of a quantized-KV run against the full-precision run on the same steps."""

    max_abs: float
    mean_abs: float
    logit_std: float  # of the full-precision logits, the scale errors are read against
    top1_agreement: float

    @property
    def mean_rel(self) -> float:
        return self.mean_abs / self.logit_std


def kv_logit_error(
    model: LlamaForCausalLM,
    ids: list[int],
    kv_cache_dtype: str,
    block_size: int = 16,
    chunks: tuple[int, ...] = (37, 100),
) -> LogitError:
    """Prefill ``ids[:chunks[-1]]`` in chunks ending at ``chunks``, decode the rest one token
    a step, with the cache quantized and in the model's dtype; compare every position."""

    def run(kv: str) -> torch.Tensor:
        runner = PagedRunner(model, block_size, kv_cache_dtype=kv)
        bounds = list(zip((0, *chunks[:-1]), chunks, strict=True))
        pieces = [runner.step([("a", ids[s:e])])[0] for s, e in bounds]
        pieces += [runner.step([("a", [t])])[0] for t in ids[chunks[-1] :]]
        return torch.cat(pieces)

    ref, got = run("auto"), run(kv_cache_dtype)
    err = (got - ref).abs()
    return LogitError(
        max_abs=err.max().item(),
        mean_abs=err.mean().item(),
        logit_std=ref.std().item(),
        top1_agreement=(got.argmax(-1) == ref.argmax(-1)).float().mean().item(),
    )
