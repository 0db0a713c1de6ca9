"""How many programs (thread blocks) of one kernel a streaming multiprocessor holds at once, and how many
waves of them a grid takes — the arithmetic of NVIDIA's occupancy calculator (``cuda_occupancy.h`` in the CUDA
toolkit: ``cudaOccMaxActiveBlocksPerMultiprocessor`` and its ``cudaOccMaxBlocksPerSMRegsLimit``).

A program needs ``warps`` warps, ``registers`` registers per thread and some shared memory. Registers go to a
warp in units of 256 — ``per warp = ⌈32·registers / 256⌉ · 256`` — from one of the SM's four sub-partitions of
16,384, so

    by registers = ⌊4 · ⌊16384 / per warp⌋ / warps⌋
    per SM = min(by registers, ⌊warps_max / warps⌋, blocks_max, ⌊shared_max / ⌈shared + reserved⌉⌋)

(``⌈·⌉`` of shared memory: its allocation unit), and a grid of ``P`` programs takes ``P / (SMs · per SM)``
waves. ``shared_max`` here is the most an SM can give; the driver may configure a smaller carveout for a kernel
that asks little (Nsight Compute's "Shared Memory Configuration Size": 32 KiB for the prepared loop, so its "Block
Limit Shared Mem" reads 21) — not modelled, so the shared-memory limit is checked against no report yet; the
register limit and the waves are (``kernel_runs.ncu_waves``). The limits per compute capability are the CUDA C++ Programming Guide's table of technical
specifications. A grid of 1.1 waves runs a second, almost empty round of programs: the "tail" a memory-bound
kernel pays for with idle bandwidth (README, round 17 of the W4A16 kernel). The register count is the compiled
kernel's as the card runs it (Nsight Compute's "Registers Per Thread", Triton's ``kernel.n_regs``); another
compiler's (``scripts/kernel_sass.py`` on a machine without the card's ``ptxas``) can differ.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds at once, and one block may ask (per compute capability)."""
    registers: int = 65536          # 32-bit registers per SM (and at most per block)
    sub_partitions: int = 4         # register files the SM's registers are split between
    warps: int = 64                 # resident warps
    blocks: int = 32                # resident blocks (programs)
    block_warps: int = 32           # warps one block may have (1,024 threads)
    shared_bytes: int = 233472      # shared memory an SM gives its blocks (228 KiB on 9.0)
    reserved_per_block: int = 1024  # shared memory the system keeps per block (8.0 and later)
    shared_unit: int = 128          # shared memory is given in units of this many bytes
    register_unit: int = 256        # registers are given to a warp in units of this many
    max_thread_registers: int = 255


SM_LIMITS = {
    90: SMLimits(),                                                                        # H100, H200
    80: SMLimits(shared_bytes=167936),                                                     # A100 (164 KiB)
    75: SMLimits(warps=32, blocks=16, shared_bytes=65536, reserved_per_block=0, shared_unit=256),   # T4
}


def block_limits(registers: int, warps: int, shared_bytes: int = 0, arch: int = 90) -> dict:
    """Programs per SM each resource allows — ``registers``, ``warps``, ``blocks``, ``shared`` — for programs
    of ``warps`` warps, ``registers`` registers per thread and ``shared_bytes`` of shared memory on compute
    capability ``arch`` (×10: 90 for the H100/H200), as the module's docstring works them out (Nsight Compute
    prints the same four as "Block Limit Registers", "… Warps", "… SM", "… Shared Mem"). Refuses a program no
    SM of that kind could launch."""
    for name, value, low in (("registers", registers, 1), ("warps", warps, 1), ("shared_bytes", shared_bytes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int ≥ {low}, got {value!r}")
    if arch not in SM_LIMITS:
        raise ValueError(f"arch {arch!r} is not one of {sorted(SM_LIMITS)} (compute capability × 10): add its "
                         "limits to occupancy.SM_LIMITS from the CUDA Programming Guide's table")
    sm = SM_LIMITS[arch]
    if registers > sm.max_thread_registers:
        raise ValueError(f"registers {registers} is more than a thread can have on arch {arch} "
                         f"({sm.max_thread_registers}): the compiler spills the rest — pass the compiled kernel's count")
    if warps > sm.block_warps:
        raise ValueError(f"warps {warps} is more than one block may have on arch {arch} ({sm.block_warps})")
    per_warp = -(-registers * 32 // sm.register_unit) * sm.register_unit
    parts = sm.sub_partitions
    if per_warp * (-(-warps // parts) * parts) > sm.registers:   # the launch check, warps rounded up to the parts
        raise ValueError(f"a program of {warps} warps × {registers} registers asks more than the {sm.registers} "
                         f"registers a block may have on arch {arch}")
    limits = {"registers": (sm.registers // parts // per_warp) * parts // warps, "warps": sm.warps // warps,
              "blocks": sm.blocks}
    if shared_bytes:
        unit = sm.shared_unit
        limits["shared"] = sm.shared_bytes // (-(-(shared_bytes + sm.reserved_per_block) // unit) * unit)
    if min(limits.values()) < 1:
        raise ValueError(f"a program of {warps} warps × {registers} registers and {shared_bytes} bytes of shared "
                         f"memory does not fit one SM of arch {arch} (limits {limits})")
    return limits


def programs_per_sm(registers: int, warps: int, shared_bytes: int = 0, arch: int = 90) -> int:
    """The programs one SM holds at once: the smallest of :func:`block_limits`."""
    return min(block_limits(registers, warps, shared_bytes, arch).values())


def waves(programs: int, sms: int, per_sm: int) -> float:
    """``programs / (sms · per_sm)``: how many rounds of programs a grid takes where each of ``sms`` SMs holds
    ``per_sm`` at once (:func:`programs_per_sm`); its fractional part is the last, partly idle round."""
    for name, value in (("programs", programs), ("sms", sms), ("per_sm", per_sm)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return programs / (sms * per_sm)
