"""Same-process A/B of the whole backward: the fused (5-product) backward of several copies of kernels/, the split
(7-product) backward of the working tree, and cuDNN's backward through SDPA, causal, bf16, B·T = 16K tokens.

    PYTHONPATH=. OUT=<dir> python results/tuning/h100-2026-11-26-fused-overlap/fused_ab.py base=.ab/base/kernels new=.

Each fused copy runs at the working tree's tuned bwd_fused configuration and at each of CONFIGS (e.g.
"64-128-8-3-tma,32-128-8-3", at which the split backward's dK/dV pass runs too), with a TMA reduce-add of dQ
(Hopper), and with element-wise atomics where REDUCE includes "atomic"; CASES lists D:T:p. Timings are interleaved
over ROUNDS rounds (median of each). Backward TFLOP/s count 2.5x the forward's 4·B·H·T²·D/2 (causal), as the
benchmark does. Prints one line per case; writes $OUT/fused_ab.json.
"""

import json
import math
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashgpt.kernel_copies import load_launch
from flashgpt.kernels import launch as current
from flashgpt.kernels.tuning import LaunchConfig

HEADS = {64: 12, 128: 16}


def load(name: str, directory: str) -> ModuleType:
    """The `launch` module of the kernel package in directory ("." : the working tree's)."""
    return current if directory == "." else load_launch(directory, name)


def case_runs(copies: dict, head_dim: int, seq_len: int, p: float) -> tuple[dict[str, Callable], dict, dict]:
    """Closures running each backward at one shape, the gradients each wrote, and the working tree's configs."""
    batch, heads = max(1, 16384 // seq_len), HEADS[head_dim]
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    params = current.AttentionParams(True, p, 1 / math.sqrt(head_dim), seed=7, offset=0)
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(batch, heads, seq_len, device="cuda", dtype=torch.float32)
    delta = torch.empty_like(lse)
    cfg = {kp: current.tuned_config(kp, q, params) for kp in ("fwd", "bwd_fused", "bwd_dq", "bwd_dkdv")}
    fused_cfgs = {"tuned": cfg["bwd_fused"]}
    for c in filter(None, os.environ.get("CONFIGS", "").split(",")):
        bm, bn, w, st = map(int, c.split("-")[:4])
        fused_cfgs[c] = LaunchConfig(bm, bn, w, st, tma=c.endswith("-tma"))
    current.launch_forward(q, k, v, o, lse, params, cfg["fwd"])

    def fused(launch: ModuleType, reduce: str, fcfg: LaunchConfig, acc: torch.Tensor) -> None:
        launch.launch_preprocess(o, do, delta, None, acc)
        launch.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, fcfg, dq_acc=acc, dq_reduce=reduce)
        launch.launch_dq_convert(acc, dq, params.softmax_scale)

    def split() -> None:
        current.launch_dq(q, k, v, do, lse, delta, dq, params, cfg["bwd_dq"], o=o)
        current.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg["bwd_dkdv"])

    runs, outputs = {}, {}
    for name, launch in copies.items():
        # A copy from before the transposed accumulator keeps dQ's sums as q is laid out.
        has_acc = hasattr(launch, "dq_accumulator")
        acc = launch.dq_accumulator(q) if has_acc else torch.empty_like(q, dtype=torch.float32)
        for reduce in os.environ.get("REDUCE", "tma").split(","):
            for cname, fcfg in fused_cfgs.items():
                run = lambda launch=launch, reduce=reduce, fcfg=fcfg, acc=acc: fused(launch, reduce, fcfg, acc)
                try:
                    run()
                except Exception as err:  # out of resources: skip the configuration
                    print(f"  skip {name}/{reduce}/{cname}: {type(err).__name__}: {str(err)[:100]}")
                    continue
                outputs[f"{name}/{reduce}/{cname}"] = (dq.clone(), dk.clone(), dv.clone())
                runs[f"fused {name}/{reduce}/{cname}"] = run
    split()
    outputs["split"] = (dq.clone(), dk.clone(), dv.clone())
    runs["split"] = split
    for cname, dkdv_cfg in list(fused_cfgs.items())[1:]:  # the split backward with its dK/dV pass at CONFIGS

        def split_at(dkdv_cfg: LaunchConfig = dkdv_cfg) -> None:
            current.launch_dq(q, k, v, do, lse, delta, dq, params, cfg["bwd_dq"], o=o)
            current.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, dkdv_cfg)

        split_at()
        outputs[f"split/dkdv={cname}"] = (dq.clone(), dk.clone(), dv.clone())
        runs[f"split/dkdv={cname}"] = split_at
    if p == 0:
        qc, kc, vc = (x.detach().clone().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qc, kc, vc, is_causal=True)
        runs["cudnn"] = lambda: torch.autograd.grad(out, (qc, kc, vc), do, retain_graph=True)
    return runs, outputs, cfg


def main() -> None:
    copies = {name: load(f"ab_{name}", d) for name, d in (a.split("=") for a in sys.argv[1:])}
    rounds = int(os.environ.get("ROUNDS", "3"))
    cases = os.environ.get("CASES", "64:1024:0,64:4096:0,64:16384:0,64:4096:0.1,64:16384:0.1,128:4096:0,128:16384:0")
    rows = []
    for case in cases.split(","):
        d, t, p = int(case.split(":")[0]), int(case.split(":")[1]), float(case.split(":")[2])
        runs, outputs, cfg = case_runs(copies, d, t, p)
        torch.cuda.synchronize()
        ref = outputs["split"]
        err = {
            n: max((a.float() - r.float()).abs().max().item() for a, r in zip(grads, ref, strict=True))
            for n, grads in outputs.items()
        }
        times = {n: [] for n in runs}
        for _ in range(rounds):
            for n, run in runs.items():
                times[n].append(triton.testing.do_bench(run, warmup=10, rep=60, return_mode="median"))
        flops = 2.5 * 4 * max(1, 16384 // t) * HEADS[d] * t * t * d / 2
        line = f"D={d:3d} T={t:6d} p={p}"
        for n in runs:
            ms = statistics.median(times[n])
            config = n.rsplit("/", 1)[-1] if n.startswith("fused") else str(cfg["bwd_dkdv"])
            rows.append(dict(head_dim=d, T=t, dropout=p, variant=n, ms=ms, tflops=flops / ms / 1e9, config=config))
            diff = err.get(n.removeprefix("fused "), 0.0)
            line += f"\n    {n:40s} {ms:.4f} ms {flops / ms / 1e9:4.0f} TFLOP/s  max|diff| vs split {diff:.1e}"
        print(line, flush=True)
    Path(os.environ.get("OUT", "."), "fused_ab.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
