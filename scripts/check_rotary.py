"""The fused rotary gradient (kernels/rotary.py) on the GPU against float64: dq and dk turned back by the
transposed rotation, dv copied, for head dims 64 and 128 (and 40: a partial tile), bf16 and fp32, an odd length,
the gradients laid out as the attention returns them. Exits non-zero on a mismatch.

    python scripts/check_rotary.py
"""

import sys

import torch

from flashgpt.attention_reference import reference_rotary_grad
from flashgpt.model.rotary import rotary_qkv_grad, rotary_tables


def check(dtype: torch.dtype, head_dim: int, seq_len: int = 1001, batch: int = 3, n_head: int = 12) -> bool:
    generator = torch.Generator(device="cuda").manual_seed(head_dim)
    cos, sin = (t[-seq_len:].cuda() for t in rotary_tables(4096, head_dim, 10000.0))
    grads = [torch.randn(batch, n_head, seq_len, head_dim, device="cuda", generator=generator) for _ in range(3)]
    dq, dk, dv = (g.to(dtype).transpose(1, 2) for g in grads)  # (B, T, H, D), token-major as from the attention
    got = rotary_qkv_grad(dq, dk, dv, cos, sin)  # the CUDA kernel
    worst = 0.0
    for slot, grad in enumerate((dq, dk)):
        expected, magnitude = reference_rotary_grad(grad, cos, sin)
        bound = magnitude * 2**-22
        if dtype == torch.bfloat16:
            bound = bound + expected.abs() * 2**-8  # rounded to nearest on the GPU: half a bf16 ulp
        worst = max(worst, ((got[:, :, slot].double() - expected).abs() / (bound + 1e-30)).max().item())
    exact_v = torch.equal(got[:, :, 2], dv)
    ok = worst <= 1 and exact_v and got.is_contiguous() and got.shape == (batch, seq_len, 3, n_head, head_dim)
    print(f"{dtype!s:15s} D={head_dim:3d} T={seq_len}: worst error / bound {worst:.3f}, dv exact {exact_v}: "
          f"{'ok' if ok else 'FAIL'}")  # fmt: skip
    return ok


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("check_rotary.py checks the CUDA kernel and needs a GPU; on the CPU, tests/test_rope.py runs it "
                 "through the Triton interpreter")  # fmt: skip
    results = [check(dtype, d) for dtype in (torch.bfloat16, torch.float32) for d in (40, 64, 128)]
    sys.exit(0 if all(results) else 1)
