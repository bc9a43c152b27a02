"""The GPU's SM clock and power draw, sampled by `nvidia-smi` while a benchmark runs.

At its power limit a GPU holds its power by lowering its clock, so two kernels that take the same time can differ in
clock and in energy per call: on an H200 at 700 W our attention kernels ran 5-10% below cuDNN's clock, and even per
joule (`results/tuning/h200-2026-11-28-power/`). `scripts/ab_kernels.py --power` records both beside each timing,
so that a change which only moves power shows.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass

QUERY = "clocks.sm,power.draw"


@dataclass(frozen=True)
class Sample:
    seconds: float  # time.perf_counter() when nvidia-smi's line arrived
    sm_mhz: float
    power_w: float


def parse_sample(line: str, seconds: float) -> Sample | None:
    """One line of `nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits` ("1980, 688.47"), or
    None for a line that holds no reading ("[N/A]", a blank line)."""
    fields = [field.strip() for field in line.split(",")]
    try:
        return Sample(seconds, float(fields[0]), float(fields[1]))
    except (ValueError, IndexError):
        return None


class PowerSampler:
    """Samples one GPU every period_ms from a thread, while the context is entered. device_index is nvidia-smi's
    index of the GPU: torch's, unless CUDA_VISIBLE_DEVICES renumbers them."""

    def __init__(self, device_index: int, period_ms: int = 20):
        if shutil.which("nvidia-smi") is None:
            raise RuntimeError("sampling the GPU's clock and power needs nvidia-smi (an NVIDIA driver) on the PATH")
        self.command = ["nvidia-smi", "-i", str(device_index), f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                        "-lms", str(period_ms)]  # fmt: skip
        self.samples: list[Sample] = []

    def __enter__(self) -> PowerSampler:
        self._process = subprocess.Popen(self.command, stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._process.terminate()
        self._process.wait()
        self._reader.join()

    def _read(self) -> None:
        for line in self._process.stdout:
            if (sample := parse_sample(line, time.perf_counter())) is not None:
                self.samples.append(sample)

    def during(self, windows: list[tuple[float, float]]) -> dict | None:
        """`summarize` of the samples taken so far inside windows."""
        return summarize(list(self.samples), windows)


def summarize(samples: list[Sample], windows: list[tuple[float, float]]) -> dict | None:
    """The median SM clock (MHz) and power (W) of the samples taken inside any of windows (`perf_counter` seconds),
    and how many there were; None if none was."""
    inside = [s for s in samples if any(t0 <= s.seconds <= t1 for t0, t1 in windows)]
    if not inside:
        return None
    return dict(sm_mhz=statistics.median(s.sm_mhz for s in inside),
                power_w=statistics.median(s.power_w for s in inside), samples=len(inside))  # fmt: skip
