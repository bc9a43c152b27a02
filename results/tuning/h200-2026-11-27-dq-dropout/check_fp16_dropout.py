"""flash_attention with dropout in fp16 and bf16 through the Gluon dQ and dK/dV passes, at odd and tuned shapes,
against float64 `reference_attention` under the mask the kernel drew (`recover_keep_mask`): the max error of o, dq,
dk and dv, and whether it is within 2e-2 of the largest reference value (the GPU check's bf16 tolerance).

    PYTHONPATH=. python results/tuning/h200-2026-11-27-dq-dropout/check_fp16_dropout.py
"""

import functools
import itertools
import json

import torch

from flashgpt.attention_reference import recover_keep_mask, reference_attention
from flashgpt.kernels import flash_attention
from flashgpt.kernels.dropout import keep_scale

P = 0.125  # 32/256: exactly the kernel's 8-bit rate
SEED = 1234
ok = True
for dtype, head_dim, (seq_len_q, seq_len_k), causal in itertools.product(
    (torch.float16, torch.bfloat16), (64, 128), ((1000, 1000), (333, 777), (4096, 4096)), (True, False)
):
    g = torch.Generator(device="cuda").manual_seed(seq_len_q + head_dim)
    q = torch.randn(1, 4, seq_len_q, head_dim, device="cuda", generator=g, dtype=dtype).requires_grad_()
    k, v = (torch.randn(1, 4, seq_len_k, head_dim, device="cuda", generator=g, dtype=dtype).requires_grad_()
            for _ in range(2))  # fmt: skip
    do = torch.randn_like(q)
    attend = functools.partial(flash_attention, causal=causal, dropout_p=P)
    torch.manual_seed(SEED)  # the kernel draws its dropout seed from torch's generator
    o = attend(q, k, v)
    grads = torch.autograd.grad(o, (q, k, v), do)
    keep = recover_keep_mask(attend, tuple(q.shape), seq_len_k, SEED, device="cuda", dtype=dtype)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_o, _ = reference_attention(qr, kr, vr, causal=causal, keep=keep, keep_scale=keep_scale(P))
    ref = (ref_o, *torch.autograd.grad(ref_o, (qr, kr, vr), do.double()))
    errs = [(a.double() - r).abs().max().item() for a, r in zip((o, *grads), ref, strict=True)]
    good = all(e <= 2e-2 * max(1.0, r.abs().max().item()) for e, r in zip(errs, ref, strict=True))
    ok &= good
    row = {"dtype": str(dtype), "D": head_dim, "Tq": seq_len_q, "Tk": seq_len_k, "causal": causal, "err": errs}
    print(("ok  " if good else "BAD ") + json.dumps(row), flush=True)
print("all ok" if ok else "FAILED")
