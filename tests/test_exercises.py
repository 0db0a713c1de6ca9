"""Every exercise checker accepts its solution, rejects a wrong answer, and treats "not written" as the profile says."""
import pytest

from helpers import exercises, solutions, w4_kernel


def _no_hinv_diag(W1, Hinv1, i, q):
    err = W1[:, i] - q
    W1[:, i:] -= err[:, None] @ Hinv1[i, i:][None, :]
    return W1


def _no_unscale(w, X, alpha, bits, group):
    s = X.abs().mean(0).pow(alpha).clamp(min=1e-4)
    E = solutions.group_fake_quant(w * s, bits, group) - w
    return ((X @ E.T) ** 2).sum().item() / (X.shape[0] * w.shape[0])


def _off_by_one(logits, tokens):
    import torch
    return float(torch.exp(-torch.log_softmax(logits[1:].double(), -1).gather(-1, tokens[1:, None]).mean()))


def _gap_only(snapshot, request, cap):
    """The tempting shortcut: "fragmentation" whenever the free bytes add up, without asking whether a
    free block or a new segment would have served the request."""
    free = sum(b["size"] for s in snapshot for b in s["blocks"] if not b["state"].startswith("active"))
    return "fragmentation" if free >= request else "too-big"


def test_the_split_exercises_solution_is_the_kernels_rule():
    """helpers.solutions.narrow_split, the exercise's hidden answer, is w4_kernel.narrow_split at the rule's own
    warps per SM, on every tile count and step count of a grid (ties included)."""
    for tiles in (1, 3, 5, 18, 64, 128, 448, 896, 4008):
        for steps in range(1, 65):
            for sms in (8, 132):
                assert solutions.narrow_split(tiles, steps, sms, 2, w4_kernel.NARROW_WARPS_PER_SM) == \
                    w4_kernel.narrow_split(tiles, steps, sms, 2), (tiles, steps, sms)


@pytest.mark.parametrize("name", sorted(exercises.EXERCISES))
def test_solution_passes_and_wrong_answer_fails(name, capsys, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "full")
    checker, solution, _ = exercises.EXERCISES[name]
    assert checker(solution) is None
    wrong = {"w4_gemv": lambda x, c, s, z, g: (c.float() * s.repeat_interleave(g, 1)) @ x,   # forgot the zero
             "kv_pool_blocks": lambda u, w, a, n, b, bs=16: int((u - w - n) // (b * bs)),  # forgot activations
             "correct_vocab_check": lambda t, e: t == e,                                  # the seed's check
             "free_after_loop": lambda items: [None for t in items],                       # "del t" frees nothing
             "param_count": lambda *a: solutions.param_count(*a[:-1], False),            # ignores tied embeddings
             "kv_cache_bytes": lambda L, h, d, s, b, by: L * h * d * s * b * by,          # forgot K and V
             "round_alloc": lambda n: 256 * ((n + 255) // 256),                           # wrong granularity
             "group_fake_quant": lambda w, b, g: w,                                       # does nothing
             "gptq_column_step": _no_hinv_diag,                                           # forgot ÷ Hinv[i, i]
             "awq_alpha_error": _no_unscale,                                              # forgot ÷ s
             "ppl_from_logits": _off_by_one,                                              # logits[t] vs token t
             "int4_kv_bytes_per_token": lambda L, h, d, g: 2 * L * h * d / 2,            # forgot the scales
             "diagnose_snapshot": _gap_only,
             "tp_kv_bytes_per_rank": lambda L, h, d, tp, n, b: 2 * L * h / tp * d * n * b,   # splits a head
             "programs_per_sm": lambda r, w: min(65536 // (-(-r * 32 // 256) * 256 * w), 64 // w, 32),  # one file
             "narrow_split": w4_kernel.gemv_split}[name]          # the largest divisor below, not the nearest
    assert exercises.check(name, wrong) is False
    assert "✗" in capsys.readouterr().out


def test_not_written_yet(monkeypatch, capsys):
    def todo(*a):
        raise NotImplementedError
    monkeypatch.setenv("COURSE_PROFILE", "full")
    assert exercises.check("w4_gemv", todo) is False and "not written yet" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_PROFILE", "ci")
    assert exercises.check("w4_gemv", todo) is True and "hidden solution" in capsys.readouterr().out
    broken = exercises.EXERCISES["correct_vocab_check"][1]
    assert exercises.check("correct_vocab_check", lambda t, e: t == e) is True      # CI: the solution is checked
    assert "hidden solution passes" in capsys.readouterr().out and broken(1, 2)


def test_learner_error_is_reported_not_raised(capsys, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "full")
    assert exercises.check("w4_gemv", lambda *a: 1 / 0) is False
    assert "ZeroDivisionError" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown exercise"):
        exercises.check("nope", solutions.w4_gemv)
