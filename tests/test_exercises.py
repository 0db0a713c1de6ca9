"""Every exercise checker accepts its solution, rejects a wrong answer, and treats "not written" as the profile says."""
import pytest

from helpers import exercises, solutions


@pytest.mark.parametrize("name", sorted(exercises.EXERCISES))
def test_solution_passes_and_wrong_answer_fails(name, capsys, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "full")
    checker, solution, _ = exercises.EXERCISES[name]
    assert checker(solution) is None
    wrong = {"w4_gemv": lambda x, c, s, z, g: (c.float() * s.repeat_interleave(g, 1)) @ x,   # forgot the zero
             "kv_pool_blocks": lambda u, w, a, n, b, bs=16: int((u - w - n) // (b * bs)),  # forgot activations
             "correct_vocab_check": lambda t, e: t == e,                                  # the seed's check
             "free_after_loop": lambda items: [None for t in items]}[name]                 # "del t" frees nothing
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
