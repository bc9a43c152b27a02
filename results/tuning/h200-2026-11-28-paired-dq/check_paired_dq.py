"""GPU check of the fused backward's paired-dQ path (two math warpgroups of 64 keys whose dQ is summed before it
leaves): every case below must be routed to it by the table, and its dq, dk, dv (and o, lse) must match a float32
reference as closely as the deterministic split backward's do on the same inputs (within TOLERANCE, and within 1.5x
the split backward's error + 1e-3). Cases: ragged T in the 4K and 16K buckets (not a multiple of the 128-key
program), Tq < Tk (causal, bottom-right aligned), fp16, packed qkv, B > 1, a gradient through the returned lse.
Prints a line per case; exit status 1 if any fails or is not routed there.

    PYTHONPATH=$PWD python results/tuning/h200-2026-11-28-paired-dq/check_paired_dq.py --out check.json
    # head dim 128 (32 x 128 tiles), through a copy with d128_dq_warpgroup.diff applied (`run_gpu.sh d128`):
    PYTHONPATH=$PWD/.ab/d128 python results/tuning/h200-2026-11-28-paired-dq/check_paired_dq.py --head-dim 128
    # with dropout (dropout_dq_warpgroup.diff): against the split backward on the same seed, whose keep-mask the
    # fused one must draw bit for bit (a mask that differed anywhere would show as an error of tens of percent)
    PYTHONPATH=$PWD/.ab/dropout python results/tuning/h200-2026-11-28-paired-dq/check_paired_dq.py --dropout 0.125
"""

import argparse
import json
import sys

import torch

from flashgpt.attention_reference import lse_err, reference_attention, rel_err
from flashgpt.kernels import flash_attention, launch, tuning

TOLERANCE = 2e-2  # bench_attention.py's for bf16 and fp16
SAME_MASK_TOLERANCE = 1e-2  # with dropout, against the split backward on the same seed (check_masks.py's)
# (batch, heads, Tq, Tk, dtype, packed, lse gradient)
CASES = [
    (1, 12, 16384, 16384, torch.bfloat16, False, False),
    (2, 12, 9000, 9000, torch.bfloat16, True, False),  # ragged; packed qkv as the model calls it
    (1, 8, 12345, 12345, torch.float16, False, True),  # fp16, and dlse through δ
    (1, 8, 5000, 12000, torch.bfloat16, False, False),  # Tq < Tk
    (1, 8, 129, 16384, torch.bfloat16, False, True),  # a few queries against many keys
    (3, 4, 16384 + 77, 16384 + 77, torch.bfloat16, False, False),  # past the largest bucket
    (4, 12, 3000, 3000, torch.bfloat16, True, False),  # the 4K bucket
    (2, 8, 1000, 4096, torch.float16, False, True),
]


def routed_to_paired(head_dim: int, dtype: torch.dtype, seq_len_k: int, dropout: bool) -> bool:
    """The table lists the Gluon fused backward on 64 x 128 tiles (32 x 128 at head dim 128), which
    `launch_fused_hopper` runs with a dQ warpgroup, for the call."""
    cfg = tuning.hopper_config("bwd_fused_hopper", head_dim, launch.dtype_name(dtype), True, dropout, seq_len_k)
    return cfg is not None and (cfg.block_m, cfg.block_n) == (64 if head_dim <= 64 else 32, 128)


def inputs(b: int, h: int, tq: int, tk: int, d: int, dtype: torch.dtype, packed: bool) -> list[torch.Tensor]:
    if packed:
        qkv = torch.randn(b, tk, 3, h, d, device="cuda", dtype=dtype).permute(2, 0, 3, 1, 4)
        return [x.detach().requires_grad_() for x in qkv.unbind(0)]
    return [torch.randn(b, h, t, d, device="cuda", dtype=dtype, requires_grad=True) for t in (tq, tk, tk)]


