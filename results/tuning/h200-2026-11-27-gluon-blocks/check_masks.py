"""The Gluon passes under a causal sliding window, documents and block masks, checked on the GPU against the fp32
reference and against the Triton passes (the same call with the Gluon kernels taken away), with and without
dropout.

Without dropout, each pass's output is compared with the reference (rel_err ≤ 2e-2 in bf16, and within 1.5× the
Triton passes' own error plus 1e-3). With dropout, the Gluon passes must draw the Triton passes' keep-mask bit for
bit, so both runs of one seed are compared with each other (≤ 1e-2; a mask that differed anywhere would show as an
error of tens of percent). Each case also says which passes ran in Gluon, and how far its outputs are from the
Triton run's. Exit status 1 if any case fails.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-blocks/check_masks.py --out check.json
"""

import argparse
import json
import math
import sys

import torch

from flashgpt.attention_masks import dense_mask
from flashgpt.attention_reference import reference_attention, rel_err
from flashgpt.kernels import attention_op, flash_attention, flash_mask, launch, launch_plans

GLUON = ("fwd_hopper", "bwd_dq_hopper", "bwd_dkdv_hopper", "bwd_fused_hopper")
# (D, Tq, Tk, W or None, documents, block mask, dropout): T's at which the table takes each Gluon pass, ragged and
# Tq < Tk shapes; block masks of 128-token blocks shared by the heads or per head, with the diagonal kept, or
# sparser and without it (rows that see no key); alone, with documents and with a window.
CASES = [
    (64, 4096, 4096, None, None, "shared", 0.0),
    (64, 4096, 4096, None, None, "heads", 0.0),
    (64, 4096, 4096, None, None, "sparse", 0.0),
    (64, 3000, 4096, None, None, "heads", 0.0),
    (64, 2048, 2048, None, None, "heads", 0.0),
    (64, 8192, 8192, None, None, "heads", 0.0),
    (64, 16384, 16384, None, None, "shared", 0.0),
    (64, 4096, 4096, None, "mixed", "heads", 0.0),
    (64, 8192, 8192, 1024, None, "heads", 0.0),
    (128, 1000, 1000, None, None, "heads", 0.0),
    (128, 4096, 4096, None, None, "sparse", 0.0),
    (128, 1500, 2048, None, "short", "heads", 0.0),
    (64, 4096, 4096, None, "mixed", None, 0.0),
    (64, 4096, 4096, 100, None, None, 0.0),
    (64, 4096, 4096, None, None, "heads", 0.1),
    (64, 2048, 2048, None, None, "sparse", 0.1),
    (128, 4096, 4096, None, None, "heads", 0.1),
    # D = 64 with dropout under masks, where the Gluon passes take their configuration without dropout
    # (`launch.gluon_config`): documents, a window alone (the dQ and dK/dV passes), a block mask, ragged.
    (64, 16384, 16384, None, "mixed", None, 0.1),
    (64, 8192, 8192, 1024, "mixed", None, 0.1),
    (64, 16384, 16384, 1024, None, None, 0.1),
    (64, 16384, 16384, None, None, "heads", 0.1),
    (64, 3000, 4096, None, None, "heads", 0.1),
]


