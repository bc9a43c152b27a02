"""flash_attention in fp16 and bf16 on the Gluon paths (forward, dQ, dK/dV) at odd and tuned shapes, against float64
`reference_attention`: the max error of o, dq, dk and dv, and whether it is within 2e-2 of the largest reference
value (the GPU check's bf16 tolerance; fp16 rounds 8x finer).

    PYTHONPATH=. python results/tuning/h200-2026-11-27-fwd-tma-store/check_fp16.py
"""

import itertools
import json

import torch

from flashgpt.attention_reference import reference_attention
from flashgpt.kernels import flash_attention

ok = True
for dtype, head_dim, (seq_len_q, seq_len_k), causal in itertools.product(
    (torch.float16, torch.bfloat16), (64, 128), ((1000, 1000), (333, 777), (4096, 4096), (8192, 8192)), (True, False)
):
    g = torch.Generator(device="cuda").manual_seed(seq_len_q + head_dim)
    q = torch.randn(1, 4, seq_len_q, head_dim, device="cuda", generator=g, dtype=dtype).requires_grad_()
    k, v = (torch.randn(1, 4, seq_len_k, head_dim, device="cuda", generator=g, dtype=dtype).requires_grad_()
            for _ in range(2))  # fmt: skip
    do = torch.randn_like(q)
    o = flash_attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(o, (q, k, v), do)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_o, _ = reference_attention(qr, kr, vr, causal=causal)
    ref = (ref_o, *torch.autograd.grad(ref_o, (qr, kr, vr), do.double()))
    errs = [(a.double() - r).abs().max().item() for a, r in zip((o, *grads), ref, strict=True)]
    good = all(e <= 2e-2 * max(1.0, r.abs().max().item()) for e, r in zip(errs, ref, strict=True))
    ok &= good
    row = {"dtype": str(dtype), "D": head_dim, "Tq": seq_len_q, "Tk": seq_len_k, "causal": causal, "err": errs}
    print(("ok  " if good else "BAD ") + json.dumps(row), flush=True)
print("all ok" if ok else "FAILED")
