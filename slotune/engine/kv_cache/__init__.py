"""Paged KV cache: the block pool, the two prefix caches (hash, radix) and the manager."""

from slotune.engine.kv_cache.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock
from slotune.engine.kv_cache.hash_cache import HashPrefixCache
from slotune.engine.kv_cache.manager import ComputedBlocks, KVCacheManager
from slotune.engine.kv_cache.radix_cache import RadixPrefixCache

__all__ = [
    "BlockPool",
    "ComputedBlocks",
    "FreeKVCacheBlockQueue",
    "HashPrefixCache",
    "KVCacheBlock",
    "KVCacheManager",
    "RadixPrefixCache",
]
