"""Op sequences for PyTorch's CUDA caching allocator: the format that the simulator
(:func:`helpers.allocator_sim.simulate`) and the real replay (:func:`helpers.allocator_replay.run_real`)
both run, read from the text a learner types, drawn at random, and the notebooks' sequences.

An op is ``["alloc", name, bytes]``, ``["free", name]`` or ``["empty_cache"]``.
"""
from __future__ import annotations

import random
import re
import weakref

from .units import GiB, KiB, MiB

OP_ARITY = {"alloc": 3, "free": 2, "empty_cache": 1}


def check_size(size, name: str) -> int:
    """``size`` when it is a positive number of bytes (an int), else a ValueError naming the allocation."""
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"allocation {name!r}: size must be a positive number of bytes, got {size!r} "
                         "(PyTorch's allocator is not called for an empty tensor)")
    return size


def check_op(op) -> None:
    """Raise ValueError unless ``op`` is one of the three ops (an ``alloc`` with a positive size)."""
    if not isinstance(op, (list, tuple)) or not op or op[0] not in OP_ARITY or len(op) != OP_ARITY[op[0]]:
        raise ValueError(f"unknown op {op!r}: an op is ['alloc', name, bytes], ['free', name] or ['empty_cache'] "
                         "(helpers.allocator_ops.parse_ops reads them from text)")
    if op[0] == "alloc":
        check_size(op[2], op[1])


_UNITS = {"b": 1, "kib": KiB, "kb": KiB, "mib": MiB, "mb": MiB, "gib": GiB, "gb": GiB}


def parse_ops(text: str) -> list:
    """Ops from a line a learner types: ``"a=300MiB; b=20MiB; free a; c=250MiB; empty_cache"``
    (``;`` or newlines between ops; sizes in B, KiB, MiB or GiB — KB/MB/GB are read as binary units,
    as PyTorch reports them). Raises ValueError naming the op it cannot read."""
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
    rng = random.Random(seed)
    ops, live, now, peak = [], {}, 0, 0
    for i in range(n_ops):
        if live and rng.random() < 0.4:
            name = rng.choice(sorted(live))
            now -= live.pop(name)
            ops.append(["free", name])
            continue
        kind = rng.random()
        size = (rng.randint(512, MiB) if kind < 0.3 else rng.randint(MiB, 10 * MiB) if kind < 0.6
                else rng.randint(10 * MiB, 300 * MiB))
        live[f"t{i}"] = size
        now += size
        peak = max(peak, now)
        ops.append(["alloc", f"t{i}", size])
    return ops, int(peak * rng.uniform(0.7, 1.4))


# ------------------------------------------------------------------ the notebooks' sequences (02, 09)
SEED_VERSIONS = ("as_written", "corrected")


def seed_snippet(version: str = "as_written", n: int = 20, big: int = 1 * GiB, small: int = 256 * MiB,
                 request: int = 2 * GiB) -> list:
    """The source document's fragmentation snippet (``../shared/seeds/002…``, "模拟碎片化"):
    n × (big + small) kept in a list, then ``for big, small in tensors: del big``, ``empty_cache()``,
    and a ``request``, in one of :data:`SEED_VERSIONS`:

    * ``"as_written"`` — what that code does: ``del big`` deletes only the loop variable, the list
      still holds every tensor, so **nothing is freed** (:func:`seed_loop_keeps_tensors_alive`
      shows it on the CPU);
    * ``"corrected"`` — what the text meant: the big tensors really freed
      (``tensors = [(None, s) for _, s in tensors]``) before ``empty_cache()``."""
    if version not in SEED_VERSIONS:
        raise ValueError(f"version must be one of {list(SEED_VERSIONS)} (the seed's loop as written, or with the "
                         f"big tensors really freed), got {version!r}")
    ops = []
    for i in range(n):
        ops += [["alloc", f"big{i}", big], ["alloc", f"small{i}", small]]
    if version == "corrected":
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


def fragmenting_sequence(block: int = 64 * MiB, n: int = 16, request_blocks: int = 2) -> list:
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


def fragmenting_cap(block: int = 64 * MiB, n: int = 16) -> int:
    """The cap used with :func:`fragmenting_sequence`: the arena plus one block."""
    return (n + 1) * block


def fenced_cycles_sequence(cycles: int = 8, big: int = 138 * MiB, fence: int = 2 * MiB) -> list:
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


def empty_cache_sequence(block: int = 64 * MiB, n: int = 8) -> list:
    """What empty_cache can and cannot release: a wholly free segment goes, a segment with one
    live block stays whole."""
    ops = [["alloc", "arena", n * block], ["free", "arena"]]          # segment A, wholly free
    ops += [["alloc", "other", n * block + 2 * MiB]]                    # segment B (won't fit in A)
    ops += [["alloc", "pin", block]]                                   # carved from A
    ops += [["free", "other"], ["empty_cache"]]                        # B released, A kept (pinned)
    return ops
