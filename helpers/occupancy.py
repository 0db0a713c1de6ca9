"""How many programs (thread blocks) of one kernel a streaming multiprocessor holds at once, and how many
waves of them a grid takes — the arithmetic of NVIDIA's CUDA Occupancy Calculator.

A program needs ``warps`` warps, ``registers`` registers per thread and some shared memory; an SM gives
registers to a warp in units of 256 (so ``registers`` rounds up to a multiple of 8), and holds at most so many
warps, blocks, registers and bytes of shared memory (CUDA C++ Programming Guide, "Compute Capabilities",
the table of technical specifications per compute capability, and its occupancy section):

    per SM = min(blocks, ⌊warps_max / warps⌋, ⌊65536 / (warps · ⌈32·registers / 256⌉ · 256)⌋,
                 ⌊shared_max / (shared + reserved)⌋)

    waves = programs / (SMs · per SM)

A grid of 1.1 waves runs a second, almost empty round of programs: the "tail" that a memory-bound kernel
pays for with idle bandwidth (round 17 of the W4A16 kernel, README). The register count is the compiled
kernel's (Triton's ``kernel.n_regs``, ``scripts/kernel_sass.py``, or Nsight Compute's "Registers Per Thread"):
it changes with the compiler's version, so a count read on one machine predicts another's only where both
compiled the same code the same way.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds at once (per compute capability; the Programming Guide's table)."""
    registers: int = 65536          # 32-bit registers
    warps: int = 64                 # resident warps
    blocks: int = 32                # resident blocks (programs)
    shared_bytes: int = 233472      # shared memory an SM gives its blocks (228 KiB on 9.0)
    reserved_per_block: int = 1024  # shared memory the system keeps per block (8.0 and later)
    register_unit: int = 256        # registers are given to a warp in units of this many
    max_thread_registers: int = 255


SM_LIMITS = {
    90: SMLimits(),                                                          # H100, H200
    80: SMLimits(shared_bytes=167936),                                       # A100 (164 KiB)
    75: SMLimits(warps=32, blocks=16, shared_bytes=65536, reserved_per_block=0),   # T4
}


def programs_per_sm(registers: int, warps: int, shared_bytes: int = 0, arch: int = 90) -> int:
    """Programs of ``warps`` warps, ``registers`` registers per thread and ``shared_bytes`` of shared memory
    that one SM of compute capability ``arch`` (×10: 90 for the H100/H200) holds at once — the formula of the
    module's docstring. Refuses what no SM of that kind could run at all."""
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
    if warps > sm.warps:
        raise ValueError(f"warps {warps} is more than one SM of arch {arch} holds ({sm.warps})")
    per_warp = -(-registers * 32 // sm.register_unit) * sm.register_unit
    fits = [sm.blocks, sm.warps // warps, sm.registers // (per_warp * warps)]
    if shared_bytes:
        fits.append(sm.shared_bytes // (shared_bytes + sm.reserved_per_block))
    per_sm = min(fits)
    if per_sm < 1:
        raise ValueError(f"a program of {warps} warps × {registers} registers and {shared_bytes} bytes of shared "
                         f"memory does not fit one SM of arch {arch}")
    return per_sm


def waves(programs: int, sms: int, per_sm: int) -> float:
    """``programs / (sms · per_sm)``: how many rounds of programs a grid takes where each of ``sms`` SMs holds
    ``per_sm`` at once (:func:`programs_per_sm`); its fractional part is the last, partly idle round."""
    for name, value in (("programs", programs), ("sms", sms), ("per_sm", per_sm)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return programs / (sms * per_sm)
