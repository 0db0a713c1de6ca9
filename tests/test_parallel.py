"""helpers.parallel (vLLM's tensor/pipeline split, per GPU) and helpers.tp_run (the split run for real
on two CPU processes over gloo); benchmarks.tp_memory's CPU-checkable parts."""
import pytest
import torch

from helpers import budget, models, parallel, tp_run


def test_heads_split_and_kv_replicated_as_vllm():
    c = models.architecture_config("Llama-2-70B")          # 64 query heads, 8 KV heads
    for tp in (1, 2, 4, 8):
        r = parallel.rank_shape(c, tp)
        assert (r.heads, r.kv_heads, r.kv_replicas, r.intermediate) == (64 // tp, 8 // tp, 1, 28672 // tp)
    r = parallel.rank_shape(c, 16)                          # more ranks than KV heads: one head, two copies
    assert (r.heads, r.kv_heads, r.kv_replicas) == (4, 1, 2)
    assert parallel.rank_shape(c, 8).vocab_per_rank == 32000 // 8


@pytest.mark.parametrize("arch, tp, match", [
    ("Llama-2-70B", 3, r"tp=3 must divide num_attention_heads=64"),      # the seed's "3 H100"
    ("Qwen2.5-0.5B", 7, r"tp=7 ≥ num_key_value_heads=2 must be a multiple"),
    ("Llama-2-70B", 0, r"tp must be a positive integer"),
    ("Qwen3-30B-A3B", 2, r"mixture of experts"),
    ("Gemma-3-1B", 2, r"sliding-window"),
])
def test_bad_splits_are_refused_naming_the_argument(arch, tp, match):
    with pytest.raises(ValueError, match=match):
        parallel.rank_shape(arch, tp)


def test_vocab_padded_to_64_then_split():
    g = models.architecture_config("Granite-3.1-2B")        # vocab 49155 → 49216
    r = parallel.rank_shape(g, 2)
    assert (r.vocab_padded, r.vocab_per_rank) == (49216, 24608)


@pytest.mark.parametrize("arch, tp", [("Llama-2-70B", 2), ("Llama-2-70B", 8), ("TinyLlama-1.1B", 8),
                                      ("Llama-3.2-1B", 2), ("SmolLM2-135M", 3)])
def test_hand_count_per_rank_is_the_rank_models_meta_count(arch, tp):
    c = models.architecture_config(arch)
    assert parallel.rank_param_counts(c, tp) == budget.meta_param_counts(parallel.shard_config(c, tp))


def test_tp1_is_the_whole_model_and_ranks_add_up():
    c = models.architecture_config("Llama-2-70B")
    assert parallel.rank_param_counts(c, 1) == budget.meta_param_counts(c)
    assert parallel.rank_weight_bytes(c, 1, "int4") == budget.weight_bytes(c, "int4")
    whole = parallel.rank_param_counts(c, 1)
    for tp in (2, 8):                                       # the replicated norms are the only overlap
        p = parallel.rank_param_counts(c, tp)
        assert tp * (p["total"] - p["norms"]) == whole["total"] - whole["norms"]


def test_kv_per_rank_splits_until_one_head_then_replicates():
    c = models.architecture_config("TinyLlama-1.1B")        # 4 KV heads
    whole = budget.kv_bytes(c, 1, 1, "bf16")
    assert parallel.rank_kv_bytes_per_token(c, 1) == whole
    assert parallel.rank_kv_bytes_per_token(c, 4) == whole / 4
    assert parallel.rank_kv_bytes_per_token(c, 8) == whole / 4      # not /8: each head held by two ranks


def test_pipeline_stages_as_get_pp_indices():
    assert parallel.stage_layers(80, 3) == [27, 27, 26]
    assert parallel.stage_layers(10, 4) == [2, 3, 3, 2]
    assert parallel.stage_layers(80, 1) == [80]
    with pytest.raises(ValueError, match="pp=5 stages for 4 layers"):
        parallel.stage_layers(4, 5)
    c = models.architecture_config("Llama-2-70B")
    parts = [parallel.rank_param_counts(c, 1, 3, s) for s in range(3)]
    assert sum(p["total"] for p in parts) == budget.meta_param_counts(c)["total"]
    assert parts[0]["embed"] and not parts[0]["lm_head"] and parts[2]["lm_head"] and not parts[2]["embed"]
    tied = models.architecture_config("Llama-3.2-1B")       # a tied head on another stage: its own copy
    two = [parallel.rank_param_counts(tied, 1, 2, s)["total"] for s in range(2)]
    assert sum(two) == budget.meta_param_counts(tied)["total"] + parallel.rank_shape(tied).vocab_per_rank * 2048
    with pytest.raises(ValueError, match="stage must be in"):
        parallel.rank_param_counts(c, 1, 3, 3)


def test_seed_claim_table():
    rows = {(r["format"], r["gpus"], r["card"]): r for r in parallel.fits_across()}
    assert rows[("int4", 2, "A100-80GB")]["fits"] == "yes"             # AWQ 70B, 2×A100-80GB, 32 × 4096
    assert rows[("int4", 2, "A100-40GB")]["fits"] == "no"
    assert rows[("bf16", 2, "A100-80GB")]["fits"] == "no"
    assert rows[("int4", 1, "H200")]["fits"] == "yes"
    r = rows[("int4", 2, "A100-80GB")]
    assert r["max_seqs"] >= 32 and r["headroom_GB"] > 0
    bad = parallel.fits_across(gpus=(3,), formats=("int4",))
    assert {r["fits"] for r in bad} == {"tp invalid"} and "num_attention_heads" in bad[0]["why"]
    with pytest.raises(ValueError, match="utilization"):
        parallel.fits_across(utilization=1.5)
    with pytest.raises(ValueError, match="seq_len"):
        parallel.fits_across(seq_len=0)
    with pytest.raises(ValueError, match="mixture of experts"):
        parallel.fits_across("Qwen3-30B-A3B")


def test_gloo_two_processes_match_the_unsplit_layer():
    rows = tp_run.run()                                     # kv 2 (split) then kv 1 (replicated), 2 ranks each
    assert len(rows) == 4 and all(r["allclose"] for r in rows)
    assert all(r["param_bytes_meas"] == r["param_bytes_pred"] for r in rows)
    assert [r["kv_replicas"] for r in rows] == [1, 1, 2, 2]
    for r in rows:
        assert r["param_bytes_meas"] < r["full_param_bytes"]
        if r["forward_peak_rank"] is not None:
            assert r["forward_peak_rank"] < r["forward_peak_full"]


def test_four_ranks_share_two_kv_heads_in_pairs():
    # tp 4 over 2 KV heads: ranks 0,1 hold head 0 and ranks 2,3 head 1 (vLLM's rank // replicas); a wrong
    # mapping of ranks to heads would still give the right bytes but not the unsplit layer's output
    rows = tp_run.run(tp=4, cases=({"kv_heads": 2},), seq=16)
    assert len(rows) == 4 and all(r["allclose"] for r in rows)
    assert all(r["kv_replicas"] == 2 and r["param_bytes_meas"] == r["param_bytes_pred"] for r in rows)


def test_ranks_fork_from_one_server_on_a_cpu_machine_and_start_fresh_elsewhere(monkeypatch):
    import sys

    import torch.multiprocessing as mp
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tp_run._start_method("gloo") == "forkserver"       # the ranks fork from one server
    assert tp_run._start_method("nccl") == "spawn"            # a process that may have touched CUDA is never forked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert tp_run._start_method("gloo") == "spawn"            # the helpers' import may open a CUDA context there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert tp_run._start_method("gloo") == "spawn"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(mp, "get_all_start_methods", lambda: ["spawn"])
    assert tp_run._start_method("gloo") == "spawn"


def test_run_refuses_bad_sizes_before_spawning():
    with pytest.raises(ValueError, match="must divide num_attention_heads"):
        tp_run.run(tp=3)
    with pytest.raises(ValueError, match="backend"):
        tp_run.run(backend="mpi")


def test_benchmark_arguments_and_prediction():
    from benchmarks import tp_memory
    a = tp_memory.parse_args([])
    assert (a.arch, a.tp, a.layers, a.batch, a.seq, a.decode_batches) == ("Llama-3-70B", 2, 4, 32, 4096, [1, 8, 32, 64, 256])
    p = tp_memory.prediction(a)
    c = tp_run.stack_config("Llama-3-70B", 4)
    assert p["kv"] == 4 * 2 * 4 * 128 * 2 * 32 * 4096                    # 4 layers, 4 KV heads per rank, bf16
    assert p["weights"] == parallel.rank_weight_bytes(c, 2) and p["vocab_per_rank"] == 128256 // 2
    for argv in (["--tp", "1"], ["--tp", "3"], ["--layers", "0"], ["--decode-batches", "1,x"], ["--layers", "81"]):
        with pytest.raises(SystemExit):
            tp_memory.parse_args(argv)
