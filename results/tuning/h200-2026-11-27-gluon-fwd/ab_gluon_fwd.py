"""The Gluon forward (`kernels/flash_fwd_hopper.py`) against the Triton forward and cuDNN's, on a Hopper GPU, in one
process.

First a check: at small odd shapes (ragged T, Tq < Tk, causal and not, D = 64 and 128) o and LSE of the Triton
forward and of every Gluon variant are compared with float64 `reference_attention`; a Gluon variant must be within
1.5x the Triton forward's error plus bf16 rounding slack. Then timings, alternating variants round by round
(medians of `triton.testing.do_bench`): the Triton forward at its tuned configuration, the Gluon forward at each
of --configs ("BM,BN,4,STAGES[,maxnreg=N][,first|,overlap][@D,D]"; BM = 64, 128 or 192 math rows a program, i.e.
one to three math warpgroups; "first" and "overlap" run the first version, `flash_fwd_hopper_overlap.py`, without
or with its OVERLAP; "host" runs `flash_fwd_hopper_host_desc.py`, the kept one with descriptors made on the host,
in timings only), and cuDNN's and FlashAttention-2's forwards through SDPA (inputs requiring grad, so that they
keep the LSE as ours does). 16K tokens a call, causal, bf16; H = 12 at D = 64, 16 at D = 128.

    PYTHONPATH=. python results/tuning/h200-2026-11-27-gluon-fwd/ab_gluon_fwd.py --head-dims 64,128 \
        --seq-lens 1024,4096,16384 --configs "64,128,4,2,maxnreg=128;128,128,4,2,overlap" --out $OUT/ab.json
"""

import argparse
import itertools
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
from flashgpt.kernels.launch import AttentionParams, launch_forward, launch_forward_hopper, tuned_config
from flashgpt.kernels.tuning import LaunchConfig

sys.path.insert(0, str(Path(__file__).parent))
import flash_fwd_hopper_host_desc  # kept beside this script: descriptors made on the host
import flash_fwd_hopper_overlap  # kept beside this script: the first version, with OVERLAP
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


def host_descriptors(q, k, v, cfg: LaunchConfig) -> list:
    """Descriptors of q, k, v viewed as (B·H·T, D) (contiguous), in tiles of 64 query rows / block_n key rows."""
    descs = []
    for t, rows in ((q, 64), (k, cfg.block_n), (v, cfg.block_n)):
        flat = t.reshape(-1, t.shape[-1])
        layout = gl.NVMMASharedLayout.get_default_for(
            [rows, t.shape[-1]], gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
        )
        descs.append(TensorDescriptor.from_tensor(flat, [rows, t.shape[-1]], layout))
    return descs


def run_variant(q, k, v, o, lse, params: AttentionParams, cfg: LaunchConfig, overlap) -> None:
    """The kept forward (overlap None), the first version with OVERLAP on or off, or ("host") the kept one with
    descriptors made on the host."""
    if overlap is None:
        launch_forward_hopper(q, k, v, o, lse, params, cfg)
        return
    if overlap == "host":
        batch, heads, seq_len_q, head_dim = q.shape
        options = {"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}
        flash_fwd_hopper_host_desc.flash_fwd_hopper_kernel[(triton.cdiv(seq_len_q, cfg.block_m), batch * heads)](
            *host_descriptors(q, k, v, cfg), o, lse, *o.stride()[:3], heads, seq_len_q, k.shape[2],
            params.softmax_scale, HEAD_DIM=head_dim, BLOCK_N=cfg.block_n, STAGES=cfg.num_stages,
            CONSUMERS=cfg.block_m // 64, CAUSAL=params.causal, num_warps=4, **options,
        )  # fmt: skip
        return
    batch, heads, seq_len_q, head_dim = q.shape
    launch.provide_tma_scratch()
    strides = [s for t in (q, k, v, o) for s in t.stride()[:3]]
    options = {"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}
    flash_fwd_hopper_overlap.flash_fwd_hopper_kernel[(triton.cdiv(seq_len_q, cfg.block_m), batch * heads)](
        q, k, v, o, lse, *strides, heads, seq_len_q, k.shape[2], params.softmax_scale, HEAD_DIM=head_dim,
        BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, CONSUMERS=cfg.block_m // 64, CAUSAL=params.causal,
        OVERLAP=overlap, num_warps=4, **options,
    )  # fmt: skip


def parse(text: str) -> tuple[str, LaunchConfig, bool | None, list[int]]:
    """BM,BN,4,STAGES[,maxnreg=N][,first|,overlap|,host][@D,D]: first, overlap: the first version without or with
    it; host: descriptors made on the host (contiguous inputs, T a multiple of the tiles: timings only)."""
    spec, _, dims = text.partition("@")
    fields = spec.split(",")
    overlap = True if "overlap" in fields else False if "first" in fields else "host" if "host" in fields else None
    cfg = LaunchConfig.parse(",".join(f for f in fields if f not in ("overlap", "first", "host")))
    return spec, cfg, overlap, [int(d) for d in dims.split(",")] if dims else [64, 128]


def setup(batch, heads, seq_len_q, seq_len_k, head_dim, causal, seed=0, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, heads, seq_len_q, head_dim, device="cuda", generator=g).to(dtype)
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, device="cuda", generator=g).to(dtype) for _ in range(2))
    params = AttentionParams(causal, 0.0, 1 / math.sqrt(head_dim))
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq_len_q, device="cuda", dtype=torch.float32)
    return q, k, v, o, lse, params


