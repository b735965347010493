"""vLLM-style automatic prefix caching: full blocks keyed by a chain of block hashes.

Block ``i``'s key is ``(hash of block i-1's key, tokens of block i)``, so one dict lookup
per block finds the longest cached prefix and equal keys mean equal prefixes (the tokens
are compared exactly; only the parent link is a hash). Unreferenced cached blocks sit in
the pool's free queue with their key: a hit takes them back out, and reuse for new content
(least recently freed last) drops the key.

The dict is keyed by the hash of the key (an int: cheap to hash again when a block is
reused), and a hit also compares the block's stored key, so a hit is exact; two keys
sharing a 64-bit hash would only mean the second is not cached.
"""

from __future__ import annotations

from slotune.engine.kv_cache.block_pool import KVCacheBlock
from slotune.engine.kv_cache.prefix_cache import Replacement


class HashPrefixCache:
    """State per request: the chained hashes of its first full blocks."""

    num_evictable = 0

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[int, KVCacheBlock] = {}  # hash of the key -> its block

    def __len__(self) -> int:
        return len(self._blocks)

    def new_state(self) -> list[int]:
        return []

    def copy_state(self, state: object) -> list[int]:
        return list(state)  # type: ignore[call-overload]

    def match(self, token_ids: list[int], max_blocks: int) -> tuple[list[KVCacheBlock], list[int]]:
        bs = self.block_size
        lookup = self._blocks.get
        blocks: list[KVCacheBlock] = []
        hashes: list[int] = []
        parent: object = None
        for i in range(max_blocks):
            key = (parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            h = hash(key)
            block = lookup(h)
            if block is None or block.block_key != key:
                break
            blocks.append(block)
            parent = h
            hashes.append(h)
        return blocks, hashes

    def commit(
        self, state: object, token_ids: list[int], blocks: list[KVCacheBlock], num_full_blocks: int
    ) -> tuple[list[int], list[Replacement]]:
        hashes: list[int] = state  # type: ignore[assignment]
        bs = self.block_size
        cached = self._blocks
        first = len(hashes)
        if first >= num_full_blocks:
            return hashes, []
        parent: object = hashes[-1] if hashes else None
        chunks = [tuple(token_ids[a : a + bs]) for a in range(first * bs, num_full_blocks * bs, bs)]
        for block, chunk in zip(blocks[first:num_full_blocks], chunks, strict=True):
            key = (parent, chunk)
            parent = h = hash(key)
            hashes.append(h)
            if block.block_hash is None and cached.setdefault(h, block) is block:
                block.block_hash = h
                block.block_key = key
        return hashes, []

    def forget_all(self, blocks: list[KVCacheBlock]) -> None:
        cached = self._blocks
        for block in blocks:
            h = block.block_hash
            if h is not None:  # then the cache holds it under h (only commit sets h)
                del cached[h]
                block.block_hash = block.block_key = None

    def acquire(self, block: KVCacheBlock) -> None:
        raise AssertionError("hash-cached blocks live in the free queue")

    def release(self, block: KVCacheBlock) -> None:
        raise AssertionError("hash-cached blocks live in the free queue")

    def evict(self, n: int) -> list[KVCacheBlock]:
        return []
