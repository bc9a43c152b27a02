"""The Gluon dQ pass with an LSE gradient (HAS_DLSE), against the float32 reference: o, lse and dq, dk, dv of
loss = sum(o * g) + sum(lse * g_lse), causal bf16 at D = 64 and 128, dense and under documents.

    PYTHONPATH=. python results/tuning/h200-2026-11-28-dq-row-loads/check_dlse.py
"""

import torch

from flashgpt.attention_masks import dense_mask
from flashgpt.attention_reference import reference_attention, rel_err
from flashgpt.kernels import flash_attention, flash_mask

torch.manual_seed(0)
ok = True
for head_dim, seq_len in ((64, 4096), (128, 2048), (64, 1000)):
    for documents in (False, True):
        shape = (2, 4, seq_len, head_dim)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        ids = (torch.arange(seq_len, device="cuda") * 5 // seq_len).expand(2, seq_len).contiguous()
        mask = flash_mask(seq_len, seq_len, head_dim=head_dim, dtype=q.dtype, document_ids=ids) if documents else None
        o, lse = flash_attention(q, k, v, causal=True, return_lse=True, mask=mask)
        g, g_lse = torch.randn_like(o), torch.randn_like(lse)
        grads = torch.autograd.grad((o.float() * g).sum() + (lse * g_lse).sum(), (q, k, v))
        leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
        # The causal rule is in the visibility: reference_attention takes `visible` as the whole mask.
        visible = dense_mask(seq_len, seq_len, causal=True, document_ids=ids if documents else None, device="cuda")
        ro, rlse = reference_attention(*leaves, visible, dtype=torch.float32)
        want = torch.autograd.grad((ro * g).sum() + (rlse * g_lse).sum(), leaves)
        errs = [rel_err(a.float(), b) for a, b in zip(grads, want, strict=True)]
        errs = [rel_err(o.float(), ro), rel_err(lse, rlse), *errs]
        passed = all(e <= 2e-2 for e in errs)
        ok &= passed
        print(f"D={head_dim} T={seq_len} documents={documents}: o, lse, dq, dk, dv rel err "
              + " ".join(f"{e:.1e}" for e in errs) + (" ok" if passed else " FAIL"), flush=True)  # fmt: skip
raise SystemExit(0 if ok else 1)
