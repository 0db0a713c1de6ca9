""""Your turn" cells: the learner writes a small function, :func:`check` tests it against the course.

A cell looks like::

    def my_gemv(x, codes, scale, zero, group):
        raise NotImplementedError   # your code here
    exercises.check("w4_gemv", my_gemv)

``check`` prints ✓ or what is wrong (never raises, so *Run all* goes on). A function that still raises
``NotImplementedError`` is "not written yet". In the CI profile, wherever the notebook's version is
unwritten or broken on purpose (the clinic's repair exercises), the hidden solution
(:mod:`helpers.solutions`) is checked too, so every checker is itself tested against a correct answer
on every CI run.
"""
from __future__ import annotations

import torch

from . import solutions
from .config import is_ci
from .quant import quantize_tensor


def _w4_gemv(fn) -> str | None:
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(24, 256, generator=g), torch.randn(256, generator=g)
    q = quantize_tensor(w, bits=4, symmetric=False, granularity="group", group_size=64)
    want = q.dequantize() @ x
    got = fn(x, q.codes, q.scale, q.zero, 64)
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"expected a tensor of shape {tuple(want.shape)}, got {getattr(got, 'shape', type(got).__name__)}"
    err = (got.float() - want).abs().max().item()
    return None if err < 1e-3 * want.abs().max().item() else f"max error {err:.3g} against dequantize-then-matmul"


def _kv_pool_blocks(fn) -> str | None:
    GiB = 1024**3   # vllm-project/vllm#12330: 35.55 − 14.96 − 9.37 − 0.10 GiB, 128 KiB per token → ~5693 blocks
    got = fn(35.55 * GiB, 14.96 * GiB, 9.37 * GiB, 0.10 * GiB, 131072)
    want = solutions.kv_pool_blocks(35.55 * GiB, 14.96 * GiB, 9.37 * GiB, 0.10 * GiB, 131072)
    return None if got == want else f"expected {want} blocks (vLLM's log says 5691 from unrounded GiB), got {got}"


def _correct_vocab_check(fn) -> str | None:
    cases = [((49152, 49152), True), ((151665, 151936), True), ((32001, 32000), False)]
    bad = [(a, want) for a, want in cases if bool(fn(*a)) != want]
    return None if not bad else f"wrong verdict for (tokenizer length, embedding rows) = {bad[0][0]}: expected {bad[0][1]}"


def _free_after_loop(fn) -> str | None:
    import gc
    import weakref
    items = [torch.ones(4), torch.ones(4)]
    refs = [weakref.ref(t) for t in items]
    fn(items)
    gc.collect()
    alive = sum(r() is not None for r in refs)
    return None if alive == 0 else f"{alive} of 2 tensors are still alive: something still references them"


EXERCISES = {
    "w4_gemv": (_w4_gemv, solutions.w4_gemv, "reshape to [rows, groups, group]; sum x·q per group; "
                                               "subtract zero · Σx per group; multiply by the scale; sum groups"),
    "kv_pool_blocks": (_kv_pool_blocks, solutions.kv_pool_blocks,
                       "usable − weights − activation peak − non-torch, divided by bytes per block"),
    "correct_vocab_check": (_correct_vocab_check, solutions.correct_vocab_check,
                            "padded embedding tables are larger than the tokenizer; what must never happen?"),
    "free_after_loop": (_free_after_loop, solutions.free_after_loop,
                        "`del t` inside a loop deletes a name; who else holds the tensors?"),
}


def check(name: str, fn) -> bool:
    """Test ``fn`` for exercise ``name``; print ✓ or the problem and a hint. Returns True on success."""
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; known: {sorted(EXERCISES)}")
    checker, solution, hint = EXERCISES[name]
    try:
        problem = checker(fn)
    except NotImplementedError:
        if not is_ci():
            print(f"✗ {name}: not written yet — replace `raise NotImplementedError` with your code. Hint: {hint}")
            return False
        problem = checker(solution)
        if problem:
            raise AssertionError(f"the hidden solution of {name!r} fails its own check: {problem}") from None
        print(f"✓ {name}: (CI profile) the hidden solution passes the check")
        return True
    except Exception as e:  # noqa: BLE001 - the learner's code failed: say how, do not stop Run all
        print(f"✗ {name}: your function raised {type(e).__name__}: {e}. Hint: {hint}")
        return False
    print(f"✓ {name}: correct" if problem is None else f"✗ {name}: {problem}. Hint: {hint}")
    if problem is not None and is_ci():   # CI: the notebook's broken-on-purpose version fails; test the solution
        solved = checker(solution)
        if solved:
            raise AssertionError(f"the hidden solution of {name!r} fails its own check: {solved}")
        print(f"✓ {name}: (CI profile) the hidden solution passes the check")
        return True
    return problem is None