CHECK_SHAPES = ((1000, 1000, True), (1000, 1000, False), (333, 777, True), (333, 777, False), (64, 64, True),
                (100, 300, True), (4096, 4096, True), (4096, 4096, False))  # fmt: skip


def check(variants, head_dims, dtypes) -> list[dict]:
    rows = []
    for dtype, head_dim, (seq_len_q, seq_len_k, causal) in itertools.product(dtypes, head_dims, CHECK_SHAPES):
        q, k, v, o, lse, params = setup(1, 3, seq_len_q, seq_len_k, head_dim, causal, seq_len_q + seq_len_k, dtype)
        ref_o, ref_lse = reference_attention(q.double(), k.double(), v.double(), causal=causal)
        launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params))
        torch.cuda.synchronize()
        err = {"triton": ((o.double() - ref_o).abs().max().item(), (lse.double() - ref_lse).abs().max().item())}
        for spec, cfg, overlap, dims in variants:
            if head_dim not in dims or overlap == "host":
                continue
            o.fill_(float("nan"))
            lse.fill_(float("nan"))
            run_variant(q, k, v, o, lse, params, cfg, overlap)
            torch.cuda.synchronize()
            err[spec] = ((o.double() - ref_o).abs().max().item(), (lse.double() - ref_lse).abs().max().item())
        t_o, t_lse = err["triton"]
        ok = all(e_o <= 1.5 * t_o + 4e-3 and e_l <= 1.5 * t_lse + 1e-4 for e_o, e_l in err.values())
        shape = {"dtype": str(dtype), "D": head_dim, "Tq": seq_len_q, "Tk": seq_len_k, "causal": causal}
        rows.append({**shape, "max_abs_err_o_lse": err, "ok": ok})
        print(("ok  " if ok else "BAD ") + json.dumps(rows[-1]), flush=True)
    return rows


def make_runs(variants, head_dim, q, k, v, o, lse, params, tuned) -> dict:
    """Closures running each forward on these inputs."""
    runs = {"triton": lambda: launch_forward(q, k, v, o, lse, params, tuned)}
    for spec, cfg, overlap, dims in variants:
        if head_dim in dims:
            runs[spec] = lambda cfg=cfg, overlap=overlap: run_variant(q, k, v, o, lse, params, cfg, overlap)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):

        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)

        runs[name] = sdpa
    return runs


def time_shapes(variants, head_dims, seq_lens, rounds) -> list[dict]:
    rows = []
    for head_dim in head_dims:
        for seq_len in seq_lens:
            batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 16
            q, k, v, o, lse, params = setup(batch, heads, seq_len, seq_len, head_dim, True)
            tuned = tuned_config("fwd", q, params)
            runs = make_runs(variants, head_dim, q, k, v, o, lse, params, tuned)
            runs["triton"]()
            reference = o.clone()
            diffs = {}
            for name in runs:
                if name not in ("triton", "cudnn", "fa2"):
                    o.fill_(float("nan"))
                    runs[name]()
                    diffs[name] = (o.float() - reference.float()).abs().max().item()
            times = {name: [] for name in runs}
            for _ in range(rounds):
                for name, run in runs.items():
                    times[name].append(triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median"))
            ms = {name: statistics.median(t) for name, t in times.items()}
            flops = 4 * batch * heads * seq_len**2 * head_dim * 0.5
            rows.append({"D": head_dim, "T": seq_len, "B": batch, "H": heads, "ms": ms, "tuned_triton": str(tuned),
                         "max_abs_diff_o_vs_triton": diffs,
                         "tflops": {n: flops / t / 1e9 for n, t in ms.items()}})  # fmt: skip
            print(f"D={head_dim} T={seq_len}", flush=True)
            for name, t in ms.items():
                print(f"  {t:8.4f} ms {flops / t / 1e9:6.0f} TF/s  {ms['triton'] / t:.3f}x triton  "
                      f"{ms['cudnn'] / t:.3f}x cuDNN  {name}", flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seq-lens", default="1024,4096,16384")
    parser.add_argument("--configs", default="64,128,4,2,maxnreg=128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check-dtypes", default="bfloat16,float16")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    variants = [parse(text) for text in args.configs.split(";")]
    head_dims = [int(d) for d in args.head_dims.split(",")]
    result = {"device": torch.cuda.get_device_name(), "check": []}
    if not args.skip_check:
        result["check"] = check(variants, head_dims, [getattr(torch, d) for d in args.check_dtypes.split(",")])
    result["timings"] = time_shapes(variants, head_dims, [int(t) for t in args.seq_lens.split(",")], args.rounds)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
