"""vLLM-style automatic prefix caching: full blocks keyed by a chain of block hashes.

Block ``i``'s key is ``(hash of block i-1's key, tokens of block i)``, so one dict lookup
per block finds the longest cached prefix and equal keys mean equal prefixes (the tokens
are compared exactly; only the parent link is a hash). Unreferenced cached blocks sit in
the pool's free queue with their key: a hit takes them back out, and reuse for new content
(least recently freed last) drops the key.
"""

from __future__ import annotations

from slotune.engine.kv_cache.block_pool import KVCacheBlock
from slotune.engine.kv_cache.prefix_cache import Replacement

BlockKey = tuple[object, tuple[int, ...]]


class HashPrefixCache:
    """State per request: the chained hashes of its first full blocks."""

    num_evictable = 0

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[BlockKey, KVCacheBlock] = {}

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
            block = lookup(key)
            if block is None:
                break
            blocks.append(block)
            parent = hash(key)
            hashes.append(parent)  # type: ignore[arg-type]
        return blocks, hashes

    def commit(
        self, state: object, token_ids: list[int], blocks: list[KVCacheBlock], num_full_blocks: int
    ) -> tuple[list[int], list[Replacement]]:
        hashes: list[int] = state  # type: ignore[assignment]
        bs = self.block_size
        cached = self._blocks
        parent: object = hashes[-1] if hashes else None
        for i in range(len(hashes), num_full_blocks):
            key = (parent, tuple(token_ids[i * bs : (i + 1) * bs]))
            parent = hash(key)
            hashes.append(parent)  # type: ignore[arg-type]
            block = blocks[i]
            if block.block_hash is None and key not in cached:
                cached[key] = block
                block.block_hash = key
        return hashes, []

    def forget(self, block: KVCacheBlock) -> None:
        key = block.block_hash
        if self._blocks.get(key) is block:  # type: ignore[arg-type]
            del self._blocks[key]  # type: ignore[arg-type]
        block.block_hash = None

    def acquire(self, block: KVCacheBlock) -> None:
        raise AssertionError("hash-cached blocks live in the free queue")

    def release(self, block: KVCacheBlock) -> None:
        raise AssertionError("hash-cached blocks live in the free queue")

    def evict(self, n: int) -> list[KVCacheBlock]:
        return []
