"""The planner against `zerostream bench step` on this machine: a 33.6 M-parameter GPT trained
for real (one CPU process, fp32) with the optimizer in the host arena, and with parameters
and optimizer state on NVMe; the predicted peak RSS and NVMe bytes per step must be within
15% of the measured ones (benchmarks/estimate.md has the table for more sizes)."""

import pytest

from zerostream.bench.validate import compare, error, markdown, parse_option

SHAPE = {"layers": 2, "hidden": 1024, "heads": 16, "vocab": 8192, "seq": 64}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_predicted_rss_and_nvme_bytes_within_15_percent(tmp_path):
    options = [parse_option("2/cpu/none"), parse_option("3/nvme/nvme")]
    res = compare(SHAPE, 1, options, nvme_path=str(tmp_path / "nvme"))
    report = "\n".join(markdown(res))
    for row in res["rows"]:
        predicted, _ = row["rss"]
        # The model's own bytes are most of the process, so the comparison can fail.
        assert predicted - res["overhead"] > res["overhead"], report
        assert abs(error(row["rss"])) <= 0.15, report
    nvme = res["rows"][1]["traffic"]
    assert set(nvme) == {"nvme_read", "nvme_write", "param_nvme_read", "param_nvme_write"}
    for predicted, measured in nvme.values():
        assert measured > 0 and abs(error((predicted, measured))) <= 0.15, report
    # The optimizer state is 12 B per parameter each way (fp32 master, exp_avg, exp_avg_sq).
    assert nvme["nvme_read"][1] == 12 * res["params"]
