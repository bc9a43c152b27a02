"""What rotary positions cost train.py's compiled step, and where: ways of turning q and k, A/B in one process.

Each variant but `learned` and `rope` (the model's own forward) replaces CausalSelfAttention.forward; everything
else is bench_train.py's row (GPT-2 124M, 32K tokens a step, attention=flash, torch.compile, 3 warm-up + 10 timed
steps), timed in interleaved rounds (each starting one variant further on), then one torch.profiler pass of 2
steps per variant (every CUDA kernel by total time).

    learned    the model at HEAD with model.position_embedding=learned: the reference
    learned_again  a second, identical learned model: the A/A control of the rounds' resolution
    rope       the model at HEAD with model.position_embedding=rope
    separate   q and k each rotated from their strided views of the qkv projection (model/gpt.py at e0e35b9)
    joint      q and k rotated in one call on qkv[:, :, :2] (B, T, 2, H, D), so one kernel reads them token-major
    joint_qkv  as joint, and v copied beside them into one new (B, T, 3, H, D) buffer, so the projection's output
               is not kept alive by v
    flip       as separate, with the halves paired by a flip of a (..., 2, D/2) view instead of chunk and cat
    packed     as rope (HEAD's rotation), with v copied beside q and k into one new (B, T, 3, H, D) buffer
    unbind     as autograd, on qkv.unbind(2)'s views rather than on qkv[:, :, i]
    autograd   the rotation on qkv[:, :, i] with autograd's backward (41a4c17); rope's own backward is one kernel

    PYTHONPATH=$PWD:$PWD/scripts python results/tuning/h200-2026-11-28-rope-cost/rope_variants.py --out $OUT/rope.json
"""

import argparse
import json
import math
import sys

import numpy as np
import torch
from bench_train import RANDOM_TOKENS, compose_config, measure, release, trainpy_step
from torch.profiler import ProfilerActivity, profile

from flashgpt.data.batches import get_batch
from flashgpt.model import gpt
from flashgpt.model.rotary import apply_rotary
from flashgpt.training import step as step_module


def forward_with(turn):
    def forward(self, x, mask, cache=None, layer=0, rotary=None):
        B, T, C = x.shape
        D = C // self.n_head
        qkv = self.qkv(x).view(B, T, 3, self.n_head, D)  # (B, T, 3, H, D)
        q, k, v = turn(qkv, rotary)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        y = self.inner(q, k, v, mask=mask, dropout_p=self.dropout if self.training else 0.0, scale=1.0 / math.sqrt(D))
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))

    return forward


def rotate(x, cos, sin):
    """x (..., D) with pairs (i, i + D/2) turned; cos, sin broadcast to (..., D/2); float32 inside."""
    dtype = torch.promote_types(x.dtype, cos.dtype)
    x1, x2 = x.to(dtype).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def halves(rotary):
    """The model's (T, D) tables (cos repeated, sin signed) as the (T, D/2) cos and sin the variants below take."""
    cos, sin = rotary
    half = cos.size(-1) // 2
    return cos[:, :half], sin[:, half:]


def head_major(turn):
    """q and k each turned by `turn` on their strided (B, H, T, D) views of the projection: e0e35b9's layout."""

    def variant(qkv, rotary):
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        if rotary is not None:
            rotary = halves(rotary)
            q, k = turn(q, *rotary), turn(k, *rotary)
        return q, k, v

    return variant


def joint(qkv, rotary):
    if rotary is None:
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = (t[:, None, None, :] for t in halves(rotary))  # (T, 1, 1, D/2)
    q, k = rotate(qkv[:, :, :2], cos, sin).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, qkv[:, :, 2].transpose(1, 2)


def joint_qkv(qkv, rotary):
    if rotary is None:
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = (t[:, None, None, :] for t in halves(rotary))
    turned = torch.cat([rotate(qkv[:, :, :2], cos, sin), qkv[:, :, 2:]], dim=2)  # (B, T, 3, H, D)
    return turned.permute(2, 0, 3, 1, 4).unbind(0)


def rotate_halves(x, cos, sin):
    """rotate() without chunk and cat: x seen as (..., 2, D/2) halves, the partner of each half read by a flip, so
    the forward and its gradient are single pointwise expressions that inductor can fuse with their neighbours."""
    dtype = torch.promote_types(x.dtype, cos.dtype)
    pairs = x.to(dtype).unflatten(-1, (2, -1))  # (..., 2, D/2)
    sign = torch.tensor([-1.0, 1.0], dtype=dtype, device=x.device)[:, None]  # (2, 1): x1 cos - x2 sin, x2 cos + x1 sin
    turned = pairs * cos.unsqueeze(-2) + pairs.flip(-2) * sin.unsqueeze(-2) * sign
    return turned.flatten(-2).to(x.dtype)


def packed(qkv, rotary):
    """The model's rotation (token-major, roll), with v copied beside q and k into one new (B, T, 3, H, D) buffer,
    so the projection's output is freed after the forward: learned positions' memory, for one more copy of v."""
    if rotary is None:
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = (t[:, None, :] for t in rotary)  # 2 x (T, 1, D)
    q, k = (apply_rotary(qkv[:, :, i], cos, sin) for i in range(2))  # 2 x (B, T, H, D)
    return torch.stack([q, k, qkv[:, :, 2]], dim=2).permute(2, 0, 3, 1, 4).unbind(0)


def autograd(qkv, rotary):
    """The rotation of 41a4c17: apply_rotary on qkv[:, :, i], its backward left to autograd (a sum of three
    select_backward terms, one kernel loading dq, dk, dv for every element of dqkv)."""
    if rotary is None:
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = (t[:, None, :] for t in rotary)  # 2 x (T, 1, D)
    q, k = (apply_rotary(qkv[:, :, i], cos, sin).transpose(1, 2) for i in range(2))
    return q, k, qkv[:, :, 2].transpose(1, 2)


