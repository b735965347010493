"""The interface both prefix caches offer to the KV-cache manager.

A cache never holds references: it only remembers which full blocks hold which token
prefixes. Each request carries a ``state`` of the cache's own type ``S`` (how far its
blocks are committed to the cache), created by ``new_state`` or ``match`` and advanced by
``commit``; the manager keeps it without looking inside.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from slotune.engine.kv_cache.block_pool import BlockKeeper, KVCacheBlock

Replacement = tuple[int, KVCacheBlock]
S = TypeVar("S")


class PrefixCache(BlockKeeper, Protocol[S]):
    block_size: int

    def new_state(self) -> S: ...

    def copy_state(self, state: S) -> S: ...

    def match(self, token_ids: list[int], max_blocks: int) -> tuple[list[KVCacheBlock], S]:
        """Blocks of the longest cached prefix of ``token_ids`` (at most ``max_blocks``)."""
        ...

    def commit(
        self, state: S, token_ids: list[int], blocks: list[KVCacheBlock], num_full_blocks: int
    ) -> tuple[S, list[Replacement]]:
        """Register a request's full blocks up to ``num_full_blocks``.

        Returns the new state and ``(index, cached_block)`` pairs where the cache already
        holds an identical block that the request should use instead of its own.
        """
        ...
