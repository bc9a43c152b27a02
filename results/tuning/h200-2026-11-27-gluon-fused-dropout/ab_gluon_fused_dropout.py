"""The 5-product Gluon backward with dropout (now `kernels/flash_bwd_fused_hopper.py`) against the fused Triton
backward and the split backward the table took, in one process (H200, 2026-11-27: `ab.json`).

First a check at odd shapes (ragged T, Tq < Tk, causal and not, a gradient of the LSE; D = 64, dropout 0 and 0.1):
dQ, dK and dV against float64 gradients of `reference_attention` under the mask the Triton forward drew, within
1.5x the fused Triton backward's error plus bf16 rounding slack. Then timings, rounds alternating (medians of
`triton.testing.do_bench`): each backward whole (δ and the accumulator's zeroing, the pass(es), dQ's conversion).
16K tokens a call, causal, bf16, H = 12, D = 64.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-fused-dropout/ab_gluon_fused_dropout.py --out $OUT/ab.json
    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-fused-dropout/ab_gluon_fused_dropout.py --compile-only
"""

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

import torch
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

HERE = Path(__file__).parent
HEAD_DIM = 64
CHECK_SHAPES = ((1000, 1000, True, False), (1000, 1000, False, True), (333, 777, True, True), (256, 256, True, False))


def _kernel():
    """The kernel as it was kept (`kernels/flash_bwd_fused_hopper.py`: the same machine code as the one timed here)."""
    from flashgpt.kernels.flash_bwd_fused_hopper import flash_bwd_fused_hopper_kernel

    return flash_bwd_fused_hopper_kernel


def accumulator_descriptor(dq_acc: torch.Tensor, rows: int) -> TensorDescriptor:
    """A descriptor of the fp32 accumulator (B, H, Tq, D) in tiles of (1, 1, rows, D), for the reduce-adds."""
    block = [1, 1, rows, dq_acc.shape[-1]]
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float32)
    return TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), block, layout)


def launch_fused_hopper(kernel, q, k, v, do, lse, delta, dk, dv, dq_acc, params, block_m=64, stages=4, warmup=False):
    """dk, dv, and dS·K added into dq_acc (zeroed, with δ in delta, by `launch_preprocess`)."""
    from flashgpt.kernels.gluon_common import head_descriptor

    batch, heads, seq_len_q, _ = q.shape
    seq_len_k = k.shape[2]
    args = (head_descriptor(q, block_m), head_descriptor(k, 64), head_descriptor(v, 64), head_descriptor(do, block_m),
            lse, delta, head_descriptor(dk, 64), head_descriptor(dv, 64), accumulator_descriptor(dq_acc, block_m),
            heads, seq_len_q, seq_len_k, params.softmax_scale, *params.scalars[1:])  # fmt: skip
    options = dict(STAGES=stages, CAUSAL=params.causal, DROPOUT=params.dropout, num_warps=4, maxnreg=128)
    grid = (-(-seq_len_k // 64), batch * heads)
    if warmup:
        return kernel.warmup(*args, grid=grid, **options)
    return kernel[grid](*args, **options)


def compile_only() -> None:
    """Compile for sm_90a without a GPU and report registers, stack, shared memory and ptxas warnings."""
    sys.path.insert(0, str(HERE.parents[2] / "scripts"))
    from kernel_sass import _HopperWithoutGpu, inspect
    from triton.runtime import driver

    driver.set_active(_HopperWithoutGpu())
    from flashgpt.kernels.launch import AttentionParams

    kernel = _kernel()
    shape = (1, 1, 4096, HEAD_DIM)
    q, k, v, do, dk, dv = (torch.empty(shape, dtype=torch.bfloat16) for _ in range(6))
    lse, delta, dq_acc = torch.empty(shape[:3]), torch.empty(shape[:3]), torch.empty(shape)
    for dropout, stages in itertools.product((0.0, 0.1), (2, 4)):
        params = AttentionParams(True, dropout, 1 / math.sqrt(HEAD_DIM))
        compiled = launch_fused_hopper(kernel, q, k, v, do, lse, delta, dk, dv, dq_acc, params, stages=stages,
                                       warmup=True)  # fmt: skip
        info, _ = inspect(compiled.asm["cubin"], compiled.asm["ptx"])
        summary = {key: info[key] for key in ("reg", "stack", "HGMMA", "total", "warn")}
        print(f"dropout {dropout}, {stages} stages: {summary}, shared {compiled.metadata.shared}", info["warnings"])


def setup(batch, heads, seq_len_q, seq_len_k, dropout, causal, seed=0):
    from flashgpt.kernels.launch import AttentionParams, launch_forward, tuned_config

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(batch, heads, seq_len_q, HEAD_DIM, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(batch, heads, seq_len_k, HEAD_DIM, device="cuda", generator=g).bfloat16() for _ in range(2))
    params = AttentionParams(causal, dropout, 1 / math.sqrt(HEAD_DIM), seed=1234 + seed, offset=2**33 + 7 * seed)
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_len_q, device="cuda", dtype=torch.float32)
    launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
    return q, k, v, do, o, lse, params


def make_runs(kernel, stages_list, q, k, v, do, o, lse, params, dlse=None) -> tuple[dict, dict]:
    """Closures running each backward whole on these inputs; their outputs (dq, dk, dv) land in the returned dict."""
    from flashgpt.kernels.launch import (
        NO_MASKS,
        hopper_launch_config,
        launch_dkdv,
        launch_dkdv_hopper,
        launch_dq,
        launch_dq_convert,
        launch_dq_hopper,
        launch_preprocess,
        tuned_config,
    )

    outs = {name: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)) for name in ("triton", "split")}
    outs.update({f"gluon fused, {s} stages": (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
                 for s in stages_list})  # fmt: skip
    delta = torch.empty_like(lse)
    dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    fused_cfg = tuned_config("bwd_fused", q, params)
    dq_hopper = hopper_launch_config("bwd_dq_hopper", q, k, v, o, do, params, NO_MASKS)
    dkdv_hopper = hopper_launch_config("bwd_dkdv_hopper", q, k, v, o, do, params, NO_MASKS)

    def triton_fused():
        dq, dk, dv = outs["triton"]
        launch_preprocess(o, do, delta, dlse, dq_acc)
        launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, fused_cfg, dq_acc=dq_acc, dq_reduce="tma")
        launch_dq_convert(dq_acc, dq, params.softmax_scale)

    def split():
        dq, dk, dv = outs["split"]
        split_delta = torch.empty_like(lse)
        if dq_hopper is not None:
            launch_dq_hopper(q, k, v, do, o, lse, dlse, split_delta, dq, params, dq_hopper)
        else:
            launch_dq(q, k, v, do, lse, split_delta, dq, params, tuned_config("bwd_dq", q, params), o=o, dlse=dlse)
        if dkdv_hopper is not None:
            launch_dkdv_hopper(q, k, v, do, lse, split_delta, dk, dv, params, dkdv_hopper)
        else:
            launch_dkdv(q, k, v, do, lse, split_delta, dk, dv, params, tuned_config("bwd_dkdv", q, params))

    def gluon_fused(stages):
        dq, dk, dv = outs[f"gluon fused, {stages} stages"]
        launch_preprocess(o, do, delta, dlse, dq_acc)
        launch_fused_hopper(kernel, q, k, v, do, lse, delta, dk, dv, dq_acc, params, stages=stages)
        launch_dq_convert(dq_acc, dq, params.softmax_scale)

    runs = {"triton": triton_fused, "split": split}
    runs.update({f"gluon fused, {s} stages": (lambda s=s: gluon_fused(s)) for s in stages_list})
    return runs, outs


