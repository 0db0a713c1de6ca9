import torch

from helpers import evaluate, workbench


def make_bench(model):
    ids = torch.randint(0, 128, (400,), generator=torch.Generator().manual_seed(0))
    return workbench.Bench(model, None, True, True, ids, "tiny",
                           {"calib_samples": 2, "seq_len": 32, "eval_tokens": 128, "n_grid": 4})


def test_scores_are_remembered_and_forgotten_on_rebuild(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    bench = make_bench(tiny_llama)
    m, meta, key = workbench.variant(bench, "rtn", bits=4, group_size=32)
    p = workbench.perplexity(bench, m, key)
    assert evaluate.results_table()[key]["ppl"] == p
    evaluate.record(key, ppl=-1.0)                       # a remembered score is returned as is
    assert workbench.perplexity(bench, m, key) == -1.0
    assert workbench.perplexity(bench, m, key, max_tokens=64) != -1.0   # protocol overrides recompute
    workbench.variant(bench, "rtn", bits=4, group_size=32, rebuild=True)
    assert workbench.perplexity(bench, m, key) == p      # rebuilt: the old score was dropped
    base = workbench.perplexity(bench)
    assert base == workbench.perplexity(bench, tiny_llama, max_tokens=128)