def unbind(qkv, rotary):
    """The model's rotation on qkv.unbind(2)'s views instead of qkv[:, :, i]: the gradient assembles dqkv as a stack
    of three inputs (a concatenation) rather than a sum of three select_backward terms."""
    if rotary is None:
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)
    cos, sin = (t[:, None, :] for t in rotary)  # 2 x (T, 1, D)
    q, k, v = qkv.unbind(2)  # 3 x (B, T, H, D)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    return (t.transpose(1, 2) for t in (q, k, v))


VARIANTS = {
    "learned": None,
    "learned_again": None,
    "rope": None,
    "separate": head_major(rotate),
    "joint": joint,
    "joint_qkv": joint_qkv,
    "flip": head_major(rotate_halves),
    "packed": packed,
    "unbind": unbind,
    "autograd": autograd,
}


def build(args, name, seq_len, device):
    """bench_train.py's step for one variant; its attention modules get a subclass with the variant's forward, so
    several variants live (and stay compiled) side by side."""
    forward = {} if VARIANTS[name] is None else {"forward": forward_with(VARIANTS[name])}  # None: the model's own
    variant = type(f"Attention_{name}", (gpt.CausalSelfAttention,), forward)
    build_model = step_module.build_model_and_optimizer

    def build_with_variant(cfg, device):
        model, optimizer, scheduler = build_model(cfg, device)
        for block in model.blocks:
            block.attn.__class__ = variant
        return model, optimizer, scheduler

    step_module.build_model_and_optimizer = build_with_variant
    try:
        torch.manual_seed(0)
        cfg = compose_config(args, "flash", "learned" if name.startswith("learned") else "rope", seq_len, 0.0, device)
        step, _, _ = trainpy_step(cfg, args, device)
    finally:
        step_module.build_model_and_optimizer = build_model
    tokens = np.random.default_rng(0).integers(0, 50257, RANDOM_TOKENS, dtype=np.uint16)
    starts = np.random.default_rng(1)
    batch = args.tokens_per_step // seq_len

    def next_batch():
        return get_batch(tokens, starts.integers(0, len(tokens) - seq_len - 1, batch), seq_len, device)

    return step, next_batch


def kernels(step, next_batch):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step(next_batch)
        torch.cuda.synchronize()
    rows = [
        {"name": e.key[:90], "ms_per_step": e.self_device_time_total / 2e3, "calls_per_step": e.count / 2}
        for e in prof.key_averages()
        if e.self_device_time_total > 0
    ]
    rows.sort(key=lambda r: -r["ms_per_step"])
    return {"total_ms": sum(r["ms_per_step"] for r in rows), "kernels": rows}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq-lens", default="1024,4096")
    p.add_argument("--variants", default="learned,rope,separate")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps a round")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    args = argparse.Namespace(model="gpt2", tokens_per_step=32768, compile_backend="inductor", warmup=3, steps=a.steps)
    device = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for seq_len in map(int, a.seq_lens.split(",")):
        built, peaks, times = {}, {}, {}
        for name in a.variants.split(","):
            torch.cuda.reset_peak_memory_stats()
            built[name] = build(args, name, seq_len, device)
            measure(*built[name], args, True)  # compiles
            peaks[name], times[name] = torch.cuda.max_memory_allocated() / 2**30, []
        names = list(built)
        for r in range(a.rounds):  # interleaved, so the GPU's drift between rounds hits every variant alike,
            for name in names[r % len(names) :] + names[: r % len(names)]:  # each round starting one further on:
                step, next_batch = built[name]  # the first variant after an idle GPU must not always be the same
                times[name].append(measure(step, next_batch, args, True)["step_ms"])
        for name, (step, next_batch) in built.items():
            row = {"seq_len": seq_len, "variant": name, "step_ms": times[name], "best_ms": min(times[name])}
            row["median_ms"] = float(np.median(times[name]))
            row.update(peak_gib=peaks[name], profile=kernels(step, next_batch))
            report["rows"].append(row)
        del built
        release()
        with open(a.out, "w") as f:  # after every length, so a run cut short keeps what it measured
            json.dump(report, f, indent=1)
    rows = report["rows"]
    learned = {r["seq_len"]: r for r in rows if r["variant"] == "learned"}
    for row in rows:
        base = learned.get(row["seq_len"])
        ratio = f"learned / this {base['best_ms'] / row['best_ms']:.3f} (best), " if base else ""
        ratio += f"{base['median_ms'] / row['median_ms']:.3f} (median)" if base else ""
        print(
            f"T={row['seq_len']:5d} {row['variant']:13s} best {row['best_ms']:6.2f} ms of "
            f"{' '.join(f'{t:.2f}' for t in row['step_ms'])} {ratio}, {row['peak_gib']:.1f} GiB, "
            f"kernels {row['profile']['total_ms']:.2f} ms"
        )
    for row in rows:  # the kernels a variant adds: those the learned model does not run
        base = learned.get(row["seq_len"])
        if base and row is not base:
            known = {k["name"] for k in base["profile"]["kernels"]}
            extra = [k for k in row["profile"]["kernels"] if k["name"] not in known]
            print(f"\n## T={row['seq_len']} {row['variant']}: kernels the learned model does not run")
            for k in extra:
                print(f"{k['ms_per_step']:7.3f} ms  x{k['calls_per_step']:4.0f}  {k['name']}")


if __name__ == "__main__":
    sys.exit(main())
