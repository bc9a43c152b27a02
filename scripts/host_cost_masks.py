"""Host cost of a masked flash_attention call, measured on a CPU: the PyTorch operators dispatched and the wall
time of one forward (+ backward) with the kernel launches stubbed out, so what remains is the Python path and the
small tensor operations around the kernels. On a GPU every one of those operators that is neither a view nor an
allocation is a kernel launch, which is what made the masked calls host-bound.

    PYTHONPATH=. python scripts/host_cost_masks.py        # T = 4096, B = 4, H = 12, D = 64, bf16

Tiles are the GPU's default configurations (`tuning._DEFAULTS`: three different tilings across the passes), not
the interpreter's. Cases: packed documents (`bench_masks.mixed_documents`) and the local + global block pattern at
15% density (block_size 128), against the unmasked causal call; each with the masks as keyword arguments
(schedules built inside the call) and, where `flashgpt.kernels.flash_mask` exists, with a mask built beforehand
(and that build alone: once per batch for every layer). Times are medians on this machine's CPU, where the
operators also compute: compare operator counts across machines, times only within one run.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors pass the kernel's checks; nothing is launched

import torch
from bench_masks import mixed_documents
from torch.utils._python_dispatch import TorchDispatchMode

import flashgpt.kernels
from flashgpt.kernels import attention_op, flash_attention, launch, launch_plans
from flashgpt.model.sparsity import BlockSparseConfig, build_block_mask

# Operators that only make a tensor's metadata or allocate memory: no kernel launch on a GPU.
NO_LAUNCH = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class CountOps(TorchDispatchMode):
    """Counts the ATen operators dispatched while active: all of them, and those that launch a kernel on a GPU
    (neither a view nor an allocation)."""

    def __init__(self) -> None:
        super().__init__()
        self.all = self.launching = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.all += 1
        self.launching += not (func.is_view or func.overloadpacket.__name__ in NO_LAUNCH)
        return func(*args, **(kwargs or {}))


def measure(step: Callable[[], object], reps: int) -> str:
    """'operators (launching) / ms' of one step: the operators it dispatches and its median wall time."""
    step()  # warm-up: config lookups and caches
    with CountOps() as counter:
        step()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return f"{counter.all} ({counter.launching}) / {statistics.median(times):.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    launch._launch = lambda *a, **k: None  # no kernel runs: outputs stay uninitialised, never read
    launch_plans.ENABLED = False  # nothing launched, nothing to replay: every call takes the full path measured here
    launch.interpreting = lambda: False  # tiles as on a (non-Hopper) GPU; attention_op's own CPU check still passes
    # The eager path, as in a plain call: an active dispatch mode would otherwise route the call through the
    # operators, whose insides the mode does not see.
    attention_op._plain_eager = lambda t: True
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
    print("Cells: operators dispatched (of which launch a kernel on a GPU) / median CPU ms.\n")
    print("| mask | masks given as | forward | forward + backward | one build |")
    print("|---|---|---|---|---|")

    def forward(**kwargs) -> Callable[[], None]:
        return lambda: flash_attention(q, k, v, causal=True, **kwargs)

    def fwd_bwd(**kwargs) -> Callable[[], None]:
        def step() -> None:
            flash_attention(q, k, v, causal=True, **kwargs).backward(grad_out)
            q.grad = k.grad = v.grad = None

        return step

    for name, masks in cases.items():
        print(
            f"| {name} | keywords | {measure(forward(**masks), args.reps)} | {measure(fwd_bwd(**masks), args.reps)} | |"
        )
        if not prebuilt or not masks:
            continue
        from flashgpt.kernels import flash_mask

        build = lambda masks=masks: flash_mask(seq_len, seq_len, head_dim=head_dim, dtype=q.dtype, **masks)
        mask = build()
        print(f"| {name} | mask=flash_mask(...) | {measure(forward(mask=mask), args.reps)} | "
              f"{measure(fwd_bwd(mask=mask), args.reps)} | {measure(build, args.reps)} |")  # fmt: skip


if __name__ == "__main__":
    main()
