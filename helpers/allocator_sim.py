"""A small, faithful simulator of PyTorch's CUDA caching allocator — and a runner for the real one.

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

:func:`run_real` replays the same op sequence on a real GPU, in a fresh subprocess so the allocator
starts empty and ``PYTORCH_CUDA_ALLOC_CONF`` can be set before CUDA initialises.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from .device import card_gib

KB, MB, GB = 1024, 1024**2, 1024**3
K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MB
K_SMALL_BUFFER = 2 * MB
K_LARGE_BUFFER = 20 * MB
K_MIN_LARGE_ALLOC = 10 * MB
K_ROUND_LARGE = 2 * MB
PAGE = 20 * MB          # expandable segments map the large pool in kLargeBuffer-sized pages (small: 2 MiB)
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


@dataclass
class Block:
    offset: int
    size: int
    free: bool = True
    name: str | None = None
    mapped: bool = True            # expandable segments: is this address range backed by pages?


@dataclass
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
        best = None
        for seg in self.segments:
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
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"allocation {name!r}: size must be a positive number of bytes, got {size!r} "
                             "(PyTorch's allocator is not called for an empty tensor)")
        size = round_size(size)
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


# ------------------------------------------------------------------ op sequences (sim and real)
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


_OP_ARITY = {"alloc": 3, "free": 2, "empty_cache": 1}


def _apply(sim, op):
    if not isinstance(op, (list, tuple)) or not op or op[0] not in _OP_ARITY or len(op) != _OP_ARITY[op[0]]:
        raise ValueError(f"unknown op {op!r}: an op is ['alloc', name, bytes], ['free', name] or ['empty_cache'] "
                         "(helpers.allocator_sim.parse_ops reads them from text)")
    kind = op[0]
    if kind == "alloc":
        sim.malloc(op[2], op[1])
    elif kind == "free":
        sim.free(op[1])
    elif kind == "empty_cache":
        sim.empty_cache()
    else:
        raise ValueError(f"unknown op {op!r}")


_REAL_SCRIPT = r"""
import json, sys, torch
ops, cap, card = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
torch.cuda.init()
total = torch.cuda.get_device_properties(0).total_memory
if card:  # emulated card: what the driver already uses (contexts, the notebook's kernel) comes off it
    sys.path.insert(0, sys.argv[4])
    from helpers.device import card_share
    free, total_now = torch.cuda.mem_get_info()
    share = card_share(card, total_now, free)
    cap = share if cap is None else min(cap, share)
if cap:
    torch.cuda.set_per_process_memory_fraction(cap / total)
