"""Model FLOPs utilisation: achieved training FLOP/s over the accelerator's peak dense bf16 FLOP/s."""

import re

import torch

# Peak dense (no 2:4 sparsity) bf16 tensor-core FLOP/s from NVIDIA's datasheets, matched against
# torch.cuda.get_device_name() in this order: the first pattern that matches wins, so variants come first.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    (r"H100.*PCIe", 756e12),
    (r"H100 NVL", 835e12),
    (r"H100", 989e12),  # SXM, e.g. "NVIDIA H100 80GB HBM3"
    (r"H200", 989e12),
    (r"A100", 312e12),
    (r"L40S", 362e12),
    (r"\bL4\b", 121e12),
    (r"\bA10\b", 125e12),
    (r"RTX 4090", 165.2e12),  # GeForce: bf16 with fp32 accumulation runs at half the fp16-accumulate rate
]  # No A10G: AWS's variant of the A10 has no public datasheet, so it reports null rather than a guess.


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def peak_flops_per_sec(name: str) -> float | None:
    """Peak bf16 FLOP/s of the device called `name` (see device_name), or None when unknown: any CPU, any GPU
    missing from the table. An unknown peak gives a null MFU, never a guessed one."""
    return next((peak for pattern, peak in PEAK_BF16_FLOPS if re.search(pattern, name)), None)


def mfu(
    flops_per_token: float, tokens_per_sec: float | None, peak_per_device: float | None, n_devices: int
) -> float | None:
    """Fraction of the peak that tokens_per_sec (summed over devices) achieves; None when either is unknown."""
    if tokens_per_sec is None or peak_per_device is None:
        return None
    return flops_per_token * tokens_per_sec / (peak_per_device * n_devices)
