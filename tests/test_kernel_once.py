"""benchmarks.kernel_once: the one-kernel run a profiler looks at (Triton's interpreter on CPU)."""
import json

import pytest

from benchmarks import kernel_once
from helpers import w4_kernel

pytestmark = pytest.mark.skipif(w4_kernel.triton is None, reason="triton is not installed")


@pytest.mark.parametrize("rows, kernel", [(1, "prepared"), (3, "tc")])
def test_one_kernel_is_exact_and_says_what_ran(rows, kernel, capsys):
    out = kernel_once.main(["--shape", "256x48", "--group", "64", "--rows", str(rows), "--calls", "2"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out
    assert out["config"]["KERNEL"] == kernel and (out["K"], out["N"], out["M"]) == (256, 48, rows)
    assert out["grid"][0] == -(-48 // out["config"]["BLOCK_N"]) and out["grid"][1] == out["config"]["SPLIT_K"]
    assert out["rel_err"] < 1e-2


def test_a_given_config_is_the_one_run():
    out = kernel_once.run("256x48", 64, 1, {"KERNEL": "gemv", "BLOCK_N": 16, "SPLIT_K": 2, "MAGIC": False}, calls=1)
    assert out["config"]["BLOCK_N"] == 16 and out["grid"] == [3, 2] and out["rel_err"] < 2 ** -7   # a bf16 output: within one bf16 step


def test_a_family_picks_the_rules_config_with_its_switch(capsys):
    out = kernel_once.main(["--shape", "256x48", "--group", "64", "--calls", "1",
                            "--family", '{"PREPARED": true, "SUBNORMAL": true}'])
    plain = kernel_once.run("256x48", 64, 1, calls=1)
    assert out["config"]["SUBNORMAL"] and not plain["config"].get("SUBNORMAL")
    assert {k: v for k, v in out["config"].items() if k != "SUBNORMAL"} == \
        {k: v for k, v in plain["config"].items() if k != "SUBNORMAL"}
    assert out["rel_err"] < 1e-2


def test_named_shapes_resolve():
    assert kernel_once.parse_shape("8B gate/up 4096x14336") == (4096, 14336)
    assert kernel_once.parse_shape("Llama-3.2-3B down 8192x3072") == (8192, 3072)
    assert kernel_once.parse_shape(" 512 x 64 ") == (512, 64)


@pytest.mark.parametrize("argv, needle", [
    (["--shape", "4096 by 4096"], "--shape must be"),
    (["--shape", "0x48"], "--shape must be"),
    (["--shape", "256x48", "--group", "100"], "--group must be a power of two"),
    (["--shape", "256x48", "--group", "512"], "--group must be a power of two ≥ 2 that divides K=256"),
    (["--shape", "256x48", "--config", "{BLOCK_N: 64}"], "--config must be a JSON dict"),
    (["--shape", "256x48", "--config", "[64]"], "--config must be a JSON dict"),
    (["--shape", "256x48", "--rows", "0"], "--rows and --calls must be"),
    (["--shape", "256x48", "--family", "SUBNORMAL"], "--family must be a JSON dict such as"),
    (["--shape", "256x48", "--family", "[1]"], "--family must be a JSON dict (auto_config's switches)"),
    (["--shape", "256x48", "--config", '{"BLOCK_N": 16}', "--family", '{"PDL": true}'], "not both"),
    (["--shape", "256x48", "--group", "64", "--config", '{"BLOCK_N": 24}'], "BLOCK_N must be a power of 2"),
])
def test_bad_input_is_named(argv, needle):
    with pytest.raises(SystemExit) as e:
        kernel_once.main(argv)
    assert needle in str(e.value)