live, res, trace = {}, {"oom": False, "failed_at": None, "cap": cap}, []
for i, op in enumerate(ops):
    try:
        if op[0] == "alloc":
            live[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
        elif op[0] == "free":
            del live[op[1]]
        elif op[0] == "empty_cache":
            torch.cuda.empty_cache()
    except torch.OutOfMemoryError:
        res.update(oom=True, failed_at=i, summary=torch.cuda.memory_summary(abbreviated=True))
        break
    trace.append((torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
torch.cuda.synchronize()
res.update(allocated=torch.cuda.memory_allocated(), reserved=torch.cuda.memory_reserved(), trace=trace,
           peak_reserved=torch.cuda.max_memory_reserved(),
           snapshot=[{"segment_type": s["segment_type"], "total_size": s["total_size"],
                      "blocks": [{"size": b["size"], "state": b["state"]} for b in s["blocks"]]}
                     for s in torch.cuda.memory_snapshot()])
print("RESULT" + json.dumps(res))
"""


def run_real(ops: list, cap: int | None = None, expandable: bool = False, timeout: int = 300,
             max_split_mb: int | None = None) -> dict:
    """Replay ``ops`` on the real GPU in a fresh subprocess (clean allocator, env set before CUDA).
    ``cap`` (bytes) caps its allocator; under ``COURSE_GPU_GIB`` it is at most the subprocess's
    :func:`~helpers.device.card_share` of that card (the notebook's own process holds part of it).
    ``max_split_mb`` sets ``max_split_size_mb`` (PyTorch allows ≥ 20). The result's ``trace`` is
    ``(allocated, reserved)`` after every op that ran, as :func:`simulate` returns it."""
    if max_split_mb is not None and (isinstance(max_split_mb, bool) or not isinstance(max_split_mb, int)
                                     or max_split_mb < 20):
        raise ValueError(f"max_split_mb must be an integer ≥ 20 (PyTorch's minimum) or None, got {max_split_mb!r}")
    env = dict(os.environ)
    conf = [c for c in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
            if c and "expandable" not in c and "max_split" not in c]
    if expandable:
        conf.append("expandable_segments:True")
    if max_split_mb is not None:
        conf.append(f"max_split_size_mb:{max_split_mb}")
    env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(conf)
    out = subprocess.run([sys.executable, "-c", _REAL_SCRIPT, json.dumps(ops), json.dumps(cap),
                          json.dumps(card_gib()), str(Path(__file__).resolve().parent.parent)],
                         capture_output=True, text=True, env=env, timeout=timeout)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"real allocator run failed:\n{out.stderr[-2000:]}")
    return json.loads(line[len("RESULT"):])


_UNITS = {"b": 1, "kib": KB, "kb": KB, "mib": MB, "mb": MB, "gib": GB, "gb": GB}


def parse_ops(text: str) -> list:
    """Ops from a line a learner types: ``"a=300MiB; b=20MiB; free a; c=250MiB; empty_cache"``
    (``;`` or newlines between ops; sizes in B, KiB, MiB or GiB — KB/MB/GB are read as binary units,
    as PyTorch reports them). Raises ValueError naming the op it cannot read."""
    import re

    if not isinstance(text, str):
        raise ValueError(f"ops must be text such as 'a=300MiB; free a', got {type(text).__name__}")
    ops, live = [], set()
    for raw in re.split(r"[;\n]", text):
        op = raw.strip()
        if not op:
            continue
        if op == "empty_cache":
            ops.append(["empty_cache"])
        elif op.startswith("free "):
            name = op[5:].strip()
            if name not in live:
                raise ValueError(f"op {op!r}: nothing named {name!r} is allocated (allocate it first: {name}=100MiB)")
            live.discard(name)
            ops.append(["free", name])
        elif m := re.fullmatch(r"(\w+)\s*=\s*([\d.]+)\s*([KMG]i?B|B)", op, flags=re.I):
            size = float(m.group(2)) * _UNITS[m.group(3).lower()]
            if not size >= 1:
                raise ValueError(f"op {op!r}: the size must be at least 1 B")
            if m.group(1) in live:
                raise ValueError(f"op {op!r}: {m.group(1)!r} is already allocated (free it first, or pick another name)")
            live.add(m.group(1))
            ops.append(["alloc", m.group(1), int(size)])
        else:
            raise ValueError(f"cannot read op {op!r}: write name=SIZE (a=300MiB), free NAME, or empty_cache")
    return ops


def random_sequence(seed: int, n_ops: int = 48) -> tuple[list, int]:
    """``(ops, cap)``: a seeded random workload for checking the simulator against the real allocator —
    allocations of small (512 B – 1 MiB), mid (1 – 10 MiB) and large (10 – 300 MiB) sizes, frees of
    random live tensors in random order, and a cap between 0.7 and 1.4 × the peak of live bytes (so
    some sequences run out and some do not)."""
    import random

    rng = random.Random(seed)
    ops, live, now, peak = [], {}, 0, 0
    for i in range(n_ops):
        if live and rng.random() < 0.4:
            name = rng.choice(sorted(live))
            now -= live.pop(name)
            ops.append(["free", name])
            continue
        kind = rng.random()
        size = (rng.randint(512, MB) if kind < 0.3 else rng.randint(MB, 10 * MB) if kind < 0.6
                else rng.randint(10 * MB, 300 * MB))
        live[f"t{i}"] = size
        now += size
        peak = max(peak, now)
        ops.append(["alloc", f"t{i}", size])
    return ops, int(peak * rng.uniform(0.7, 1.4))


# ------------------------------------------------------------------ the notebook's sequences
def seed_snippet(n: int = 20, big: int = 1 * GB, small: int = 256 * MB, request: int = 2 * GB,
                 as_written: bool = True) -> list:
    """The source document's fragmentation snippet (``../shared/seeds/002…``, "模拟碎片化"):
    n × (big + small) kept in a list, then ``for big, small in tensors: del big``, ``empty_cache()``,
    and a ``request``.

    ``as_written=True`` replays what that code does: ``del big`` deletes only the loop variable, the
    list still holds every tensor, so **nothing is freed** (:func:`seed_loop_keeps_tensors_alive`
    shows it on the CPU). ``as_written=False`` is what the text meant: the big tensors really freed
    (``tensors = [(None, s) for _, s in tensors]``)."""
    ops = []
    for i in range(n):
        ops += [["alloc", f"big{i}", big], ["alloc", f"small{i}", small]]
    if not as_written:
        ops += [["free", f"big{i}"] for i in range(n)]
    ops += [["empty_cache"], ["alloc", "request", request]]
    return ops


def seed_loop_keeps_tensors_alive(n: int = 20) -> dict:
    """Run the seed's loop as written on small CPU tensors and count, with weak references, how
    many "freed" big tensors are still alive: the list holds them, ``del big`` drops only a name."""
    import torch

    tensors = []
    for _ in range(n):
        big, small = torch.empty(1024), torch.empty(256)
        tensors.append((big, small))
    refs = [weakref.ref(b) for b, _ in tensors]
    for big, small in tensors:  # noqa: B007  (the seed's loop, verbatim)
        del big
    alive_as_written = sum(r() is not None for r in refs)
    tensors = [(None, s) for _, s in tensors]  # the corrected version: drop the list's references
    return {"n": n, "alive_as_written": alive_as_written, "alive_after_fix": sum(r() is not None for r in refs)}


def fragmenting_sequence(block: int = 64 * MB, n: int = 16, request_blocks: int = 2) -> list:
    """Blocks split inside ONE cached segment, every other one freed, then a larger request.

    1. allocate and free one ``n × block`` tensor → one cached segment of that size;
    2. allocate ``n`` blocks: best-fit carves all of them out of that segment (splitting);
    3. free every other block → ``n/2`` holes of ``block`` bytes, none adjacent;
    4. ask for ``request_blocks × block``: no hole is big enough, and under a cap of
       ``(n + 1) × block`` a new segment does not fit → OOM, although
       ``reserved − allocated = n/2 × block`` exceeds the request.
    """
    ops = [["alloc", "arena", n * block], ["free", "arena"]]
    ops += [["alloc", f"b{i}", block] for i in range(n)]
    ops += [["free", f"b{i}"] for i in range(0, n, 2)]
    ops += [["alloc", "request", request_blocks * block]]
    return ops


def fragmenting_cap(block: int = 64 * MB, n: int = 16) -> int:
    """The cap used with :func:`fragmenting_sequence`: the arena plus one block."""
    return (n + 1) * block


def fenced_cycles_sequence(cycles: int = 8, big: int = 138 * MB, fence: int = 2 * MB) -> list:
    """The pattern of pytorch/pytorch#123548 (``max_split_size_mb`` together with
    ``expandable_segments``): each cycle allocates two ``big`` tensors and a small ``fence`` that stays
    alive after them, then frees the two. The freed pair merges into one free block walled off from
    the segment's unmapped tail by the fence. With ``max_split_size_mb`` below ``big``, the next cycle's
    requests skip that block (it is ≥ the request + 20 MiB: ``get_free_block``'s oversize filter) and
    map new pages instead, so reserved memory grows every cycle while allocated stays small."""
    ops = []
    for c in range(cycles):
        ops += [["alloc", f"a{c}", big], ["alloc", f"b{c}", big], ["alloc", f"fence{c}", fence],
                ["free", f"a{c}"], ["free", f"b{c}"]]
    return ops


def empty_cache_sequence(block: int = 64 * MB, n: int = 8) -> list:
    """What empty_cache can and cannot release: a wholly free segment goes, a segment with one
    live block stays whole."""
    ops = [["alloc", "arena", n * block], ["free", "arena"]]          # segment A, wholly free
    ops += [["alloc", "other", n * block + 2 * MB]]                    # segment B (won't fit in A)
    ops += [["alloc", "pin", block]]                                   # carved from A
    ops += [["free", "other"], ["empty_cache"]]                        # B released, A kept (pinned)
    return ops
