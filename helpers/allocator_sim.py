"""A small, faithful simulator of PyTorch's CUDA caching allocator.

The policy (c10/cuda/CUDACachingAllocator.cpp, default settings):

* every request is rounded up to a multiple of 512 B (``kMinBlockSize``);
* requests ≤ 1 MiB (``kSmallSize``) use the *small pool*, whose segments are 2 MiB
  (``kSmallBuffer``); larger ones use the *large pool*: a new segment is 20 MiB (``kLargeBuffer``) for
  requests < 10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``);
* a request takes the **best fit**: the smallest cached free block of its pool that is large enough;
* the block is **split** when the remainder is ≥ 512 B (small pool) or > 1 MiB (large pool); with
  ``max_split_size_mb`` set, blocks at least that large are "oversize": never split, and a request
  below the limit never takes one;
* a freed block **coalesces** with free neighbours of the same segment;
* when no cached block fits, a new segment is requested from the driver (``cudaMalloc``); if that
  would exceed the cap (``set_per_process_memory_fraction``) the allocator first releases every
  *wholly free* segment and retries, then raises OOM;
* ``empty_cache()`` releases wholly free segments only — a segment with one live block stays.

``expandable_segments:True`` reserves one large virtual segment per pool and maps physical pages
into it (20 MiB pages in the large pool, 2 MiB in the small one) as they are needed: a request that no
free mapped block holds maps pages at the *lowest* address where free and unmapped space add up to it
(at first the end, later the holes); the cap is checked against mapped bytes + the request's
allocation size; on pressure (or ``empty_cache``) every whole free page is unmapped, so holes stop
costing memory. :class:`CachingAllocatorSim` models it block by block (``expandable=True``), after
``find_expandable_block``, ``try_allocate_expandable_block``, ``map_block`` and ``unmap_block`` in
c10/cuda/CUDACachingAllocator.cpp.

:func:`simulate` runs an op sequence (:mod:`helpers.allocator_ops`);
:func:`helpers.allocator_replay.run_real` runs the same sequence on the real allocator.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .allocator_ops import check_op, check_size
from .units import MiB

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
PAGE = 20 * MiB          # expandable segments map the large pool in kLargeBuffer-sized pages (small: 2 MiB)
VIRTUAL_BYTES = 2**40   # address space of one expandable segment (real: 1 1/8 × the card; never the limit here)


class SimOutOfMemory(RuntimeError):
    """Raised by the simulator where the real allocator would raise torch.OutOfMemoryError."""


def round_size(size: int) -> int:
    """Request size rounded up to the 512-byte block granularity."""
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    return K_MIN_BLOCK if size < K_MIN_BLOCK else K_MIN_BLOCK * ((size + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def segment_size(size: int) -> int:
    """Bytes the allocator asks the driver for when ``size`` (already rounded) fits no cached block."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


@dataclass(eq=False)   # identity: blocks are found in their segment's list by `is`, not by value
class Block:
    offset: int
    size: int
    free: bool = True
    name: str | None = None
    mapped: bool = True            # expandable segments: is this address range backed by pages?


@dataclass(eq=False)
class Segment:
    pool: str                      # "small" | "large"
    size: int
    blocks: list = field(default_factory=list)
    page: int = 0                  # expandable: the page size it maps (2 MiB small, 20 MiB large); 0: a cudaMalloc

    @property
    def expandable(self) -> bool:
        return self.page > 0

    @property
    def wholly_free(self) -> bool:
        return all(b.free for b in self.blocks)

    @property
    def mapped_bytes(self) -> int:
        return sum(b.size for b in self.blocks if b.mapped) if self.page else self.size