def block_mask(kind: str | None, heads: int, seq_q: int, seq_k: int) -> torch.Tensor | None:
    """(H or 1, ceil(Tq / 128), ceil(Tk / 128)) bool: "shared" and "heads" keep each block with probability 0.3
    and the diagonal ones; "sparse" keeps 10%, the diagonal not forced."""
    if kind is None:
        return None
    gen = torch.Generator().manual_seed(seq_q + 3 * seq_k)
    rows, cols = -(-seq_q // 128), -(-seq_k // 128)
    mask = torch.rand(1 if kind == "shared" else heads, rows, cols, generator=gen) < (0.1 if kind == "sparse" else 0.3)
    if kind != "sparse":  # the key blocks holding each query block's own positions (queries: the last Tq)
        r = torch.arange(rows)
        mask[:, r, (r * 128 + seq_k - seq_q) // 128] = True
        mask[:, r, (((r + 1) * 128).clamp(max=seq_q) - 1 + seq_k - seq_q) // 128] = True
    return mask.to("cuda")


def documents(kind: str | None, batch: int, seq_len: int) -> torch.Tensor | None:
    """(B, T) int32 ids of packed documents: "mixed", lengths log-uniform in [1, T/2]; "short", 1 to 64 tokens."""
    if kind is None:
        return None
    gen = torch.Generator().manual_seed(seq_len)
    top = math.log(seq_len / 2) if kind == "mixed" else math.log(64)
    rows = []
    for _ in range(batch):
        lengths = (torch.rand(seq_len, generator=gen) * top).exp().long().clamp(min=1)
        rows.append(torch.repeat_interleave(torch.arange(seq_len), lengths)[:seq_len])
    return torch.stack(rows).to(device="cuda", dtype=torch.int32)


def gluon_passes(q, k, v, masks: dict, dropout: float) -> list[str]:
    params = launch.AttentionParams(True, dropout, q.shape[-1] ** -0.5)
    built = flash_mask(q.shape[2], k.shape[2], head_dim=q.shape[-1], dtype=q.dtype, dropout_p=dropout, **masks)
    o = torch.empty_like(q)
    passes = [p for p in GLUON if launch.hopper_launch_config(p, q, k, v, o, o, params, built) is not None]
    if "bwd_fused_hopper" in passes:  # the backward is the fused pass, not the split one
        passes = [p for p in passes if p not in ("bwd_dq_hopper", "bwd_dkdv_hopper")]
    return passes


def run(q, k, v, do, masks: dict, dropout: float, seed: int) -> dict:
    attention_op._BACKWARD_SCHEDULES.clear()  # each run decides its backward afresh, with the kernels it has
    torch.manual_seed(seed)
    o = flash_attention(q, k, v, causal=True, dropout_p=dropout, **masks)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return {"o": o, "dq": dq, "dk": dk, "dv": dv}


def check(
    head_dim: int, seq_q: int, seq_k: int, window: int | None, docs: str | None, blocks: str | None, dropout: float
) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seq_q * 7 + (window or 0))
    shape_q, shape_k = (2, 3, seq_q, head_dim), (2, 3, seq_k, head_dim)
    masks = {
        "window_size": window,
        "document_ids": documents(docs, 2, seq_k),
        "block_mask": block_mask(blocks, 3, seq_q, seq_k),
    }
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
    k, v = (torch.randn(shape_k, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_() for _ in "kv")
    do = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, generator=gen)
    passes = gluon_passes(q, k, v, masks, dropout)
    gluon = run(q, k, v, do, masks, dropout, seed=1)
    kept = {name: getattr(launch, f"flash_{name}_kernel") for name in GLUON}
    try:
        for name in GLUON:
            setattr(launch, f"flash_{name}_kernel", None)
        triton_run = run(q, k, v, do, masks, dropout, seed=1)
    finally:
        for name, kernel in kept.items():
            setattr(launch, f"flash_{name}_kernel", kernel)
    row = {"D": head_dim, "Tq": seq_q, "Tk": seq_k, "W": window, "docs": docs, "blocks": blocks, "dropout": dropout}
    row["gluon"] = passes
    finite = all(bool(torch.isfinite(t).all()) for t in gluon.values())
    if dropout == 0.0:
        visible = dense_mask(seq_q, seq_k, causal=True, device="cuda", **masks)
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        o_ref, _ = reference_attention(*leaves, visible, dtype=torch.float32)
        want = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(o_ref, leaves, do.float()), strict=True))
        want["o"] = o_ref.detach()
        row["gluon_err"] = {n: rel_err(gluon[n], want[n]) for n in want}
        row["triton_err"] = {n: rel_err(triton_run[n], want[n]) for n in want}
        ok = all(row["gluon_err"][n] <= min(2e-2, 1.5 * row["triton_err"][n] + 1e-3) for n in want)
    else:
        ok = all(rel_err(gluon[n], triton_run[n]) <= 1e-2 for n in gluon)
    # Zero where a Gluon pass reproduces the Triton pass bit for bit (same tiles and product order).
    row["gluon_vs_triton"] = {n: rel_err(gluon[n], triton_run[n]) for n in gluon}
    row["passed"] = bool(ok and finite and passes)
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    launch_plans.ENABLED = False  # each call decides its passes afresh: the Triton run must not replay Gluon's
    rows = []
    for case in CASES:
        row = check(*case)
        rows.append(row)
        errs = row.get("gluon_err", {})
        print(("ok  " if row["passed"] else "FAIL"), case, row["gluon"],
              " ".join(f"{n}={e:.2e}" for n, e in errs.items()),
              "| gluon vs triton " + " ".join(f"{n}={e:.2e}" for n, e in row["gluon_vs_triton"].items()),
              flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
