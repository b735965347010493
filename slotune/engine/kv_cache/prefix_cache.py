"""The interface both prefix caches offer to the block pool and the KV-cache manager.

A cache never holds references: it only remembers which full blocks hold which token
prefixes. Each request carries an opaque ``state`` (how far its blocks are committed to
the cache), created by ``new_state`` or ``match`` and advanced by ``commit``.
"""

from __future__ import annotations

from typing import Protocol

from slotune.engine.kv_cache.block_pool import KVCacheBlock

Replacement = tuple[int, KVCacheBlock]


class PrefixCache(Protocol):
    block_size: int
    num_evictable: int
    """Unreferenced cached blocks kept outside the free queue (0 for the hash kind)."""

    def new_state(self) -> object: ...

    def copy_state(self, state: object) -> object: ...

    def match(self, token_ids: list[int], max_blocks: int) -> tuple[list[KVCacheBlock], object]:
        """Blocks of the longest cached prefix of ``token_ids`` (at most ``max_blocks``)."""
        ...

    def commit(
        self, state: object, token_ids: list[int], blocks: list[KVCacheBlock], num_full_blocks: int
    ) -> tuple[object, list[Replacement]]:
        """Register a request's full blocks up to ``num_full_blocks``.

        Returns the new state and ``(index, cached_block)`` pairs where the cache already
        holds an identical block that the request should use instead of its own.
        """
        ...

    def forget_all(self, blocks: list[KVCacheBlock]) -> None:
        """The pool reuses these free blocks (fresh from its queue) for new content."""
        ...

    def acquire(self, block: KVCacheBlock) -> None:
        """An unreferenced block kept by the cache gains its first reference."""
        ...

    def release(self, block: KVCacheBlock) -> None:
        """A block kept by the cache lost its last reference."""
        ...

    def evict(self, n: int) -> list[KVCacheBlock]:
        """Drop up to ``n`` unreferenced blocks from the cache and return them to be freed."""
        ...


def make_prefix_cache(kind: str, block_size: int) -> PrefixCache | None:
    if kind == "none":
        return None
    if kind == "hash":
        from slotune.engine.kv_cache.hash_cache import HashPrefixCache

        return HashPrefixCache(block_size)
    if kind == "radix":
        from slotune.engine.kv_cache.radix_cache import RadixPrefixCache

        return RadixPrefixCache(block_size)
    raise ValueError(f"prefix_caching: must be one of ('none', 'hash', 'radix') (got {kind!r})")
