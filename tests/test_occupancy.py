"""helpers.occupancy: programs per SM and waves, against what Nsight Compute reported on a lent H100."""
import pytest

from helpers import occupancy


@pytest.mark.parametrize("registers, warps, per_sm, programs, waves", [
    (94, 2, 10, 512, 0.39),      # the prepared loop on the 8B down (results/h100/ncu_prepared_e6e91b9.txt)
    (72, 2, 14, 1728, 0.94),     # ... on the 14B-class 5120 x 13824 (same report)
    (128, 2, 8, None, None),     # round 9's GEMV: "8 blocks of 2 warps per SM (25 % theoretical occupancy)"
])
def test_programs_per_sm_and_waves_as_nsight_compute_reported_them(registers, warps, per_sm, programs, waves):
    assert occupancy.programs_per_sm(registers, warps) == per_sm
    if programs:
        assert occupancy.waves(programs, 132, per_sm) == pytest.approx(waves, abs=0.005)


def test_each_limit_binds_where_it_is_the_smallest():
    assert occupancy.programs_per_sm(16, 1) == 32                 # blocks per SM
    assert occupancy.programs_per_sm(16, 8) == 8                  # 64 warps per SM
    assert occupancy.programs_per_sm(16, 8, arch=75) == 4         # a T4 holds 32 warps
    assert occupancy.programs_per_sm(33, 2) == 25                 # 33 registers are given as 40
    assert occupancy.programs_per_sm(32, 2, shared_bytes=48 * 1024) == 4   # 228 KiB ÷ (48 + 1 KiB reserved)
    assert occupancy.programs_per_sm(32, 2, shared_bytes=48 * 1024, arch=80) == 3


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="registers 300 is more than a thread"):
        occupancy.programs_per_sm(300, 2)
    with pytest.raises(ValueError, match="warps must be an int"):
        occupancy.programs_per_sm(64, 0)
    with pytest.raises(ValueError, match="warps 40 is more than one SM of arch 75"):
        occupancy.programs_per_sm(64, 40, arch=75)
    with pytest.raises(ValueError, match="arch 70 is not one of"):
        occupancy.programs_per_sm(64, 2, arch=70)
    with pytest.raises(ValueError, match="does not fit one SM"):
        occupancy.programs_per_sm(32, 2, shared_bytes=240 * 1024)
    with pytest.raises(ValueError, match="per_sm must be a positive int"):
        occupancy.waves(10, 132, 0)


def test_waves_agree_with_every_committed_nsight_compute_report():
    """Each profiled kernel of results/*/ncu_*.txt that lists registers, block size, grid and waves: the waves
    worked out from its registers equal Nsight Compute's (to the 0.01 it prints)."""
    from helpers import kernel_runs
    from helpers.config import results_path
    checked = 0
    for f in sorted(results_path().glob("*/ncu_*.txt")):
        try:
            cases = kernel_runs.ncu_cases(f.read_text(), ("Registers Per Thread", "Block Size", "Grid Size",
                                                          "Waves Per SM", "# SMs"))
        except ValueError:   # a report of other sections
            continue
        for c in cases:
            per_sm = occupancy.programs_per_sm(int(c["Registers Per Thread"]), int(c["Block Size"]) // 32)
            assert occupancy.waves(int(c["Grid Size"]), int(c["# SMs"]), per_sm) == pytest.approx(
                c["Waves Per SM"], abs=0.006), (f.name, c["weight"])
            checked += 1
    assert checked >= 9
