import math

import pytest
import torch

from helpers import evaluate as E

Uniform = E.UniformModel


@pytest.mark.parametrize("stride", [None, 16, 5])
def test_uniform_model_has_perplexity_vocab(stride):
    ids = torch.randint(0, 50, (300,), generator=torch.Generator().manual_seed(0))
    r = E.perplexity(Uniform(50), ids, seq_len=32, stride=stride, progress=False)
    assert r["ppl"] == pytest.approx(50, rel=1e-6)   # fp32 log-softmax: ~1e-7


def test_windows_score_each_token_once():
    n, L = 203, 32
    for stride in (32, 16, 7, 1):
        spans = E.windows(n, L, stride)
        scored = [p for b, e, k in spans for p in range(e - k, e)]
        assert len(scored) == len(set(scored))                     # never twice
        if stride < L:
            assert sorted(scored) == list(range(1, n))             # sliding: every token but the first
        else:
            assert len(scored) == (n // L) * (L - 1)               # non-overlapping: each window's first is context
        assert all(e - b <= L for b, e, _ in spans)


def test_scored_token_count_and_bos(tiny_llama):
    ids = torch.randint(0, 128, (130,), generator=torch.Generator().manual_seed(2))
    a = E.perplexity(tiny_llama, ids, seq_len=32, progress=False)
    b = E.perplexity(tiny_llama, ids, seq_len=32, bos_token_id=1, progress=False)
    assert a["scored_tokens"] == 4 * 31 and b["scored_tokens"] == 4 * 32
    assert a["windows"] == b["windows"] == 4
    c = E.perplexity(tiny_llama, ids, seq_len=32, stride=8, progress=False)
    assert c["scored_tokens"] == 129


def test_deterministic_and_batch_invariant(tiny_llama):
    ids = torch.randint(0, 128, (200,), generator=torch.Generator().manual_seed(3))
    r1 = E.perplexity(tiny_llama, ids, seq_len=32, batch_size=1, progress=False)
    r2 = E.perplexity(tiny_llama, ids, seq_len=32, batch_size=1, progress=False)
    r3 = E.perplexity(tiny_llama, ids, seq_len=32, batch_size=4, progress=False)
    assert r1["ppl"] == r2["ppl"]
    assert r1["ppl"] == pytest.approx(r3["ppl"], rel=1e-5)


def test_perplexity_matches_cross_entropy(tiny_llama):
    ids = torch.randint(0, 128, (64,), generator=torch.Generator().manual_seed(4))
    r = E.perplexity(tiny_llama, ids, seq_len=64, progress=False)
    with torch.no_grad():
        loss = tiny_llama(ids[None], labels=ids[None]).loss.item()
    assert math.log(r["ppl"]) == pytest.approx(loss, rel=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        E.perplexity(Uniform(5), torch.zeros(2, 10, dtype=torch.long), progress=False)
    with pytest.raises(ValueError, match="stride"):
        E.windows(100, 10, 11)
    with pytest.raises(ValueError, match="seq_len"):
        E.windows(100, 1)
    with pytest.raises(ValueError, match="at least 2"):
        E.windows(1, 10)


@pytest.mark.parametrize("bos", [False, True])
@pytest.mark.parametrize("seq_len,stride", [(64, 64), (64, 63), (64, 32), (64, 1), (50, 7)])
def test_no_token_is_scored_twice(seq_len, stride, bos):
    """Every window scores only tokens no earlier window scored: with BOS and stride = seq_len − 1 the
    old rule scored 1,010 tokens of 1,000."""
    n = 1000
    spans = E.windows(n, seq_len, stride, bos=bos)
    scored = [t for b, e, k in spans for t in range(e - k, e)]
    assert len(scored) == len(set(scored))
    if stride < seq_len:  # sliding windows cover the whole stream: every token once (token 0 only with BOS)
        assert sorted(scored) == list(range(0 if bos else 1, n))


def test_bos_stride_scores_each_token_once_end_to_end(tiny_llama):
    ids = torch.randint(0, 128, (1000,), generator=torch.Generator().manual_seed(0))
    r = E.perplexity(tiny_llama, ids, seq_len=64, stride=63, bos_token_id=1, progress=False)
    assert r["scored_tokens"] == 1000