def run(q, k, v, grad_o, grad_lse, deterministic: bool, dropout_p: float) -> dict[str, torch.Tensor]:
    for x in (q, k, v):
        x.grad = None
    torch.manual_seed(1234)  # the same keep-mask for both backwards
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True, dropout_p=dropout_p, deterministic=deterministic)
    loss = (o.float() * grad_o).sum() + ((lse * grad_lse).sum() if grad_lse is not None else 0.0)
    loss.backward()
    return {"o": o.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def reference(q, k, v, grad_o, grad_lse, pairs) -> dict[str, list[torch.Tensor]]:
    out: dict[str, list[torch.Tensor]] = {n: [] for n in ("o", "lse", "dq", "dk", "dv")}
    for b, h in pairs:
        leaves = [x[b, h].detach().float().requires_grad_() for x in (q, k, v)]
        o, lse = reference_attention(*leaves, causal=True, dtype=torch.float32)
        loss = (o * grad_o[b, h]).sum() + ((lse * grad_lse[b, h]).sum() if grad_lse is not None else 0.0)
        loss.backward()
        for name, t in zip(out, (o.detach(), lse.detach(), *(x.grad for x in leaves)), strict=True):
            out[name].append(t)
    return out


def errors(got: dict[str, torch.Tensor], want: dict[str, list[torch.Tensor]], pairs) -> dict[str, float]:
    result = {}
    for name, refs in want.items():
        mine = torch.stack([got[name][b, h] for b, h in pairs])
        result[name] = (lse_err if name == "lse" else rel_err)(mine, torch.stack(refs))
    return result


def check(case: tuple, head_dim: int, dropout_p: float, seed: int) -> dict:
    b, h, tq, tk, dtype, packed, with_lse = case
    torch.manual_seed(seed)
    q, k, v = inputs(b, h, tq, tk, head_dim, dtype, packed)
    grad_o = torch.randn(b, h, tq, head_dim, device="cuda")
    grad_lse = torch.randn(b, h, tq, device="cuda") if with_lse else None
    pairs = [(0, 0), (b - 1, h - 1)]
    routed = routed_to_paired(head_dim, dtype, tk, dropout_p > 0)
    if dropout_p > 0:  # the fused backward against the split one, both on the forward's keep-mask
        split_out = run(q, k, v, grad_o, grad_lse, deterministic=True, dropout_p=dropout_p)
        want = {name: [split_out[name][b, h] for b, h in pairs] for name in split_out}
        paired = errors(run(q, k, v, grad_o, grad_lse, deterministic=False, dropout_p=dropout_p), want, pairs)
        split = {name: 0.0 for name in paired}
        passed = routed and all(e <= SAME_MASK_TOLERANCE for e in paired.values())
    else:
        want = reference(q, k, v, grad_o, grad_lse, pairs)
        paired = errors(run(q, k, v, grad_o, grad_lse, deterministic=False, dropout_p=0.0), want, pairs)
        split = errors(run(q, k, v, grad_o, grad_lse, deterministic=True, dropout_p=0.0), want, pairs)
        passed = routed and all(e <= TOLERANCE and e <= 1.5 * split[n] + 1e-3 for n, e in paired.items())
    extras = (" packed" if packed else "") + (" dlse" if with_lse else "")
    name = f"D={head_dim} B={b} H={h} Tq={tq} Tk={tk} {str(dtype)[6:]}{extras} p={dropout_p}"
    return {"case": name, "routed": routed, "paired": paired, "split": split, "passed": passed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dropout", type=float, default=0.0, help="compare against the split backward's grads")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    for seed, case in enumerate(CASES):
        result = check(case, args.head_dim, args.dropout, seed)
        results.append(result)
        worst = {n: f"{result['paired'][n]:.2e}/{result['split'][n]:.2e}" for n in result["paired"]}
        print(f"{'ok' if result['passed'] else 'FAILED'} {result['case']} routed={result['routed']} "
              f"paired/split: {worst}", flush=True)  # fmt: skip
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