def check(kernel, stages_list, dropouts) -> list[dict]:
    from flashgpt.attention_reference import recover_keep_mask, reference_attention
    from flashgpt.kernels.dropout import keep_scale
    from flashgpt.kernels.launch import launch_forward, tuned_config

    rows = []
    for p, (tq, tk, causal, with_dlse) in itertools.product(dropouts, CHECK_SHAPES):
        q, k, v, do, o, lse, params = setup(1, 2, tq, tk, p, causal, tq + tk)

        def attend(q_, k_, v_, params=params):
            o_ = torch.empty_like(q_)
            lse_ = torch.empty(q_.shape[:3], device="cuda", dtype=torch.float32)
            launch_forward(q_, k_, v_, o_, lse_, params, tuned_config("fwd", q_, params))
            return o_

        keep = None
        if p > 0:
            keep = recover_keep_mask(attend, tuple(q.shape), tk, 0, device="cuda", dtype=torch.bfloat16)
        dlse = torch.randn(lse.shape, device="cuda") if with_dlse else None
        qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
        ref_o, ref_lse = reference_attention(qr, kr, vr, causal=causal, keep=keep, keep_scale=keep_scale(p))
        outs_, grads = ([ref_o, ref_lse], [do.double(), dlse.double()]) if with_dlse else ([ref_o], [do.double()])
        ref = torch.autograd.grad(outs_, (qr, kr, vr), grads)
        runs, outs = make_runs(kernel, stages_list, q, k, v, do, o, lse, params, dlse)
        err = {}
        for name, run in runs.items():
            run()
            torch.cuda.synchronize()
            err[name] = [(g.double() - r).abs().max().item() for g, r in zip(outs[name], ref, strict=True)]
        scale = max(r.abs().max().item() for r in ref)
        ok = all(e <= 1.5 * t + 4e-3 * scale for errs in err.values() for e, t in zip(errs, err["triton"], strict=True))
        rows.append({"p": p, "Tq": tq, "Tk": tk, "causal": causal, "dlse": with_dlse, "max_abs_err": err, "ok": ok})
        print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


def time_shapes(kernel, stages_list, dropouts, seq_lens, rounds) -> list[dict]:
    import triton

    rows = []
    for p, seq_len in itertools.product(dropouts, seq_lens):
        batch, heads = max(1, 16384 // seq_len), 12
        q, k, v, do, o, lse, params = setup(batch, heads, seq_len, seq_len, p, True)
        runs, _ = make_runs(kernel, stages_list, q, k, v, do, o, lse, params)
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        rows.append({"p": p, "T": seq_len, "B": batch, "H": heads, "ms": ms})
        line = "  ".join(f"{name} {t:.4f} ms ({ms['triton'] / t:.3f}x triton, {ms['split'] / t:.3f}x split)"
                         for name, t in ms.items())  # fmt: skip
        print(f"p={p} T={seq_len}: {line}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--dropout", default="0.1,0")
    parser.add_argument("--stages", default="2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.compile_only:
        compile_only()
        return
    kernel = _kernel()
    stages_list = [int(s) for s in args.stages.split(",")]
    dropouts = [float(p) for p in args.dropout.split(",")]
    result = {"device": torch.cuda.get_device_name(), "check": check(kernel, stages_list, dropouts)}
    seq_lens = [int(t) for t in args.seq_lens.split(",")]
    result["timings"] = time_shapes(kernel, stages_list, dropouts, seq_lens, args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
