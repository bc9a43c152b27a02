"""Where the host time of one eager fwd+bwd goes at issue 15's open cell (B = 16, H = 12, T = 1K, D = 64), the GPU
held by a sleep kernel: timestamps before the call, after the forward, at the start and end of the backward's
Python body (on autograd's device thread) and after .backward() returns, averaged over 40 calls; with and without
dropout, and with dropout whose seed draw is replaced by a fixed tensor (is the draw the cost?).

    PYTHONPATH=. python results/tuning/h200-2026-11-29-dropout-host-1k/phases.py
"""

import threading
import time

import torch

from flashgpt.kernels import attention_op, flash_attention

SHAPE = (16, 12, 1024, 64)
CALLS = 40


def main() -> None:
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    grad_out = torch.randn_like(q)
    stamps: dict[str, float] = {}
    backward = attention_op._EagerFlashAttention.backward

    def stamped_backward(ctx, do, dlse):
        stamps["bwd_start"] = time.perf_counter()
        result = backward(ctx, do, dlse)
        stamps["bwd_end"] = time.perf_counter()
        return result

    attention_op._EagerFlashAttention.backward = staticmethod(stamped_backward)
    draw = attention_op._draw_rng_state
    fixed = draw()
    print(torch.cuda.get_device_name(), torch.__version__, SHAPE, "threads:", [t.name for t in threading.enumerate()])
    for label, p, drawing in (("no dropout", 0.0, draw), ("dropout 0.1", 0.1, draw),
                              ("dropout 0.1, fixed seed tensor", 0.1, lambda: fixed),
                              ("no dropout (again)", 0.0, draw), ("dropout 0.1 (again)", 0.1, draw)):  # fmt: skip
        attention_op._draw_rng_state = drawing
        sums = dict.fromkeys(("fwd", "to_bwd", "bwd_body", "from_bwd", "total"), 0.0)
        for i in range(CALLS + 5):
            if i == 5:
                torch.cuda.synchronize()
                torch.cuda._sleep(2**31)
            q.grad = k.grad = v.grad = None
            t0 = time.perf_counter()
            o = flash_attention(q, k, v, dropout_p=p)
            t1 = time.perf_counter()
            o.backward(grad_out)
            t4 = time.perf_counter()
            if i >= 5:
                sums["fwd"] += t1 - t0
                sums["to_bwd"] += stamps["bwd_start"] - t1
                sums["bwd_body"] += stamps["bwd_end"] - stamps["bwd_start"]
                sums["from_bwd"] += t4 - stamps["bwd_end"]
                sums["total"] += t4 - t0
        torch.cuda.synchronize()
        print(f"{label:>32}: " + ", ".join(f"{n} {s / CALLS * 1e6:6.1f} us" for n, s in sums.items()))
    attention_op._draw_rng_state = draw


if __name__ == "__main__":
    main()
