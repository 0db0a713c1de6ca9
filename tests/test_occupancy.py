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
    # registers by sub-partition (cuda_occupancy.h): 33 and 40 are given as 40 (1,280 a warp), 12 warps in each
    # of the 4 sub-partitions of 16,384 -> 48 warps -> 24 programs of 2 (not 65536 / 2560 = 25); 48 -> 20 (not 21)
    assert occupancy.programs_per_sm(33, 2) == occupancy.programs_per_sm(40, 2) == 24
    assert occupancy.programs_per_sm(48, 2) == 20
    assert occupancy.programs_per_sm(16, 1) == 32 and occupancy.block_limits(200, 3)["registers"] == 2
    assert occupancy.programs_per_sm(32, 2, shared_bytes=48 * 1024) == 4   # 228 KiB ÷ (48 + 1 KiB reserved)
    assert occupancy.programs_per_sm(32, 2, shared_bytes=48 * 1024, arch=80) == 3
    assert occupancy.block_limits(32, 2, shared_bytes=100)["shared"] == 233472 // 1152   # 1,124 B in units of 128


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="registers 300 is more than a thread"):
        occupancy.programs_per_sm(300, 2)
    with pytest.raises(ValueError, match="warps must be an int"):
        occupancy.programs_per_sm(64, 0)
    with pytest.raises(ValueError, match="warps 40 is more than one block may have"):
        occupancy.programs_per_sm(16, 40)
    with pytest.raises(ValueError, match="asks more than the 65536 registers a block may have"):
        occupancy.programs_per_sm(200, 10)                        # 10 warps checked as 12 × 6,400
    with pytest.raises(ValueError, match="arch 70 is not one of"):
        occupancy.programs_per_sm(64, 2, arch=70)
    with pytest.raises(ValueError, match="does not fit one SM"):
        occupancy.programs_per_sm(32, 2, shared_bytes=240 * 1024)
    with pytest.raises(ValueError, match="per_sm must be a positive int"):
        occupancy.waves(10, 132, 0)


def test_limits_and_waves_agree_with_every_committed_nsight_compute_report():
    """Each profiled kernel of results/h100 and h200's ncu_*.txt (compute capability 9.0) that lists its registers,
    block size, grid and waves (kernel_runs.ncu_waves, as notebook 08 prints it): the register limit equals Nsight
    Compute's "Block Limit Registers" and the waves its "Waves Per SM" (to the 0.01 it prints)."""
    from helpers import kernel_runs
    from helpers.config import results_path
    t = kernel_runs.ncu_waves(sorted([*results_path("h100").glob("ncu_*.txt"), *results_path("h200").glob("ncu_*.txt")]))
    assert len(t) >= 9 and set(t.registers) >= {72, 94, 127, 128, 167}
    assert (t["by registers"] == t["by registers (ncu)"]).all(), t
    assert ((t.waves - t["waves (ncu)"]).abs() <= 0.005).all(), t
    assert kernel_runs.ncu_waves([]).empty
