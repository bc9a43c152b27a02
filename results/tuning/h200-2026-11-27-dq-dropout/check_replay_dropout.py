"""flash_attention with dropout called three times on one signature, seeds 1, 2, 3: the third backward replays its
bound launches (`kernels/launch_plans.py`), which must give the Gluon dQ and dK/dV passes that call's seed and
offset. Each call's o, dq, dk, dv against float64 `reference_attention` under the mask that call drew
(`recover_keep_mask`), within 2e-2 of the largest reference value; and the three masks must differ.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-dq-dropout/check_replay_dropout.py
"""

import functools
import itertools
import json

import torch

from flashgpt.attention_reference import recover_keep_mask, reference_attention
from flashgpt.kernels import flash_attention
from flashgpt.kernels.dropout import keep_scale

P = 0.125  # 32/256: exactly the kernel's 8-bit rate
ok = True
for head_dim, seq_len in itertools.product((64, 128), (1024, 2048)):
    g = torch.Generator(device="cuda").manual_seed(seq_len + head_dim)
    q, k, v = (torch.randn(1, 4, seq_len, head_dim, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))  # fmt: skip
    do = torch.randn_like(q)
    attend = functools.partial(flash_attention, causal=True, dropout_p=P)
    masks = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)  # the kernel draws its dropout seed from torch's generator
        o = attend(q, k, v)
        grads = torch.autograd.grad(o, (q, k, v), do)
        keep = recover_keep_mask(attend, tuple(q.shape), seq_len, seed, device="cuda", dtype=torch.bfloat16)
        masks.append(keep)
        qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref_o, _ = reference_attention(qr, kr, vr, causal=True, keep=keep, keep_scale=keep_scale(P))
        ref = (ref_o, *torch.autograd.grad(ref_o, (qr, kr, vr), do.double()))
        errs = [(a.double() - r).abs().max().item() for a, r in zip((o, *grads), ref, strict=True)]
        good = all(e <= 2e-2 * max(1.0, r.abs().max().item()) for e, r in zip(errs, ref, strict=True))
        ok &= good
        row = {"D": head_dim, "T": seq_len, "seed": seed, "err": errs}
        print(("ok  " if good else "BAD ") + json.dumps(row), flush=True)
    differ = not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    ok &= differ
    print(f"D={head_dim} T={seq_len}: masks differ between calls: {differ}", flush=True)
print("all ok" if ok else "FAILED")
