"""vLLM-style automatic prefix caching: full blocks keyed by a chain of block hashes.

Block ``i``'s key is ``(hash of block i-1's key, tokens of block i)``, so one dict lookup
per block finds the longest cached prefix and equal keys mean equal prefixes (the tokens
are compared exactly; only the parent link is a hash). Unreferenced cached blocks sit in
the pool's free queue with their key: a hit takes them back out, and reuse for new content
(least recently freed last) drops the key.

The dict is keyed by the hash of the key (an int: cheap to hash again when a block is
reused), and a hit also compares the block's stored key, so a hit is exact; two keys
sharing a 64-bit hash would only mean the second is not cached.

Hashing is deferred per *group*, the requests sharing a first block: only a lookup whose
first block equals the group's can ever hit one of its blocks. Until such a lookup, a
group is dormant: its commits and the reuse of its blocks are logged in order, unhashed
(one hash per request instead of one per block, and nothing at all for blocks reused
before anyone could look them up). The first lookup into a group replays its log, which
leaves exactly the entries eager hashing would have left, and from then on the group
hashes eagerly. A dormant group whose blocks have all been reused is dropped: it would
replay to nothing. While a group has one request, the reuse of its blocks is not even
logged: nothing in the group could win a key that a reused block gave up.

A request that looks up its own token list while it is still its group's only member (a
preempted request coming back) needs no hashes either: the replay would register each
position's first logged block, so walking the log by position finds what a replay and an
eager lookup find. The group stays dormant; from then on reuse is logged, since the
request commits positions again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import islice
from operator import attrgetter
from typing import Generic, TypeVar, cast

from slotune.engine.kv_cache.block_pool import BlockStateError, KVCacheBlock
from slotune.engine.kv_cache.prefix_cache import Replacement

Key = tuple[object, tuple[int, ...]]
Commit = tuple[list[int], Sequence[KVCacheBlock | None], int]
"""A logged commit: token ids, the blocks (None: reused unlogged) and the first's index."""


class _Group:
    """A dormant group: its first-block key, its log and its committed requests."""

    __slots__ = (
        "h0",
        "key0",
        "live",
        "log",
        "logs_reuse",
        "members",
        "registry",
    )

    def __init__(self, h0: int, key0: Key) -> None:
        self.h0 = h0
        self.key0 = key0
        self.live = 0  # logged blocks not reused since
        self.log: list[Commit | KVCacheBlock] = []  # a bare block when reused
        self.members: list[tuple[HashState, list[int]]] = []  # (state, token ids)
        self.logs_reuse = False  # set once a second request or a lookup may commit again
        # once its only member has looked its own blocks up: those blocks by position
        self.registry: _Registry[int] | None = None


HashState = list[int | _Group]
"""A request's chained block hashes; a dormant group's request holds the group instead."""


_hash_of = attrgetter("block_hash")


def _first_key(token_ids: list[int], bs: int) -> Key:
    """The key of the first block: the group it belongs to."""
    return (None, tuple(token_ids[:bs]))


def _chain(token_ids: list[int], bs: int, n: int) -> list[tuple[int, Key]]:
    """(hash, key) of the first ``n`` full blocks of ``token_ids``."""
    out = []
    parent: object = None
    for a in range(0, n * bs, bs):
        key = (parent, tuple(token_ids[a : a + bs]))
        parent = h = hash(key)
        out.append((h, key))
    return out


K = TypeVar("K", bound=Hashable)


class _Registry(Generic[K]):
    """Each key's block as a replay registers it: the first block logged under the key,
    while that block was not reused since (its logged reuse frees the key for a later
    one). ``owners``: each key's block, and the token list and position it was logged at."""

    __slots__ = ("_keys", "_read", "owners")

    def __init__(self) -> None:
        self.owners: dict[K, tuple[KVCacheBlock, list[int], int]] = {}
        self._keys: dict[int, K] = {}  # id(block) -> its key, while it owns one
        self._read = 0  # events of the log read so far

    def read(
        self,
        log: list[Commit | KVCacheBlock],
        keys_of: Callable[[list[int], int, int], Iterable[K]],
    ) -> None:
        """Register the events ``log`` gained since the last read (a log only grows), in
        order. ``keys_of(token_ids, first, n)``: the keys of ``n`` positions from ``first``."""
        owners, keys = self.owners, self._keys
        for event in islice(log, self._read, None):
            if type(event) is tuple:
                token_ids, logged, first = event
                for position, (block, key) in enumerate(
                    zip(logged, keys_of(token_ids, first, len(logged)), strict=True), first
                ):
                    if block is not None and id(block) not in keys and key not in owners:
                        owners[key] = (block, token_ids, position)
                        keys[id(block)] = key
            else:
                owned = keys.pop(id(event), None)
                if owned is not None:
                    del owners[owned]
        self._read = len(log)


def _positions(token_ids: list[int], first: int, n: int) -> range:
    """A lone member's keys: its positions (its list's blocks' keys differ by position)."""
    return range(first, first + n)


