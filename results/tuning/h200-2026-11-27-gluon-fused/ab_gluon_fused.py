"""The 5-product backward in Gluon (`flash_bwd_fused_hopper.py`, beside this script) against today's backward, on a
Hopper GPU, in one process.

Variants, each the whole backward from the forward's O and LSE:
- "split": what `flash_attention` runs today without dropout (the dQ pass, then the dK/dV pass, each in Gluon
  where the table takes it);
- "triton fused": the Triton 5-product backward with TMA reduce-adds (`launch_dkdv(..., dq_reduce="tma")`);
- "gluon fused BM,BN,W,S": δ and a zeroed fp32 dQ accumulator (`launch_preprocess`), the Gluon kernel, then dQ's
  scale and cast (`launch_dq_convert`);
- "cudnn": cuDNN's backward through SDPA.

First a check of dQ, dK, dV against float64 gradients of `reference_attention` at small odd shapes (the Gluon
variant within 1.5x the split backward's error plus bf16 slack), then timings alternating round by round (medians
of `triton.testing.do_bench`). Causal, bf16, D = 64, H = 12, 16K tokens a call.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-fused/ab_gluon_fused.py \
        --seq-lens 1024,2048,4096,8192,16384 --configs "64,64,4,2,maxnreg=128;64,64,4,4,maxnreg=128" --out $OUT/ab.json
"""

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.attention_reference import reference_attention
from flashgpt.kernels import launch
from flashgpt.kernels.launch import AttentionParams, tuned_config
from flashgpt.kernels.tuning import LaunchConfig

sys.path.insert(0, str(Path(__file__).parent))
import flash_bwd_fused_hopper  # the experiment, and its form with the reduce-adds in the producer warp
import flash_bwd_fused_writer


def setup(batch, heads, seq_len_q, seq_len_k, head_dim, causal, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(batch, heads, seq_len_q, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, device="cuda", generator=g).bfloat16() for _ in range(2))
    params = AttentionParams(causal, 0.0, 1 / math.sqrt(head_dim))
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_len_q, device="cuda", dtype=torch.float32)
    launch.launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
    return q, k, v, do, o, lse, params


class Backward:
    """Outputs and scratch of one shape, and each variant's backward into them."""

    def __init__(self, q, k, v, do, o, lse, params):
        self.q, self.k, self.v, self.do, self.o, self.lse, self.params = q, k, v, do, o, lse, params
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.delta = torch.empty_like(lse)
        self.dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32)

    def split(self):
        q, k, v, do, o, lse, p = self.q, self.k, self.v, self.do, self.o, self.lse, self.params
        hopper_dq = launch.hopper_launch_config("bwd_dq_hopper", q, k, v, o, do, p, launch.NO_MASKS)
        if hopper_dq is not None:
            launch.launch_dq_hopper(q, k, v, do, o, lse, None, self.delta, self.dq, p, hopper_dq)
        else:
            launch.launch_dq(q, k, v, do, lse, self.delta, self.dq, p, tuned_config("bwd_dq", q, p), o=o)
        hopper = launch.hopper_launch_config("bwd_dkdv_hopper", q, k, v, o, do, p, launch.NO_MASKS)
        if hopper is not None:
            launch.launch_dkdv_hopper(q, k, v, do, lse, self.delta, self.dk, self.dv, p, hopper)
        else:
            launch.launch_dkdv(q, k, v, do, lse, self.delta, self.dk, self.dv, p, tuned_config("bwd_dkdv", q, p))

    def triton_fused(self):
        q, k, v, do, o, lse, p = self.q, self.k, self.v, self.do, self.o, self.lse, self.params
        launch.launch_preprocess(o, do, self.delta, None, self.dq_acc)
        launch.launch_dkdv(q, k, v, do, lse, self.delta, self.dk, self.dv, p, tuned_config("bwd_fused", q, p),
                           dq_acc=self.dq_acc, dq_reduce="tma")  # fmt: skip
        launch.launch_dq_convert(self.dq_acc, self.dq, p.softmax_scale)

    def gluon_fused(self, cfg: LaunchConfig, buffers=1, kernel_only=False, module=flash_bwd_fused_hopper):
        q, k, v, do, o, lse, p = self.q, self.k, self.v, self.do, self.o, self.lse, self.params
        batch, heads, seq_len_q, head_dim = q.shape
        seq_len_k = k.shape[2]
        if not kernel_only:
            launch.launch_preprocess(o, do, self.delta, None, self.dq_acc)
        launch.provide_tma_scratch()
        strides = [s for t in (q, k, v, do, self.dk, self.dv) for s in t.stride()[:3]]
        module.flash_bwd_dkdv_hopper_kernel[(triton.cdiv(seq_len_k, cfg.block_n), batch * heads)](
            q, k, v, do, lse, self.delta, self.dk, self.dv, self.dq_acc, *strides, heads, seq_len_q, seq_len_k,
            p.softmax_scale, HEAD_DIM=head_dim, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages,
            CAUSAL=p.causal, DQ_BUFFERS=buffers, num_warps=cfg.num_warps, maxnreg=cfg.maxnreg,
        )  # fmt: skip
        if not kernel_only:
            launch.launch_dq_convert(self.dq_acc, self.dq, p.softmax_scale)

    def variants(self, configs, timing: bool = False) -> dict:
        runs = {"split": self.split, "triton fused": self.triton_fused}
        for cfg in configs:
            name = f"{cfg.block_m},{cfg.block_n},{cfg.num_warps},{cfg.num_stages}"
            runs[f"gluon fused {name}"] = lambda cfg=cfg: self.gluon_fused(cfg)
            for buffers in (1, 2):
                runs[f"writer {name}, {buffers} dQ buffers"] = lambda cfg=cfg, buffers=buffers: self.gluon_fused(
                    cfg, buffers=buffers, module=flash_bwd_fused_writer
                )
        if timing:  # the kernel alone, without δ's preprocess and dQ's conversion (its dQ is not complete)
            cfg = configs[0]
            runs["writer kernel only"] = lambda: self.gluon_fused(cfg, kernel_only=True, module=flash_bwd_fused_writer)
        return runs


