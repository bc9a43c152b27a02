"""Same-process A/B of the forward's mask-free loop: one tile per iteration (off) against Q·Kᵀ of tile j issued with
P·V of tile j−1 so that the softmax overlaps the product (on), each at several launch configurations.

    FWD_OVERLAP is read by launch_forward at each call, so both forms run from one copy of kernels/ on the same
    inputs; timings alternate off, on (median of do_bench each), over --rounds rounds. Output: a table and JSON.
"""

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

import torch
import triton

from flashgpt.kernels import launch
from flashgpt.kernels.tuning import LaunchConfig

CONFIGS = {
    64: ["tuned", "64,64,4,3", "64,64,4,3,tma", "128,64,4,3", "128,64,4,3,tma", "128,128,8,2", "64,128,4,3"],
    128: ["tuned", "64,64,4,3", "128,128,8,2", "128,128,8,2,tma", "64,128,4,2"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--seq-lens", default="1024,4096,16384")
    parser.add_argument("--dropout", default="0,0.1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for head_dim in map(int, args.head_dims.split(",")):
        for seq_len in map(int, args.seq_lens.split(",")):
            for dropout in map(float, args.dropout.split(",")):
                batch, heads = max(1, 16384 // seq_len), 12 if head_dim <= 64 else 2048 // head_dim
                torch.manual_seed(0)
                q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))  # fmt: skip
                params = launch.AttentionParams(True, dropout, 1 / math.sqrt(head_dim), seed=7, offset=0)
                flops = 4 * batch * heads * seq_len**2 * head_dim * 0.5
                ref = None
                for name in CONFIGS[head_dim]:
                    cfg = launch.tuned_config("fwd", q, params) if name == "tuned" else LaunchConfig.parse(name)
                    outs, fns = {}, {}
                    for mode in ("0", "1"):
                        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")

                        def run(o=o, lse=lse, mode=mode, cfg=cfg, q=q, k=k, v=v, params=params):
                            os.environ["FWD_OVERLAP"] = mode
                            launch.launch_forward(q, k, v, o, lse, params, cfg)

                        try:
                            run()
                            torch.cuda.synchronize()
                        except Exception as error:  # a configuration that does not compile or fit
                            print(f"{head_dim} {seq_len} {dropout} {name} overlap={mode}: {type(error).__name__}")
                            fns = None
                            break
                        outs[mode], fns[mode] = (o, lse), run
                    if fns is None:
                        continue
                    if ref is None:
                        ref = outs["0"]
                    diff = dict(
                        o_on_vs_off=(outs["1"][0].float() - outs["0"][0].float()).abs().max().item(),
                        lse_on_vs_off=(outs["1"][1] - outs["0"][1]).abs().max().item(),
                        o_off_vs_tuned=(outs["0"][0].float() - ref[0].float()).abs().max().item(),
                    )
                    times = {"0": [], "1": []}
                    for _ in range(args.rounds):
                        for mode in ("0", "1"):
                            times[mode].append(triton.testing.do_bench(fns[mode], warmup=25, rep=100))
                    off, on = statistics.median(times["0"]), statistics.median(times["1"])
                    row = dict(head_dim=head_dim, seq_len=seq_len, dropout=dropout, config=str(cfg), name=name,
                               off_ms=off, on_ms=on, off_tflops=flops / off / 1e9, on_tflops=flops / on / 1e9,
                               speedup=off / on, rounds_ms=times, diff=diff)  # fmt: skip
                    rows.append(row)
                    print(f"D={head_dim:3d} T={seq_len:5d} p={dropout:.1f} {name:16s} off {off:7.3f} ms "
                          f"({row['off_tflops']:4.0f}) on {on:7.3f} ms ({row['on_tflops']:4.0f}) x{off / on:5.3f} "
                          f"diff {diff['o_on_vs_off']:.1e}/{diff['lse_on_vs_off']:.1e}", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                command=" ".join(sys.argv))  # fmt: skip
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