class HashPrefixCache:
    """State per request: the chained hashes of its first full blocks (a dormant group's
    request holds its ``_Group`` in their place until the group is replayed)."""

    num_evictable = 0

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: dict[int, KVCacheBlock] = {}  # hash of the key -> its block
        self._dormant: dict[int, _Group] = {}  # hash of a first block's key -> its group
        self._eager: set[int] = set()  # first-block hashes of replayed groups
        # the last token list looked up: its blocks' hashes and keys as far as known, and
        # the cached blocks that lookup found
        self._memo_ids: list[int] | None = None
        self._memo_hashes: list[int] = []
        self._memo_keys: list[Key] = []
        self._memo_found: list[KVCacheBlock] = []

    def __len__(self) -> int:
        for group in list(self._dormant.values()):
            self._replay(group)
        return len(self._blocks)

    def new_state(self) -> HashState:
        return []

    def copy_state(self, state: HashState) -> HashState:
        if state:
            first = state[0]
            if type(first) is _Group:
                self._replay(first)
        return list(state)

    def first_block_hash(self, token_ids: list[int]) -> int:
        """The hash a lookup of ``token_ids`` starts from (given a full first block)."""
        return hash(_first_key(token_ids, self.block_size))

    def may_hit(self, first_hash: int) -> bool:
        """Whether a lookup starting from ``first_hash`` could find anything now: a cached
        first block, or a dormant group it would replay. False: it misses, changing nothing."""
        return first_hash in self._blocks or first_hash in self._dormant

    def sole_committer(self, token_ids: list[int], state: object) -> bool:
        """Whether the request whose state is ``state`` (None: one that holds no blocks
        now) is the only one that committed blocks under the first block of ``token_ids``,
        and no lookup has found that block's group yet (it is dormant, or not there): a
        lookup of its tokens then finds only its own blocks, those not reused since."""
        key0 = _first_key(token_ids, self.block_size)
        h0 = hash(key0)
        if h0 in self._eager:
            return False
        group = self._dormant.get(h0)
        if group is None:
            return h0 not in self._blocks
        if group.registry is not None:  # its member found its own blocks: the planner decides
            return False
        return group.key0 == key0 and all(member is state for member, _ in group.members)

    def match(self, token_ids: list[int], max_blocks: int) -> tuple[list[KVCacheBlock], HashState]:
        """The longest cached prefix of ``token_ids`` (at most ``max_blocks`` blocks).

        A waiting head that does not fit is looked up again every step, so the last list
        looked up keeps its blocks' keys (a request's token list only grows) and the blocks
        found: one still cached under its hash is found again without hashing its tokens.
        """
        if self._memo_ids is not token_ids:
            self._memo_ids = token_ids
            self._memo_hashes = []
            self._memo_keys = []
            self._memo_found = []
        hashes = self._memo_hashes
        keys = self._memo_keys
        found = self._memo_found[:max_blocks]
        blocks = found  # still cached under the same hash: found again
        if found and list(map(_hash_of, found)) != hashes[: len(found)]:
            blocks = []
            for cached, h in zip(found, hashes, strict=False):
                if cached.block_hash != h:
                    break
                blocks.append(cached)
        bs = self.block_size
        lookup = self._blocks.get
        known = len(hashes)
        i = len(blocks)
        parent: object = hashes[i - 1] if i else None
        while i < max_blocks:
            if i < known:
                h, key = hashes[i], keys[i]
            else:
                key = (parent, tuple(token_ids[i * bs : (i + 1) * bs]))
                h = hash(key)
                hashes.append(h)
                keys.append(key)
            if i == 0 and self._dormant:
                group = self._dormant.get(h)
                if group is not None:
                    own = self._own_hits(group, token_ids, max_blocks)
                    if own is not None:
                        return own
                    self._replay(group)
            block = lookup(h)
            if block is None or block.block_key != key:
                break
            blocks.append(block)
            parent = h
            i += 1
        self._memo_found = blocks
        return list(blocks), cast(HashState, hashes[:i])

    def _own_hits(
        self, group: _Group, token_ids: list[int], max_blocks: int
    ) -> tuple[list[KVCacheBlock], HashState] | None:
        """The lookup of dormant ``group``'s only member's own token list, without a replay
        (None: not that case). Its state is the member's, cut to the hit."""
        if len(group.members) != 1:
            return None
        state, member_ids = group.members[0]
        if member_ids is not token_ids:
            return None
        if not group.logs_reuse:
            self._log_reuse(group)  # it commits its positions again from here
        registry = group.registry
        if registry is None:
            registry = group.registry = _Registry()
        registry.read(group.log, _positions)
        owners = registry.owners
        hits = []
        for position in range(max_blocks):
            owner = owners.get(position)
            if owner is None or owner[0].block_key is not group:  # reused since
                break
            hits.append(owner[0])
        del state[len(hits) :]
        state.extend([group] * (len(hits) - len(state)))
        return hits, state

    def commit(
        self,
        state: HashState,
        token_ids: list[int],
        blocks: list[KVCacheBlock],
        num_full_blocks: int,
    ) -> tuple[HashState, list[Replacement]]:
        hashes = state
        first = len(hashes)
        if first >= num_full_blocks:
            return hashes, []
        if first == 0:
            bs = self.block_size
            key0 = _first_key(token_ids, bs)
            h0 = hash(key0)
            if h0 not in self._eager:
                group = self._dormant.get(h0)
                if group is None:
                    group = self._dormant[h0] = _Group(h0, key0)
                if group.key0 == key0:
                    if group.members and not group.logs_reuse:
                        self._log_reuse(group)
                    group.members.append((hashes, token_ids))
                    self._log(group, hashes, token_ids, blocks, 0, num_full_blocks)
                    return hashes, []
                self._replay(group)  # two first blocks share a hash: hash both eagerly
        else:
            group0 = hashes[0]
            if type(group0) is _Group:
                self._log(group0, hashes, token_ids, blocks, first, num_full_blocks)
                return hashes, []
        self._commit_eager(hashes, token_ids, blocks, first, num_full_blocks)
        return hashes, []

    def _log(
        self,
        group: _Group,
        hashes: HashState,
        token_ids: list[int],
        blocks: list[KVCacheBlock],
        first: int,
        num_full_blocks: int,
    ) -> None:
        logged = blocks[first:num_full_blocks]
        for block in logged:
            block.block_key = group
        group.log.append((token_ids, logged, first))
        group.live += len(logged)
        hashes.extend([group] * len(logged))

    def _commit_eager(
        self,
        hashes: HashState,
        token_ids: list[int],
        blocks: list[KVCacheBlock],
        first: int,
        num_full_blocks: int,
    ) -> None:
        bs = self.block_size
        cached = self._blocks
        parent: object = hashes[-1] if hashes else None
        chunks = [tuple(token_ids[a : a + bs]) for a in range(first * bs, num_full_blocks * bs, bs)]
        for block, chunk in zip(blocks[first:num_full_blocks], chunks, strict=True):
            key = (parent, chunk)
            parent = h = hash(key)
            hashes.append(h)
            if block.block_hash is None and cached.setdefault(h, block) is block:
                block.block_hash = h
                block.block_key = key

    @staticmethod
    def _log_reuse(group: _Group) -> None:
        """From now on reuse is logged; drop the blocks the first request lost unlogged."""
        group.logs_reuse = True
        group.log = [
            (c[0], [b if b is not None and b.block_key is group else None for b in c[1]], c[2])
            for c in group.log
            if type(c) is tuple  # all of them: with one request, reuse is not logged
        ]

    def _replay(self, group: _Group) -> None:
        """Hash a dormant group's log in order, leaving what eager hashing would have left."""
        del self._dormant[group.h0]
        self._eager.add(group.h0)
        bs = self.block_size
        chains: dict[int, list[tuple[int, Key]]] = {}

        def hashes_of(token_ids: list[int], first: int, n: int) -> list[int]:
            chain = chains.get(id(token_ids))
            if chain is None or len(chain) < first + n:
                chain = chains[id(token_ids)] = _chain(token_ids, bs, first + n)
            return [h for h, _ in chain[first : first + n]]

        registry: _Registry[int] = _Registry()
        registry.read(group.log, hashes_of)
        kept = []  # logged blocks not reused since (whether logged or not: one request)
        for event in group.log:
            if type(event) is tuple:
                for block in event[1]:
                    if block is not None and block.block_key is group:
                        block.block_key = None
                        kept.append(block)
        kept_ids = {id(block) for block in kept}
        cached = self._blocks
        for h, (block, token_ids, position) in registry.owners.items():
            if id(block) in kept_ids and cached.setdefault(h, block) is block:
                block.block_hash = h
                block.block_key = chains[id(token_ids)][position][1]
        for hashes, token_ids in group.members:
            chain = chains.get(id(token_ids))
            if chain is None or len(chain) < len(hashes):
                chain = _chain(token_ids, bs, len(hashes))
            hashes[:] = [h for h, _ in chain[: len(hashes)]]
        group.log = []
        group.members = []
        group.registry = None

    def forget_all(self, blocks: list[KVCacheBlock]) -> None:
        cached = self._blocks
        for block in blocks:
            key = block.block_key
            if key is None:
                continue
            h = block.block_hash
            if h is not None:  # then the cache holds it under h (only commit sets h)
                del cached[h]
                block.block_hash = block.block_key = None
            else:  # logged in its dormant group
                group: _Group = key  # type: ignore[assignment]  # (no cast: a call per block)
                block.block_key = None
                group.live -= 1
                if not group.live:
                    del self._dormant[group.h0]
                    group.log = []  # its requests' states point back to it: no cycle
                    group.members = []
                    group.registry = None
                elif group.logs_reuse:
                    group.log.append(block)

    def acquire(self, block: KVCacheBlock) -> None:
        raise BlockStateError(f"block {block.block_id}: the hash cache keeps no blocks")

    def release(self, block: KVCacheBlock) -> None:
        raise BlockStateError(f"block {block.block_id}: the hash cache keeps no blocks")

    def evict(self, n: int) -> list[KVCacheBlock]:
        return []