CHECK_SHAPES = ((1000, 1000, True), (1000, 1000, False), (333, 777, True), (4096, 4096, True))


def check(configs) -> list[dict]:
    rows = []
    for seq_len_q, seq_len_k, causal in CHECK_SHAPES:
        q, k, v, do, o, lse, params = setup(1, 2, seq_len_q, seq_len_k, 64, causal, seed=seq_len_q)
        qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
        ref_o, _ = reference_attention(qr, kr, vr, causal=causal)
        ref = torch.autograd.grad(ref_o, (qr, kr, vr), do.double())
        bwd = Backward(q, k, v, do, o, lse, params)
        err = {}
        for name, run in bwd.variants(configs).items():
            for t in (bwd.dq, bwd.dk, bwd.dv):
                t.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            grads = (bwd.dq, bwd.dk, bwd.dv)
            err[name] = [(g.double() - r).abs().max().item() for g, r in zip(grads, ref, strict=True)]
        scale = max(r.abs().max().item() for r in ref)
        ok = all(e <= 1.5 * s + 4e-3 * scale for errs in err.values() for e, s in zip(errs, err["split"], strict=True))
        rows.append({"Tq": seq_len_q, "Tk": seq_len_k, "causal": causal, "max_abs_err_dq_dk_dv": err,
                     "ref_scale": scale, "ok": ok})  # fmt: skip
        print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


def time_shapes(configs, seq_lens, rounds) -> list[dict]:
    rows = []
    for seq_len in seq_lens:
        batch, heads = max(1, 16384 // seq_len), 12
        q, k, v, do, o, lse, params = setup(batch, heads, seq_len, seq_len, 64, True)
        bwd = Backward(q, k, v, do, o, lse, params)
        runs = bwd.variants(configs, timing=True)
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
        runs["cudnn"] = lambda out=out, inputs=(qg, kg, vg), grad=do: torch.autograd.grad(
            out, inputs, grad, retain_graph=True
        )
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
        ms = {name: statistics.median(t) for name, t in times.items()}
        bwd_flops = 2.5 * 4 * batch * heads * seq_len**2 * 64 * 0.5
        rows.append({"T": seq_len, "B": batch, "H": heads, "ms": ms,
                     "bwd_tflops": {n: bwd_flops / t / 1e9 for n, t in ms.items()}})  # fmt: skip
        print(f"T={seq_len}", flush=True)
        for name, t in ms.items():
            print(f"  {t:8.4f} ms  {name:28s} {ms['split'] / t:.3f}x split  {ms['cudnn'] / t:.3f}x cuDNN", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="1024,4096,16384")
    parser.add_argument("--configs", default="64,64,4,2,maxnreg=128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    configs = [LaunchConfig.parse(text) for text in args.configs.split(";")]
    result = {"device": torch.cuda.get_device_name(), "check": check(configs)}
    result["timings"] = time_shapes(configs, [int(t) for t in args.seq_lens.split(",")], args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
