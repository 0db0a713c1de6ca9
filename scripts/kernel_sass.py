"""What the compiler made of a course kernel: its SASS for a GPU architecture, on any machine (no GPU).

    python scripts/kernel_sass.py                      # the one-row GEMV, 128 rows, 2 groups of 128 per step
    python scripts/kernel_sass.py --block-n 256 --warps 8 --groups 1 --group 64 --arch 90
    python scripts/kernel_sass.py --kernel tc --block-n 64 --stages 3   # the tensor-core kernel (M up to 16)

Triton compiles a ``@triton.jit`` function for a target it is told (``GPUTarget``) with the ``ptxas`` it
ships; ``nvdisasm`` (shipped beside it) turns the binary into SASS, the instructions the GPU runs. The
script prints the instruction mix of the kernel's inner loop (the longest backward branch) and its
memory instructions: how many instructions each int32 word of 8 codes costs, whether the weights
arrive as 128-bit loads (``LDG.E…128``), and whether anything spilled to local memory (``STL``/``LDL``).
That is how this course's GEMV was rewritten (the previous one spent about twice the instructions
per word) — and how a missing ``tt.divisibility`` hint showed up as 64 scalar loads instead of 16 wide
ones (integer arguments divisible by 16, as Triton's launcher specialises them, are declared so here).
The tensor-core kernel had the same flaw in another form: its group offsets came from a running ``k``
whose alignment the compiler could not know, so each thread loaded its 64 weight bytes one byte at a
time (64 ``LDG.E.EF.U8``) with no asynchronous pipelining; built from the step index, they became eight
8-byte asynchronous copies (``LDGSTS.E.64``; the activations four 16-byte ones) and the loop 2.3 times
shorter.
``tests/test_kernel_sass.py`` keeps those properties from regressing.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GEMV_SIGNATURE = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "y_ptr": "*bf16",
                  "ws_ptr": "*fp32", "lock_ptr": "*i32", "N": "i32", "K": "i32", "SPLIT_K": "i32",
                  "stride_wn": "i32", "stride_sn": "i32"}
DIVISIBLE = ("x_ptr", "w_ptr", "s_ptr", "z_ptr", "y_ptr", "ws_ptr", "lock_ptr", "N", "K", "stride_wn")


SWITCHES = {"MAGIC": True, "HALF2": False, "ACC16": False, "PDL": False}   # the GEMV's on/off constexprs
TC_SIGNATURE = {"x_ptr": "*bf16", "b_ptr": "*u8", "s_ptr": "*fp16", "z_ptr": "*fp16", "y_ptr": "*bf16",
                "ws_ptr": "*fp32", "lock_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "SPLIT_K": "i32",
                "stride_xm": "i32", "stride_bn": "i32", "stride_sn": "i32", "stride_ym": "i32"}
TC_DIVISIBLE = ("x_ptr", "b_ptr", "s_ptr", "z_ptr", "y_ptr", "ws_ptr", "lock_ptr", "N", "K", "stride_xm",
                "stride_bn", "stride_sn", "stride_ym")   # as the launcher specialises them for K/group = 32 or more


def _sass_of(kernel_fn, signature: dict, constexprs: dict, divisible, arch: int, options: dict) -> str:
    """Compile a ``@triton.jit`` source function for ``sm_{arch}`` and return its SASS (``nvdisasm``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import JITFunction
    fn = JITFunction(kernel_fn)   # compiled, even where TRITON_INTERPRET=1 makes jit interpret
    names = fn.arg_names
    src = ASTSource(fn=fn, signature={**signature, **{name: "constexpr" for name in constexprs}},
                    constexprs={(names.index(k),): v for k, v in constexprs.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in divisible})
    kernel = triton_compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        Path(cubin).write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", cubin], capture_output=True, text=True, check=True).stdout
        try:
            usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", cubin], capture_output=True, text=True).stdout
        except OSError:   # a Triton without cuobjdump beside its ptxas: the SASS alone
            usage = ""
    found = re.search(r"REG:\d+.*", usage)
    return (f"// resources: {found.group(0).strip()}\n" if found else "") + sass


def _in_child(args: list[str], stdin: str | None = None) -> str:
    """This script's output for ``args`` (``--print-sass …`` or ``--many``), from a child process without
    ``TRITON_INTERPRET`` (Triton's interpreter, chosen at import, cannot also compile); a failure is raised
    with the child's last output."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__, *args], input=stdin, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"compiling in a child process ({' '.join(args)}) failed (exit {done.returncode}); "
                           f"its last output:\n{done.stderr[-2000:]}")
    return done.stdout


def gemv_sass(group: int = 128, groups: int = 2, block_n: int = 128, warps: int = 4, arch: int = 90,
              maxnreg: int | None = None, **switches) -> str:
    """The SASS of :func:`helpers.w4_kernel._w4a16_gemv_kernel` compiled for ``sm_{arch}`` with the
    :data:`SWITCHES` given (e.g. ``HALF2=True``) and, optionally, a register cap (``maxnreg``: ptxas
    spills what does not fit) — in a child process where ``TRITON_INTERPRET=1`` (Triton's
    interpreter, chosen at import, cannot also compile)."""
    unknown = set(switches) - set(SWITCHES)
    if unknown:
        raise ValueError(f"unknown GEMV switches {sorted(unknown)}; known: {sorted(SWITCHES)}")
    switches = {**SWITCHES, **switches}
    if os.environ.get("TRITON_INTERPRET") == "1":
        return _in_child(["--print-sass", "--group", str(group), "--groups", str(groups), "--block-n", str(block_n),
                          "--warps", str(warps), "--arch", str(arch)] + (["--maxnreg", str(maxnreg)] if maxnreg else [])
                         + [f"--{'on' if on else 'off'}={name}" for name, on in switches.items()])
    from helpers import w4_kernel
    constexprs = dict(GROUP=group, GROUPS=groups, BLOCK_N=block_n, SERIAL=True, STAGES=1, EVEN=True,
                      ACC_LIMIT=w4_kernel.acc16_x_limit(group), **switches)
    return _sass_of(w4_kernel._w4a16_gemv_kernel, GEMV_SIGNATURE, constexprs, DIVISIBLE, arch,
                    dict(num_warps=warps, num_stages=1, maxnreg=maxnreg))


def tc_sass(group: int = 128, groups: int = 2, block_n: int = 64, warps: int = 4, stages: int = 3, arch: int = 90,
            block_m: int = 16, swap: bool = True) -> str:
    """The SASS of :func:`helpers.w4_kernel._w4a16_tc_kernel` for ``sm_{arch}``: bf16 activations, the
    ``lop3`` dequantizer, ``block_m`` rows per program (16: any M up to 16), one split of K (no reduction)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return _in_child(["--print-sass", "--kernel", "tc", "--group", str(group), "--groups", str(groups), "--block-n", str(block_n),
                          "--warps", str(warps), "--stages", str(stages), "--arch", str(arch),
                          "--block-m", str(block_m)] + ([] if swap else ["--no-swap"]))
    import triton.language as tl

    from helpers import w4_kernel
    constexprs = dict(GROUP=group, GROUPS=groups, BLOCK_M=block_m, BLOCK_N=block_n, DEQUANT="lop3", SWAP=swap,
                      REDUCE="none", CODE_DT=tl.bfloat16, OFFSET=128.0, PDL=False)
    return _sass_of(w4_kernel._w4a16_tc_kernel, TC_SIGNATURE, constexprs, TC_DIVISIBLE, arch,
                    dict(num_warps=warps, num_stages=stages))


PREPARED_SIGNATURE = {"planes_ptr": "*i32", "xs_ptr": "*fp32", "inv_ptr": "*fp32", "w_ptr": "*i32", "s_ptr": "*fp16",
                      "z_ptr": "*fp16", "y_ptr": "*bf16", "ws_ptr": "*fp32", "lock_ptr": "*i32", "N": "i32", "K": "i32",
                      "SPLIT_K": "i32", "plane_stride": "i32", "stride_wn": "i32", "stride_sn": "i32"}
PREPARED_DIVISIBLE = ("planes_ptr", "xs_ptr", "w_ptr", "s_ptr", "z_ptr", "y_ptr", "ws_ptr", "lock_ptr", "N", "K",
                      "plane_stride", "stride_wn")


def prepared_sass(group: int = 128, groups: int = 4, block_n: int = 32, warps: int = 2, arch: int = 90,
                  pdl: bool = False, subnormal: bool = False) -> str:
    """The SASS of :func:`helpers.w4_kernel._gemv_prepared_kernel` (``KERNEL="prepared"``: the one-row loop with
    the activation side prepared, round 12; ``pdl``: launched with programmatic dependent launch, round 16;
    ``subnormal``: the codes as fp16 subnormals, config ``SUBNORMAL``, round 17) for ``sm_{arch}``."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return _in_child(["--print-sass", "--kernel", "prepared", "--group", str(group), "--groups", str(groups), "--block-n",
                          str(block_n), "--warps", str(warps), "--arch", str(arch)] + (["--pdl"] if pdl else [])
                         + (["--subnormal"] if subnormal else []))
    from helpers import w4_kernel
    constexprs = dict(GROUP=group, GROUPS=groups, BLOCK_N=block_n, PREFETCH=False, PLAIN=False, PDL=pdl,
                      SUBNORMAL=subnormal)
    return _sass_of(w4_kernel._gemv_prepared_kernel, PREPARED_SIGNATURE, constexprs, PREPARED_DIVISIBLE, arch,
                    dict(num_warps=warps, num_stages=1))


KERNELS = {"gemv": gemv_sass, "tc": tc_sass, "prepared": prepared_sass}


def many_sass(requests: list) -> list[str]:
    """The SASS of several kernels, each request ``(kernel, keywords)`` with ``kernel`` a :data:`KERNELS`
    name and ``keywords`` what its function takes, compiled in one process: where ``TRITON_INTERPRET=1``,
    in one child for all of them (the child's imports of torch, Triton and the kernels take longer than
    compiling one kernel)."""
    requests = [tuple(r) for r in requests]
    for r in requests:
        if len(r) != 2 or r[0] not in KERNELS or not isinstance(r[1], dict):
            raise ValueError(f"each request must be (kernel, keywords) with kernel one of {sorted(KERNELS)} "
                             f"and keywords a dict, got {r!r}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return json.loads(_in_child(["--many"], stdin=json.dumps(requests)))
    return [KERNELS[kernel](**kw) for kernel, kw in requests]


def inner_loop(sass: str) -> str:
    """The body of the longest loop: from a label to the farthest branch back to it."""
    lines, best = sass.splitlines(), (0, 0)
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m:
            for j in range(i):
                if lines[j].strip() == m.group(1) + ":" and i - j > best[1] - best[0]:
                    best = (j, i)
    return "\n".join(lines[best[0]:best[1] + 1])


def opcodes(sass: str) -> collections.Counter:
    """Instruction counts by opcode (predicates and modifiers dropped: ``LDG.E.128`` counts as ``LDG``)."""
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    return ops


def memory_ops(sass: str) -> collections.Counter:
    """Loads and stores with their full modifiers (``LDG.E.EF.128``: a 128-bit global load, evict-first)."""
    return collections.Counter(re.findall(r"\b((?:LDG|STG|LDS|STS|LDL|STL|LDGSTS)[A-Z0-9._]*)", sass))


def registers(sass: str) -> int:
    """Registers per thread the kernel uses: the highest general register it names, plus one."""
    return 1 + max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1)


def resources(sass: str) -> dict:
    """What the binary asks of an SM per thread and block, as ``cuobjdump -res-usage`` prints it (the first line
    :func:`_sass_of` puts before the SASS): ``REG`` — the registers allocated per thread, which can exceed
    :func:`registers` (two more on the prepared loop at 8 groups of 128) and are what
    :func:`helpers.occupancy.programs_per_sm` needs — ``SHARED`` static bytes per block, ``LOCAL`` bytes per
    thread. Empty where there is no ``cuobjdump`` beside Triton's ``ptxas`` or it gave nothing."""
    found = re.search(r"^// resources: (.*)$", sass, re.M)
    return {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", found.group(1))} if found else {}


def words_per_thread(group: int, groups: int, block_n: int, warps: int) -> float:
    """int32 words of codes one thread reads per loop step: ``block_n`` rows × ``group·groups / 8`` words."""
    return block_n * group * groups / 8 / (32 * warps)


def main():
    ap = argparse.ArgumentParser(prog="python scripts/kernel_sass.py")
    ap.add_argument("--kernel", choices=("gemv", "tc", "prepared"), default="gemv",
                    help="gemv: the one-row CUDA-core GEMV; tc: the tensor-core kernel (M up to --block-m rows); "
                         "prepared: round 12's one-row loop with the activation side prepared (KERNEL='prepared')")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--groups", type=int, default=2, help="groups per step (GROUPS)")
    ap.add_argument("--block-n", type=int, default=None, help="output rows per program (default: gemv 128, tc 64)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3, help="tc: software-pipeline stages (num_stages)")
    ap.add_argument("--block-m", type=int, default=16, help="tc: activation rows per program")
    ap.add_argument("--no-swap", action="store_true", help="tc: x·Wᵀ (the activations as the MMA's first operand)")
    ap.add_argument("--arch", type=int, default=90, help="compute capability ×10 (90: H100/H200, 80: A100)")
    ap.add_argument("--on", action="append", default=[], choices=sorted(SWITCHES), help="gemv: switch one on (repeatable)")
    ap.add_argument("--off", action="append", default=[], choices=sorted(SWITCHES), help="gemv: switch one off")
    ap.add_argument("--maxnreg", type=int, help="gemv: cap the registers per thread (ptxas spills the rest)")
    ap.add_argument("--pdl", action="store_true", help="prepared: with programmatic dependent launch (config PDL)")
    ap.add_argument("--subnormal", action="store_true",
                    help="prepared: the codes as fp16 subnormals (config SUBNORMAL, round 17)")
    ap.add_argument("--print-sass", action="store_true", help="print the whole SASS only")
    ap.add_argument("--many", action="store_true",
                    help="read a JSON list of [kernel, keywords] requests on stdin, print their SASS as a JSON list")
    args = ap.parse_args()
    if args.many:
        print(json.dumps(many_sass(json.load(sys.stdin))))
        return
    both = sorted(set(args.on) & set(args.off))
    if both:
        ap.error(f"switched both on and off: {both} (give each switch once, with --on or --off)")
    if args.kernel != "gemv" and (args.on or args.off or args.maxnreg):
        ap.error("--on, --off and --maxnreg are the GEMV's (--kernel gemv)")
    if args.pdl and args.kernel != "prepared":
        ap.error("--pdl is the prepared loop's (--kernel prepared); the GEMV's is --on=PDL")
    if args.subnormal and args.kernel != "prepared":
        ap.error("--subnormal is the prepared loop's (--kernel prepared)")
    block_n = args.block_n or {"gemv": 128, "tc": 64, "prepared": 32}[args.kernel]
    if args.kernel == "prepared":
        sass = prepared_sass(args.group, args.groups, block_n, args.warps, args.arch, pdl=args.pdl,
                             subnormal=args.subnormal)
    elif args.kernel == "gemv":
        sass = gemv_sass(args.group, args.groups, block_n, args.warps, args.arch, args.maxnreg,
                         **{name: True for name in args.on}, **{name: False for name in args.off})
    else:
        sass = tc_sass(args.group, args.groups, block_n, args.warps, args.stages, args.arch, args.block_m,
                       swap=not args.no_swap)
    if args.print_sass:
        print(sass)
        return
    loop = inner_loop(sass)
    ops = opcodes(loop)
    if args.kernel in ("gemv", "prepared"):
        words = words_per_thread(args.group, args.groups, block_n, args.warps)
        print(f"{'GEMV' if args.kernel == 'gemv' else 'prepared GEMV loop'}, group {args.group} × {args.groups} per step, {block_n} rows, {args.warps} warps, sm_{args.arch}: "
              f"inner loop {sum(ops.values())} instructions for {words:g} words per thread = "
              f"{sum(ops.values()) / words:.1f} per word of 8 codes")
    else:
        nbytes = block_n * args.group * args.groups // 2 / (32 * args.warps)
        print(f"tensor-core kernel, group {args.group} × {args.groups} per step, {block_n} rows × {args.block_m} "
              f"activation rows, {args.warps} warps, {args.stages} stages, sm_{args.arch}: inner loop "
              f"{sum(ops.values())} instructions for {nbytes:g} weight bytes per thread")
    print("by opcode:", ", ".join(f"{k} {v}" for k, v in ops.most_common(12)), f"(barriers: {ops['BAR']})")
    print("loads and stores in the loop:", dict(memory_ops(loop)))
    print("registers per thread (highest R used + 1):", registers(sass))
    res = resources(sass)
    if res.get("REG"):
        from helpers import occupancy
        line = (f"allocated (cuobjdump -res-usage): {res['REG']} registers per thread, {res.get('SHARED', 0)} bytes of "
                "static shared memory per block")
        if args.arch in occupancy.SM_LIMITS:
            per_sm = occupancy.programs_per_sm(res["REG"], args.warps, res.get("SHARED", 0), arch=args.arch)
            line += (f" -> {per_sm} programs of {args.warps} warps per SM on sm_{args.arch} (helpers.occupancy; the "
                     "card's compiler may allocate differently)")
        print(line)
    print("spills to local memory anywhere:", sum(v for k, v in memory_ops(sass).items() if k[:3] in ("STL", "LDL")))


if __name__ == "__main__":
    main()
