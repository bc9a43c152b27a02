"""Host cost of a masked flash_attention call, measured on a CPU: PyTorch operators dispatched and wall time of one
forward + backward with the kernel launches stubbed out, so what remains is the Python path and the small tensor
operations around the kernels (on a GPU each of those operators is a launch).

    PYTHONPATH=. python scripts/host_cost_masks.py        # T = 4096, B = 4, H = 12, D = 64

The launch configurations are the GPU's defaults (`tuning._DEFAULTS`, bf16: three different tilings across the
passes), not the interpreter's. Cases: packed documents (`bench_masks.mixed_documents`) and the local + global block pattern at 15% density
(block_size 128), against the unmasked causal call. Per case: the call with the masks as keyword arguments
(schedules built inside the call), and, where `flashgpt.kernels.flash_mask` exists, the call with a mask built
once beforehand plus that one build. "12 layers" is what one model step of 12 attention calls costs: 12 keyword
calls, or one build and 12 calls with the prebuilt mask. Times are medians on this machine's CPU, where the
operators also compute on the CPU: compare the operator counts across machines, the times only within one run.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors pass the kernel's checks; nothing is launched

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_masks import mixed_documents

import flashgpt.kernels
from flashgpt.kernels import flash_attention, interface, launch
from flashgpt.model.sparsity import BlockSparseConfig, build_block_mask

LAYERS = 12


class CountOps(TorchDispatchMode):
    """Counts the ATen operators dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def ops_and_ms(step: Callable[[], object], reps: int) -> tuple[int, float]:
    """(operators dispatched by one step, median wall ms of a step)."""
    step()  # warm-up: config lookups and caches
    with CountOps() as counter:
        step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return counter.count, statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    launch._launch = lambda *a, **k: None  # no kernel runs: outputs stay uninitialised, never read
    launch.interpreting = lambda: False  # tiles as on a (non-Hopper) GPU; interface's own CPU check still passes
    # The eager path, as in a plain call: an active dispatch mode would otherwise route the call through the
    # operators, whose insides the mode does not see.
    interface._plain_eager = lambda t: True
    torch.set_num_threads(1)

    batch, heads, seq_len, head_dim = args.batch, args.heads, args.seq_len, args.head_dim
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)
    n_blocks = -(-seq_len // 128)
    cases = {
        "dense causal": {},
        "documents": {"document_ids": mixed_documents(batch, seq_len, "cpu")},
        "local + global": {
            "block_mask": build_block_mask(BlockSparseConfig("local_global", density=0.15), n_blocks),
            "block_size": 128,
        },
    }
    prebuilt = hasattr(flashgpt.kernels, "flash_mask") and "mask" in inspect.signature(flash_attention).parameters
    print(f"T={seq_len} B={batch} H={heads} D={head_dim}, bf16 on CPU, kernel launches stubbed; {args.reps} reps")
    print("| mask | call | ops / call | ms / call | ops / 12 layers | ms / 12 layers |")
    print("|---|---|---|---|---|---|")

    def fwd_bwd(**kwargs) -> Callable[[], None]:
        def step() -> None:
            flash_attention(q, k, v, causal=True, **kwargs).backward(grad_out)
            q.grad = k.grad = v.grad = None

        return step

    for name, masks in cases.items():
        ops, ms = ops_and_ms(fwd_bwd(**masks), args.reps)
        print(f"| {name} | keyword masks | {ops} | {ms:.2f} | {LAYERS * ops} | {LAYERS * ms:.1f} |")
        if not prebuilt or not masks:
            continue
        from flashgpt.kernels import FlashMask, flash_mask

        def build(masks: dict = masks) -> FlashMask:
            return flash_mask(seq_len, seq_len, head_dim=head_dim, dtype=q.dtype, **masks)

        build_ops, build_ms = ops_and_ms(build, args.reps)
        mask = build()
        ops, ms = ops_and_ms(fwd_bwd(mask=mask), args.reps)
        print(f"| {name} | prebuilt mask (+ one build: {build_ops} ops, {build_ms:.2f} ms) | {ops} | {ms:.2f} | "
              f"{build_ops + LAYERS * ops} | {build_ms + LAYERS * ms:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
