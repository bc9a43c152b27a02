"""Both Gluon passes in fp16 (and bf16, for comparison) against float64 gradients, beside the Triton passes, on a
Hopper GPU. The kernels take their dtype from Q; until this check, `launch.hopper_launch_config` took them for
bf16 only. Each Gluon pass runs at its table configuration for the head dim, whatever the T.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-dq/check_fp16.py --out $OUT/check_fp16.json
"""

import argparse
import json
import math

import torch

from flashgpt.attention_reference import reference_attention
from flashgpt.kernels import launch
from flashgpt.kernels.launch import AttentionParams, tuned_config
from flashgpt.kernels.tuning import hopper_config

SHAPES = ((1000, 1000, True), (1000, 1000, False), (333, 777, True), (333, 777, False), (4096, 4096, True))


def run(dtype: torch.dtype, head_dim: int, seq_len_q: int, seq_len_k: int, causal: bool) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seq_len_q + head_dim)
    q, do = (torch.randn(1, 2, seq_len_q, head_dim, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(1, 2, seq_len_k, head_dim, device="cuda", generator=g).to(dtype) for _ in range(2))
    params = AttentionParams(causal, 0.0, 1 / math.sqrt(head_dim))
    o = torch.empty_like(q)
    lse = torch.empty(1, 2, seq_len_q, device="cuda", dtype=torch.float32)
    launch.launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    ref_o, _ = reference_attention(qr, kr, vr, causal=causal)
    ref = torch.autograd.grad(ref_o, (qr, kr, vr), do.double())
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    errors = {}
    # Triton passes
    launch.launch_dq(q, k, v, do, lse, delta, dq, params, tuned_config("bwd_dq", q, params), o=o)
    launch.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, tuned_config("bwd_dkdv", q, params))
    torch.cuda.synchronize()
    errors["triton"] = [(a.double() - r).abs().max().item() for a, r in zip((dq, dk, dv), ref, strict=True)]
    # Gluon passes, at the table's configurations for this head dim (16K entries)
    dq_cfg = hopper_config("bwd_dq_hopper", head_dim, "bfloat16", True, 16384)
    dkdv_cfg = hopper_config("bwd_dkdv_hopper", head_dim, "bfloat16", True, 16384)
    for t in (dq, dk, dv, delta):
        t.fill_(float("nan"))
    launch.launch_dq_hopper(q, k, v, do, o, lse, None, delta, dq, params, dq_cfg)
    launch.launch_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, params, dkdv_cfg)
    torch.cuda.synchronize()
    errors["gluon"] = [(a.double() - r).abs().max().item() for a, r in zip((dq, dk, dv), ref, strict=True)]
    scale = max(r.abs().max().item() for r in ref)
    slack = (1e-3 if dtype == torch.float16 else 4e-3) * scale  # one rounding of the output's dtype
    ok = all(e <= 1.5 * t + slack for e, t in zip(errors["gluon"], errors["triton"], strict=True))
    return {"dtype": str(dtype), "D": head_dim, "Tq": seq_len_q, "Tk": seq_len_k, "causal": causal,
            "max_abs_err_dq_dk_dv": errors, "ref_scale": scale, "ok": ok}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for head_dim in (64, 128):
            for shape in SHAPES:
                rows.append(run(dtype, head_dim, *shape))
                print(("ok  " if rows[-1]["ok"] else "BAD ") + json.dumps(rows[-1]), flush=True)
    result = {"device": torch.cuda.get_device_name(), "passed": all(r["ok"] for r in rows), "rows": rows}
    print("passed" if result["passed"] else "FAILED")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