class CachingAllocatorSim:
    """Replays malloc/free/empty_cache with the caching allocator's policy (see module docstring).

    ``cap`` is the per-process limit on *reserved* bytes (None: unlimited);
    ``max_split_size`` mirrors ``max_split_size_mb`` (bytes; None = unlimited, the default).
    """

    def __init__(self, cap: int | None = None, expandable: bool = False, max_split_size: int | None = None):
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap <= 0):
            raise ValueError(f"cap must be a positive number of bytes or None (no cap), got {cap!r}")
        self.cap, self.expandable, self.max_split = cap, expandable, max_split_size
        self.segments: list[Segment] = []
        self.live: dict[str, tuple[Segment, Block]] = {}
        self.peak_reserved = 0

    @classmethod
    def from_snapshot(cls, segments: list[dict]) -> CachingAllocatorSim:
        """A simulator holding the segments of a recorded ``torch.cuda.memory._snapshot()["segments"]``
        (each ``address``, ``total_size``, ``segment_type`` and ``blocks`` as ``[size, state]``): live
        blocks named ``seg{i}.{j}``, the others free. Segments are added from the highest address down,
        so the best fit's ties go to the lowest address as in the real allocator. The default allocator's
        segments only (each a ``cudaMalloc``; no ``expandable_segments`` pages)."""
        sim = cls()
        for i, sg in enumerate(sorted(segments, key=lambda s: -s["address"])):
            seg, offset = Segment("small" if sg["segment_type"] == "small" else "large", sg["total_size"]), 0
            for j, (size, state) in enumerate(sg["blocks"]):
                blk = Block(offset, size, state != "active_allocated")
                if not blk.free:
                    blk.name = f"seg{i}.{j}"
                    sim.live[blk.name] = (seg, blk)
                seg.blocks.append(blk)
                offset += size
            if offset != seg.size:
                raise ValueError(f"segment {i}: its blocks add up to {offset} B, not its total_size {seg.size} B")
            sim.segments.append(seg)
        sim.peak_reserved = sim.reserved
        return sim

    # ---------------------------------------------------------------- accounting
    @property
    def allocated(self) -> int:
        return sum(b.size for s in self.segments for b in s.blocks if not b.free)

    @property
    def reserved(self) -> int:
        """Bytes held from the driver: cudaMalloc'd segments, and the mapped pages of expandable ones."""
        return sum(s.mapped_bytes for s in self.segments)

    # ---------------------------------------------------------------- policy
    def _pool(self, size: int) -> str:
        return "small" if size <= K_SMALL_SIZE else "large"

    def _should_split(self, block: Block, size: int, pool: str) -> bool:
        """``shouldSplit``: the small pool, and every pool under ``expandable_segments``, splits whenever
        ≥ 512 B would remain; the large pool otherwise only when more than 1 MiB would remain."""
        remaining = block.size - size
        if pool == "small" or self.expandable:
            return remaining >= K_MIN_BLOCK
        if self.max_split is not None and block.size >= self.max_split:
            return False
        return remaining > K_SMALL_SIZE

    def _best_fit(self, size: int, pool: str):
        """The smallest free block of ``pool`` holding ``size``. Ties go to the lowest address, as the
        real allocator orders its free blocks by (size, address) (``BlockComparatorSize``); the driver
        hands out each new large segment below the earlier ones, so among equal sizes the newest
        segment's block wins, and within a segment the lowest offset."""
        best = None
        for seg in reversed(self.segments):
            if seg.pool != pool:
                continue
            for blk in seg.blocks:
                if not blk.free or blk.size < size:
                    continue
                if self.max_split is not None and pool == "large":
                    if size < self.max_split <= blk.size:
                        continue  # oversize blocks serve only oversize requests
                    if size >= self.max_split and blk.size >= size + K_LARGE_BUFFER:
                        continue
                if best is None or blk.size < best[1].size:
                    best = (seg, blk)
        return best

    def _take(self, seg: Segment, blk: Block, size: int, name: str, pool: str) -> None:
        if self._should_split(blk, size, pool):
            rest = Block(blk.offset + size, blk.size - size, True)
            blk.size = size
            seg.blocks.insert(seg.blocks.index(blk) + 1, rest)
        blk.free, blk.name = False, name
        self.live[name] = (seg, blk)

    def _new_segment(self, size: int, pool: str) -> Segment | None:
        want = segment_size(size)
        if self.cap is not None and self.reserved + want > self.cap:
            return None
        seg = Segment(pool, want, [Block(0, want, True)])
        self.segments.append(seg)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return seg

    def malloc(self, size: int, name: str) -> None:
        """Allocate ``size`` bytes under ``name`` or raise :class:`SimOutOfMemory`."""
        if name in self.live:
            raise ValueError(f"name {name!r} is already allocated")
        size = round_size(check_size(size, name))
        pool = self._pool(size)
        if self.expandable:
            return self._malloc_expandable(size, name, pool)
        found = self._best_fit(size, pool)
        if found is None:
            seg = self._new_segment(size, pool)
            if seg is None:                      # release wholly free segments, then retry once
                self.empty_cache()
                seg = self._new_segment(size, pool)
            if seg is None:
                raise SimOutOfMemory(f"cannot allocate {size} B: reserved {self.reserved}, "
                                     f"allocated {self.allocated}, cap {self.cap}")
            found = (seg, seg.blocks[0])
        self._take(*found, size, name, pool)

    # ---------------------------------------------------------------- expandable segments
    def _malloc_expandable(self, size: int, name: str, pool: str) -> None:
        """``malloc`` under ``expandable_segments``: each pool is one virtual segment, mapped in pages
        (20 MiB large, 2 MiB small). (1) ``get_free_block``: the best-fitting free *mapped* block;
        (2) else ``alloc_block``: refused if mapped bytes + the request's allocation size
        (:func:`segment_size`) pass the cap, otherwise the lowest-address run of free and unmapped
        blocks that can hold it gets just enough pages mapped; (3) else ``release_cached_blocks``
        (every free page unmapped) and ``alloc_block`` once more; (4) else OOM."""
        seg = self._expandable_segment(pool)
        blk = self._free_mapped_fit(seg, size, self.max_split)
        if blk is None:
            blk = self._alloc_expandable(seg, size)
        if blk is None:
            self.empty_cache()
            blk = self._alloc_expandable(seg, size)
        if blk is None:
            raise SimOutOfMemory(f"cannot map {segment_size(size)} B more: reserved {self.reserved}, cap {self.cap}")
        self._take(seg, blk, size, name, pool)

    def _expandable_segment(self, pool: str) -> Segment:
        seg = next((s for s in self.segments if s.pool == pool and s.expandable), None)
        if seg is None:
            page = K_SMALL_BUFFER if pool == "small" else K_LARGE_BUFFER
            va = page * (VIRTUAL_BYTES // page)
            seg = Segment(pool, va, [Block(0, va, True, mapped=False)], page=page)
            self.segments.append(seg)
        return seg

    @staticmethod
    def _free_mapped_fit(seg: Segment, size: int, max_split: int | None = None) -> Block | None:
        """``get_free_block``: the smallest free mapped block that holds ``size`` (ties: lowest address);
        then, walking up in size, move on while the next block's *expandable size* (its size plus an
        unmapped neighbour after it) is smaller — so a block that could grow is kept for later. With
        ``max_split`` set, ``get_free_block``'s oversize filter applies here too (it does not ask which
        kind of segment a block is in): a request below the limit skips blocks at or above it, and a
        request at or above it skips blocks 20 MiB (``kLargeBuffer``) or more larger than itself."""
        def allowed(b: Block) -> bool:
            if max_split is None or seg.pool != "large":
                return True
            if size < max_split <= b.size:
                return False
            return not (size >= max_split and b.size >= size + K_LARGE_BUFFER)

        fits = sorted((b for b in seg.blocks if b.free and b.mapped and b.size >= size and allowed(b)),
                      key=lambda b: (b.size, b.offset))
        if not fits:
            return None

        def expandable_size(b: Block) -> int:
            i = seg.blocks.index(b)
            nxt = seg.blocks[i + 1] if i + 1 < len(seg.blocks) else None
            return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

        k = 0
        while k + 1 < len(fits) and expandable_size(fits[k + 1]) < expandable_size(fits[k]):
            k += 1
        return fits[k]

    def _alloc_expandable(self, seg: Segment, size: int) -> Block | None:
        """``alloc_block`` + ``try_allocate_expandable_block`` (see :meth:`_malloc_expandable`)."""
        if self.cap is not None and self.reserved + segment_size(size) > self.cap:
            return None
        blk = self._lowest_room(seg, size)
        if blk is None:
            return None
        if not blk.mapped:
            blk = self._map(seg, blk, min(blk.size, size))
        while blk.size < size:                       # free mapped -> unmapped: map what is missing
            nxt = seg.blocks[seg.blocks.index(blk) + 1]
            blk = self._map(seg, nxt, min(size - blk.size, nxt.size))
        return blk

    @staticmethod
    def _lowest_room(seg: Segment, size: int) -> Block | None:
        """``find_expandable_block``: the lowest-address unmapped block (or the free mapped block just
        before it) from which consecutive free and unmapped blocks add up to ``size``."""
        for i, b in enumerate(seg.blocks):
            if b.mapped:
                continue
            start = i - 1 if i > 0 and seg.blocks[i - 1].free else i
            room = 0
            for c in seg.blocks[start:]:
                if not c.free or room >= size:
                    break
                room += c.size
            if room >= size:
                return seg.blocks[start]
        return None

    def _map(self, seg: Segment, blk: Block, size: int) -> Block:
        """Map the pages covering the first ``size`` bytes of the unmapped ``blk``; the rest stays
        unmapped. The mapped part merges with free mapped neighbours."""
        n = seg.page * ((size + seg.page - 1) // seg.page)
        if n < blk.size:
            seg.blocks.insert(seg.blocks.index(blk) + 1, Block(blk.offset + n, blk.size - n, True, mapped=False))
            blk.size = n
        blk.mapped = True
        blk = self._merge(seg, blk)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return blk

    @staticmethod
    def _unmap(seg: Segment, blk: Block) -> None:
        """Unmap the whole pages inside the free mapped ``blk``; the slivers before and after stay mapped."""
        begin = seg.page * ((blk.offset + seg.page - 1) // seg.page)
        end = seg.page * ((blk.offset + blk.size) // seg.page)
        if begin >= end:
            return
        i = seg.blocks.index(blk)
        pieces = [Block(blk.offset, begin - blk.offset, True)] if begin > blk.offset else []
        hole = Block(begin, end - begin, True, mapped=False)
        pieces.append(hole)
        if blk.offset + blk.size > end:
            pieces.append(Block(end, blk.offset + blk.size - end, True))
        seg.blocks[i:i + 1] = pieces
        CachingAllocatorSim._merge(seg, hole)

    @staticmethod
    def _merge(seg: Segment, blk: Block) -> Block:
        """Coalesce the free ``blk`` with free neighbours in the same state (mapped or not)."""
        i = seg.blocks.index(blk)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].free and seg.blocks[i + 1].mapped == blk.mapped:
            blk.size += seg.blocks.pop(i + 1).size
        if i > 0 and seg.blocks[i - 1].free and seg.blocks[i - 1].mapped == blk.mapped:
            prev = seg.blocks[i - 1]
            prev.size += blk.size
            seg.blocks.pop(i)
            blk = prev
        return blk

    # ---------------------------------------------------------------- free, empty_cache, snapshot
    def free(self, name: str) -> None:
        """Free a named allocation; the block coalesces with free neighbours in its segment."""
        if name not in self.live:
            raise KeyError(f"{name!r} is not allocated")
        seg, blk = self.live.pop(name)
        blk.free, blk.name = True, None
        self._merge(seg, blk)

    def empty_cache(self) -> None:
        """``release_cached_blocks``: wholly free cudaMalloc'd segments go back to the driver, and every
        whole free page of an expandable segment is unmapped. Nothing that holds a live block moves."""
        self.segments = [s for s in self.segments if s.expandable or not s.wholly_free]
        for s in self.segments:
            if s.expandable:
                for b in [b for b in s.blocks if b.free and b.mapped]:
                    self._unmap(s, b)

    def snapshot(self) -> list[dict]:
        """Segments and blocks in the shape of ``torch.cuda.memory_snapshot()`` (for the same plot); an
        expandable segment shows, like the real snapshot, one segment per run of mapped pages."""
        out = []
        for s in self.segments:
            runs = [s.blocks]
            if s.expandable:
                runs = []
                for prev, b in zip([None] + s.blocks[:-1], s.blocks):
                    if b.mapped and prev is not None and prev.mapped:
                        runs[-1].append(b)
                    elif b.mapped:
                        runs.append([b])
            for run in runs:
                out.append({"segment_type": s.pool, "total_size": sum(b.size for b in run),
                            "blocks": [{"size": b.size, "state": "inactive" if b.free else "active_allocated"}
                                       for b in run]})
        return out


# ------------------------------------------------------------------ an op sequence in the simulator
def simulate(ops: list, cap: int | None = None, expandable: bool = False, max_split_size: int | None = None) -> dict:
    """Replay ``ops`` (``["alloc", name, bytes]``, ``["free", name]``, ``["empty_cache"]``) in the
    simulator; stop at the first OOM. Returns oom, failed op index, allocated, reserved (at the end
    or at the failure), the peak of reserved, the snapshot, and ``trace``: ``(allocated, reserved)``
    after every op that ran (the timeline a plot draws). ``max_split_size`` (bytes) mirrors
    ``max_split_size_mb``."""
    sim = CachingAllocatorSim(cap=cap, expandable=expandable, max_split_size=max_split_size)
    result = {"oom": False, "failed_at": None}
    trace = []
    for i, op in enumerate(ops):
        try:
            _apply(sim, op)
        except SimOutOfMemory:
            result.update(oom=True, failed_at=i)
            break
        trace.append((sim.allocated, sim.reserved))
    result.update(allocated=sim.allocated, reserved=sim.reserved, peak_reserved=sim.peak_reserved,
                  snapshot=sim.snapshot(), trace=trace)
    return result


def _apply(sim, op):
    check_op(op)
    kind = op[0]
    if kind == "alloc":
        sim.malloc(op[2], op[1])
    elif kind == "free":
        sim.free(op[1])
    else:
        sim.empty_cache()
