"""The real-allocator replay (helpers.allocator_replay): its command, its JSON, its errors on the CPU;
the replay itself against the simulator on a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import allocator_ops, allocator_replay, allocator_sim
from helpers.units import MiB

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200)")
ROOT = Path(__file__).resolve().parents[1]
OPS = [["alloc", "a", 3 * MiB], ["free", "a"], ["empty_cache"]]


def test_command_runs_this_module_with_the_ops_and_the_allocator_settings(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6,expandable_segments:False")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    argv, env = allocator_replay.command(OPS, cap=1.5 * 2**30, expandable=True, max_split_mb=64, card_gib=15)
    assert argv[:3] == [sys.executable, "-m", "helpers.allocator_replay"]
    assert json.loads(argv[argv.index("--ops") + 1]) == OPS
    assert argv[argv.index("--cap") + 1] == str(3 * 2**29) and float(argv[argv.index("--card-gib") + 1]) == 15.0
    assert "--expandable" in argv and argv[argv.index("--max-split-mb") + 1] == "64"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.6,expandable_segments:True,max_split_size_mb:64"
    assert env["PYTHONPATH"].split(":") == [str(ROOT), "/elsewhere"]
    plain, env = allocator_replay.command(OPS)
    assert plain == argv[:5] and env["PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.6"


def test_the_command_line_is_what_the_module_reads(monkeypatch, capsys):
    """The argv that run_real builds parses with the module's own parser and passes its checks; on a
    machine without CUDA the program says so and exits 1, with the allocator settings applied first."""
    if torch.cuda.is_available():
        pytest.skip("on a GPU the replay would really run (test_replay_agrees_with_the_simulator does)")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    argv, _ = allocator_replay.command(OPS, cap=64 * MiB, expandable=True)
    assert allocator_replay.main(argv[3:]) == 1
    assert "no CUDA device" in capsys.readouterr().err
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.parametrize("stdout, want", [
    ('{"oom": false, "reserved": 2097152}\n', {"oom": False, "reserved": 2097152}),
    ('a warning\n{"oom": true}\nbye\n', {"oom": True}),           # the last JSON line counts, other lines do not
])
def test_read_result_takes_the_last_json_line(stdout, want):
    assert allocator_replay.read_result(stdout) == want


@pytest.mark.parametrize("stdout, stderr, rc", [
    ("", "Traceback ...\nRuntimeError: CUDA error", 1),
    ('{"oom": false}\n', "killed", -9),                                # a line, but the process failed
    ("no json here\n", "", 0),
    ("{not json\n", "", 0),
])
def test_read_result_fails_with_the_end_of_stderr(stdout, stderr, rc):
    with pytest.raises(RuntimeError, match="real allocator run failed") as e:
        allocator_replay.read_result(stdout, stderr, rc)
    assert stderr in str(e.value)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: allocator_replay.command([["alloc", "a", 0]]), ValueError, "positive number of bytes"),
    (lambda: allocator_replay.command([["resize", "a", 10]]), ValueError, "unknown op"),
    (lambda: allocator_replay.command("a=1MiB"), ValueError, "list of ops"),
    (lambda: allocator_replay.command(OPS, cap=-5), ValueError, "cap"),
    (lambda: allocator_replay.command(OPS, cap=True), TypeError, "cap"),
    (lambda: allocator_replay.command(OPS, max_split_mb=10), ValueError, "max_split_mb"),
    (lambda: allocator_replay.run_real(OPS, max_split_mb=10.5), ValueError, "max_split_mb"),
    (lambda: allocator_replay.alloc_conf("", max_split_mb=True), ValueError, "max_split_mb"),
])
def test_bad_input_is_refused_before_a_process_starts(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_the_program_refuses_bad_ops_and_shows_its_help():
    bad = subprocess.run([sys.executable, "-m", "helpers.allocator_replay", "--ops", '[["free"]]'],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "unknown op" in bad.stderr
    helped = subprocess.run([sys.executable, "-m", "helpers.allocator_replay", "--help"],
                            capture_output=True, text=True, cwd=ROOT)
    assert helped.returncode == 0 and "--ops" in helped.stdout and "--expandable" in helped.stdout


def test_run_real_on_a_cpu_names_what_is_missing():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        allocator_replay.run_real(OPS)


@cuda
@pytest.mark.parametrize("expandable", [False, True])
def test_replay_agrees_with_the_simulator(expandable):
    ops, cap = allocator_ops.fragmenting_sequence(), allocator_ops.fragmenting_cap()
    real = allocator_replay.run_real(ops, cap, expandable)
    sim = allocator_sim.simulate(ops, cap, expandable)
    assert set(sim) <= set(real) and real["cap"] == cap
    keys = ("oom", "failed_at", "allocated", "reserved", "peak_reserved")
    assert {k: real[k] for k in keys} == {k: sim[k] for k in keys}
    assert [list(t) for t in sim["trace"]] == real["trace"]
    assert sorted(s["total_size"] for s in real["snapshot"]) == sorted(s["total_size"] for s in sim["snapshot"])
