"""flashgpt.gpu_power: reading nvidia-smi's samples of clock and power (what `scripts/ab_kernels.py --power`
records). The sampling itself needs an NVIDIA driver; these test the parsing, the windowing and the refusal."""

import pytest

from flashgpt.gpu_power import PowerSampler, Sample, parse_sample, summarize


def test_parse_sample_reads_nvidia_smi_lines_and_skips_the_rest():
    assert parse_sample("1980, 688.47\n", 3.5) == Sample(3.5, 1980.0, 688.47)
    assert parse_sample("1755, 689.30", 0.0) == Sample(0.0, 1755.0, 689.3)
    for line in ("[N/A], 688.47", "", "\n", "1980"):
        assert parse_sample(line, 0.0) is None


def test_summarize_takes_the_medians_inside_the_windows_only():
    samples = [Sample(t, mhz, watts) for t, mhz, watts in
               ((0.5, 1000, 100), (1.0, 1700, 690), (1.2, 1800, 700), (1.4, 1600, 680), (2.5, 1900, 600),
                (3.0, 1750, 695))]  # fmt: skip
    assert summarize(samples, [(0.9, 1.5)]) == dict(sm_mhz=1700, power_w=690, samples=3)
    # Two windows (a version's rounds) pool their samples; the ones between them are the other version's.
    assert summarize(samples, [(0.9, 1.1), (2.9, 3.1)]) == dict(sm_mhz=1725, power_w=692.5, samples=2)
    assert summarize(samples, [(1.5, 2.4)]) is None


def test_sampler_without_nvidia_smi_says_what_it_needs(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nvidia-smi, whatever this machine has
    with pytest.raises(RuntimeError, match="needs nvidia-smi"):
        PowerSampler(0)
