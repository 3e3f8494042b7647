"""The paged KV cache's bookkeeping: fixed-size blocks, reference counts and a tenant-scoped prefix cache.

The tensors live in the model; this module only decides which block ids hold which positions. A block
is *free* when no sequence references it. A free block that was once full keeps its hash and stays
findable by the prefix cache until it is reused (evicted), oldest first.
"""

from __future__ import annotations

from collections import OrderedDict

from cpu_engine.sequence import Sequence

BlockKey = tuple[str, int | None, tuple[int, ...]]


class BlockPool:
    def __init__(self, num_blocks: int, block_size_tokens: int, enable_prefix_cache: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self.enable_prefix_cache = enable_prefix_cache
        self.ref_counts = [0] * num_blocks
        # NOTE: the hash is only a dict key; the full key (scope, parent hash, token ids) is kept and
        # compared on every hit, so a hash collision can never serve another prefix's keys and values.
        self._block_keys: list[BlockKey | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block id
        # Free blocks in eviction order (oldest first). Values unused: an ordered set.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        # Copy-on-write work for the model runner: (source block, destination block).
        self.pending_copies: list[tuple[int, int]] = []
        self.num_query_tokens = 0  # prompt tokens looked up in the prefix cache
        self.num_hit_tokens = 0  # of which found

    # ----- accounting -----
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size_tokens)

    # ----- prefix cache -----
    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached run of ``seq``'s full blocks within its scope. No side effects."""
        if not self.enable_prefix_cache:
            return []
        hits: list[int] = []
        parent: int | None = None
        for i in range(seq.num_tokens // self.block_size_tokens):
            key = self._key(seq, i, parent)
            block_id = self._cached.get(hash(key))
            if block_id is None or self._block_keys[block_id] != key:
                break
            hits.append(block_id)
            parent = hash(key)
        return hits

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks ``seq`` has fully computed so later sequences of its scope can share them."""
        if not self.enable_prefix_cache:
            return
        num_full = seq.num_computed_tokens // self.block_size_tokens
        for i in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[i - 1] if i else None
            key = self._key(seq, i, parent)
            block_hash = hash(key)
            seq.block_hashes.append(block_hash)
            block_id = seq.block_table[i]
            # Another sequence may have computed the same block first; then ours stays private.
            if block_hash not in self._cached and self._block_keys[block_id] is None:
                self._cached[block_hash] = block_id
                self._block_keys[block_id] = key

    def _key(self, seq: Sequence, index: int, parent: int | None) -> BlockKey:
        start = index * self.block_size_tokens
        return (seq.cache_scope, parent, tuple(seq.token_ids[start : start + self.block_size_tokens]))

    # ----- allocation -----
    def can_admit(self, cached: list[int], num_reserved_tokens: int, num_watermark_blocks: int) -> bool:
        """Whether the pool can hold ``num_reserved_tokens`` (prompt + max_tokens) for a new sequence.

        Cached blocks count as already held, but a cached block that is currently free stops being free.
        """
        num_needed = self.blocks_for_tokens(num_reserved_tokens) - len(cached)
        num_revived = sum(1 for b in cached if self.ref_counts[b] == 0)
        return self.num_free_blocks - num_revived - num_needed >= num_watermark_blocks

    def admit(self, seq: Sequence, cached: list[int]) -> None:
        """Give ``seq`` its prefix-cache hits. At least one token is always left to compute (for logits)."""
        assert not seq.block_table, "admit() is for sequences that hold no blocks"
        for block_id in cached:
            self._incref(block_id)
        seq.block_table = list(cached)
        seq.block_hashes = [hash(self._block_keys[b]) for b in cached]
        num_cached = min(len(cached) * self.block_size_tokens, seq.num_tokens - 1)
        seq.num_computed_tokens = num_cached
        seq.num_cached_prompt_tokens = num_cached
        self.num_query_tokens += seq.num_tokens
        self.num_hit_tokens += num_cached

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_free_blocks >= self._num_blocks_to_write(seq, num_new_tokens)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make room to write positions [num_computed, num_computed + num_new_tokens) of ``seq``.

        A shared block about to be written is copied first (copy-on-write): this happens when a whole
        prompt was a cache hit and its last token is recomputed to get logits.
        """
        assert self.can_allocate(seq, num_new_tokens)
        first = seq.num_computed_tokens // self.block_size_tokens
        if first < len(seq.block_table) and self.ref_counts[seq.block_table[first]] > 1:
            src = seq.block_table[first]
            dst = self._pop_free()
            self.pending_copies.append((src, dst))
            self._decref(src)
            seq.block_table[first] = dst
        num_missing = self.blocks_for_tokens(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(num_missing):
            seq.block_table.append(self._pop_free())

    def share(self, parent: Sequence, child: Sequence) -> None:
        """``child`` (holding no blocks) takes ``parent``'s blocks and computed tokens, each block shared
        (``allocate`` copies a shared block before either writes to it)."""
        assert not child.block_table, "share() is for sequences that hold no blocks"
        for block_id in parent.block_table:
            self._incref(block_id)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens

    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq``; its full blocks stay in the prefix cache until evicted."""
        # Reverse order: a sequence's tail blocks are evicted before its head, which other prompts share.
        for block_id in reversed(seq.block_table):
            self._decref(block_id)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def _num_blocks_to_write(self, seq: Sequence, num_new_tokens: int) -> int:
        num_missing = self.blocks_for_tokens(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        first = seq.num_computed_tokens // self.block_size_tokens
        needs_copy = first < len(seq.block_table) and self.ref_counts[seq.block_table[first]] > 1
        return max(num_missing, 0) + int(needs_copy)

    def _pop_free(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        key = self._block_keys[block_id]
        if key is not None:  # evict: the block's old contents are about to be overwritten
            self._block_keys[block_id] = None
            del self._cached[hash(key)]
        self.ref_counts[block_id] = 1
        return block_id

    def _incref(self, block_id: int) -> None:
        if self.ref_counts[block_id] == 0:
            del self._free[block_id]
        self.ref_counts[block_id] += 1

    def _decref(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        assert self.ref_counts[block_id] >= 0, f"block {block_id} freed twice"
        if self.ref_counts[block_id] == 0:
            self._free[block_id] = None
            if self._block_keys[block_id] is None:
                # Nothing to find in it: reuse it before any cached block.
                self._free.move_to_end(block_id, last=False)
