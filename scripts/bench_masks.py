"""Masked attention: our kernel against FlexAttention on the same masks, forward + backward, after checking both.

Shapes: causal self-attention, Tq = Tk = T, D = 64, bf16, H = 12, B = max(1, 16384 // T). Masks:

    dense                          plain causal (ours; FlexAttention with a causal block mask)
    window_1k, window_4k           sliding window of 1024 / 4096 keys
    documents                      packed documents of mixed lengths (log-uniform, 64 tokens to T/2)
    local_global, strided, butterfly
                                   model/sparsity.py's block patterns at a target 15% of the causal tiles,
                                   block_size 128 (the density reached is reported)

Effective TFLOP/s count only the visible (query, key) pairs, counted exactly from `dense_mask` in row chunks:
fwd = 4·D·pairs, fwd+bwd = 3.5·fwd (bwd = 2.5·fwd, as in bench_attention.py). Each row reports
    x_flex   FlexAttention fwd+bwd time / ours (the goal is >= 1.2)
    x_dense  our effective fwd+bwd TFLOP/s / our dense causal TFLOP/s at the same T (>= 0.8: time ∝ visible work)
With dropout 0.1 (FlexAttention has none) our masked kernel is compared with our dense kernel, both at 0.1.
Masks are built once per case, outside the timing, for both: `flash_mask` (the tile schedules) and FlexAttention's
`create_block_mask`, as a model builds them once per batch for all its layers. host_ms is the CPU time to issue one
fwd+bwd and gpu_ms the GPU time to run it, each with the other out of the picture (`flashgpt.gpu_timing`): where
host_ms nears gpu_ms, the call is bound by the host (marked † in the table), and x_dense_gpu gives the ratio the
kernels reach where the host keeps ahead of them, as in a model's step of many layers.

Before timing, every mask is checked on fresh random inputs against an fp32 PyTorch reference that applies
`dense_mask` (ours and FlexAttention: o, dq, dk, dv; on the GPU at 4K, and ours again at 16K, where masked calls take
other passes), and with dropout against the reference under the kernel's own keep-mask (recovered with q = k = 0
and one-hot v; on the GPU at 1K and 16K, where masked calls with dropout take the fused backward's dQ warpgroup).

    python scripts/bench_masks.py --out $OUT                   # GPU: checks, then T = 4K, 16K, 64K
    python scripts/bench_masks.py --seq-lens 65536 --out $OUT  # one T
    python scripts/bench_masks.py --check-only                 # checks only; without CUDA: tiny fp32 shapes
                                                               # through the Triton interpreter, no FlexAttention
Exit status 1 if a check fails. Out-of-memory and errors are recorded in the row, never raised.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

# Pure torch, safe to import before TRITON_INTERPRET is set; the kernels are imported when first used.
from flashgpt.attention_masks import dense_mask
from flashgpt.attention_reference import recover_keep_mask as recover_dropout_mask
from flashgpt.attention_reference import reference_attention, rel_err
from flashgpt.benchmark_tables import HOST_BOUND_NOTE, host_bound
from flashgpt.command_line import command_line, csv_list, write_json
from flashgpt.gpu_timing import gpu_ms_per_call, host_ms_per_call
from flashgpt.model.sparsity import BlockSparseConfig, build_block_mask

ROOT = Path(__file__).resolve().parents[1]


MASKS = ("dense", "window_1k", "window_4k", "documents", "local_global", "strided", "butterfly")
PATTERNS = ("local_global", "strided", "butterfly")
SEQ_LENS = (4096, 16384, 65536)
TOKENS_PER_CALL = 16384
HEADS = 12
HEAD_DIM = 64
TARGET_DENSITY = 0.15
DROPOUT = 0.1
HOST_CALLS = 20  # fwd+bwd steps timed for host_ms and gpu_ms
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


@dataclass(frozen=True)
class Profile:
    """What differs between a GPU run and the CPU smoke path (interpreter: tiny shapes, fp32)."""

    device: str
    dtype: torch.dtype
    block_size: int
    check_seq_len: int  # the T of the correctness checks (windows and documents scale with it)
    dropout_check_seq_len: int  # recovering the keep-mask costs T / D calls
    # A second T for the checks without dropout, past 8K: masked calls there take the fused backward's dQ
    # warpgroup on a Hopper GPU (`launch.gluon_config`), which check_seq_len does not reach. None: no second T.
    long_check_seq_len: int | None = None
    # Likewise with dropout: from 16K masked calls with dropout take the fused backward's dQ warpgroup on 32-query
    # tiles, which dropout_check_seq_len does not reach. None: no second T.
    long_dropout_check_seq_len: int | None = None

    def window(self, name: str, seq_len: int) -> int:
        """window_1k / window_4k, scaled down with T on the CPU so that the window is narrower than T."""
        size = {"window_1k": 1024, "window_4k": 4096}[name]
        return size if self.device == "cuda" else max(16, seq_len * size // 16384)


@dataclass
class MaskCase:
    name: str
    flash_kwargs: dict  # the masks as flash_attention takes them (besides causal=True)
    mask_mod: Callable  # the same mask for FlexAttention, (b, h, q_idx, kv_idx) -> bool
    per_batch: bool  # the mask differs between batch elements (documents)
    visible_pairs: int  # over all (b, h)
    density: float  # visible pairs / causal pairs


@dataclass
class Row:
    mask: str
    provider: str  # flash | flex
    seq_len: int
    batch: int
    dropout: float
    density: float
    visible_pairs: int
    status: str = "ok"  # ok | oom | error
    reason: str | None = None
    fwd_ms: float | None = None
    fwd_bwd_ms: float | None = None
    host_ms: float | None = None  # CPU time to issue one fwd+bwd
    gpu_ms: float | None = None  # GPU time to run one fwd+bwd, the host out of the picture
    tflops: dict[str, float] = field(default_factory=dict)  # effective: fwd / fwd_bwd
    x_flex: float | None = None
    x_dense: float | None = None
    x_dense_gpu: float | None = None  # x_dense from the GPU times: what the kernels do where the host keeps up


# --- masks ------------------------------------------------------------------------------------------------


def mixed_documents(batch: int, seq_len: int, device: str, seed: int = 0) -> Tensor:
    """(B, T) ids of packed documents with lengths log-uniform in [64, T/2] (the last one cut at T)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        lengths: list[int] = []
        while sum(lengths) < seq_len:
            log_len = torch.empty(1).uniform_(math.log(64), math.log(max(65, seq_len // 2)), generator=gen)
            lengths.append(int(log_len.exp()))
        rows.append(torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:seq_len])
    return torch.stack(rows).to(device)


def causal_rows(kwargs: dict, r0: int, r1: int, device: str) -> Tensor:
    """Rows [r0, r1) of a causal T×T visibility under the masks flash_attention takes as kwargs, (B or 1, H or 1,
    r1 − r0, r1): the last r1 − r0 queries of the first r1 keys (keys past r1 are never visible to them). r0 must
    fall on a block boundary of a block mask."""
    sliced = dict(kwargs)
    if "document_ids" in kwargs:
        sliced["document_ids"] = kwargs["document_ids"][:, :r1]
    if "block_mask" in kwargs:
        block_size = kwargs.get("block_size", 128)
        n_keys = math.ceil(r1 / block_size)
        sliced["block_mask"] = kwargs["block_mask"][:, r0 // block_size : n_keys, :n_keys]
    return dense_mask(r1 - r0, r1, causal=True, device=device, **sliced)


def visible_pairs(seq_len: int, batch: int, heads: int, kwargs: dict, device: str, chunk: int = 2048) -> int:
    """Exact count of visible causal pairs over all (b, h): `causal_rows` over row chunks."""
    block_size = kwargs.get("block_size", 128)
    chunk = max(chunk // block_size, 1) * block_size  # chunks start on block boundaries
    total = 0
    for r0 in range(0, seq_len, chunk):
        visible = causal_rows(kwargs, r0, min(seq_len, r0 + chunk), device)
        total += int(visible.sum()) * (batch // visible.shape[0]) * (heads // visible.shape[1])
    return total


def build_case(name: str, seq_len: int, batch: int, profile: Profile) -> MaskCase:
    device, block_size = profile.device, profile.block_size

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    kwargs: dict = {}
    mask_mod = causal
    per_batch = False
    if name.startswith("window"):
        width = profile.window(name, seq_len)
        kwargs["window_size"] = width

        def mask_mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (q_idx - kv_idx < width)

    elif name == "documents":
        ids = mixed_documents(batch, seq_len, device)
        kwargs["document_ids"] = ids
        per_batch = True

        def mask_mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (ids[b, q_idx] == ids[b, kv_idx])

    elif name in PATTERNS:
        n_blocks = math.ceil(seq_len / block_size)
        layout = build_block_mask(BlockSparseConfig(name, density=TARGET_DENSITY), n_blocks).to(device)
        kwargs.update(block_mask=layout, block_size=block_size)

        def mask_mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & layout[0, q_idx // block_size, kv_idx // block_size]

    elif name != "dense":
        raise ValueError(f"unknown mask {name!r}; choose from {', '.join(MASKS)}")
    pairs = visible_pairs(seq_len, batch, HEADS, kwargs, device)
    causal_pairs = batch * HEADS * seq_len * (seq_len + 1) // 2
    return MaskCase(name, kwargs, mask_mod, per_batch, pairs, pairs / causal_pairs)


# --- providers --------------------------------------------------------------------------------------------


def flash_fn(
    case: MaskCase, dropout: float, seq_len: int, dtype: torch.dtype
) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Our kernel with the case's masks built once (flash_mask) for calls of this T, dtype and dropout."""
    from flashgpt.kernels import flash_attention, flash_mask

    if not case.flash_kwargs:  # dense causal: nothing to build
        return lambda q, k, v: flash_attention(q, k, v, causal=True, dropout_p=dropout)
    mask = flash_mask(seq_len, seq_len, head_dim=HEAD_DIM, dtype=dtype, dropout_p=dropout, **case.flash_kwargs)
    return lambda q, k, v: flash_attention(q, k, v, causal=True, dropout_p=dropout, mask=mask)


def flex_fn(case: MaskCase, seq_len: int, batch: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """Compiled FlexAttention with its block mask for the case (built once, outside the timing)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()  # a fresh compile per mask: no recompilation with dynamic shapes
    block_mask = create_block_mask(
        case.mask_mod, batch if case.per_batch else None, None, seq_len, seq_len, device="cuda", _compile=True
    )
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


# --- correctness ------------------------------------------------------------------------------------------


def _inputs(batch: int, seq_len: int, profile: Profile) -> list[Tensor]:
    opts = {"device": profile.device, "dtype": profile.dtype, "requires_grad": True}
    return [torch.randn(batch, 2, seq_len, HEAD_DIM, **opts) for _ in range(3)]


def _compare(fn: Callable, q: Tensor, k: Tensor, v: Tensor, want: dict[str, Tensor], dtype: torch.dtype) -> dict:
    o = fn(q, k, v)
    grads = torch.autograd.grad(o, (q, k, v), want["do"].to(o.dtype))
    got = {"o": o, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    errors = {name: rel_err(got[name], want[name]) for name in got}
    finite = all(bool(torch.isfinite(t).all()) for t in got.values())
    return {"rel_err": errors, "passed": finite and all(e <= TOLERANCE[dtype] for e in errors.values())}


def _reference_grads(q, k, v, visible, do, keep=None, p=0.0) -> dict[str, Tensor]:
    from flashgpt.kernels.dropout import keep_scale  # with the kernels, once TRITON_INTERPRET is decided

    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    o, _ = reference_attention(*leaves, visible, keep=keep, keep_scale=keep_scale(p), dtype=torch.float32)
    grads = torch.autograd.grad(o, leaves, do.float())
    return {"o": o.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2], "do": do}


def check_mask(name: str, seq_len: int, profile: Profile, with_flex: bool) -> dict:
    """Ours (and FlexAttention) against the fp32 reference, B = 2 (documents differ per batch element)."""
    batch = 2
    case = build_case(name, seq_len, batch, profile)
    q, k, v = _inputs(batch, seq_len, profile)
    visible = dense_mask(seq_len, seq_len, causal=True, device=profile.device, **case.flash_kwargs)
    want = _reference_grads(q, k, v, visible, torch.randn_like(q))
    result = {"flash": _compare(flash_fn(case, 0.0, seq_len, profile.dtype), q, k, v, want, profile.dtype)}
    if with_flex:
        result["flex"] = _compare(flex_fn(case, seq_len, batch), q, k, v, want, profile.dtype)
    return {"mask": name, "density": case.density, **result, "passed": all(r["passed"] for r in result.values())}


def recover_keep_mask(case: MaskCase, batch: int, seq_len: int, profile: Profile, seed: int) -> Tensor:
    """The kernel's keep-mask at visible pairs for `seed` (`attention_reference.recover_keep_mask`)."""
    attend = flash_fn(case, DROPOUT, seq_len, profile.dtype)
    shape = (batch, 2, seq_len, HEAD_DIM)
    return recover_dropout_mask(attend, shape, seq_len, seed, device=profile.device, dtype=profile.dtype)


def check_dropout(name: str, seq_len: int, profile: Profile, seed: int = 1234) -> dict:
    """With dropout: o, dq, dk, dv against the reference under the recovered keep-mask; no kept masked pair."""
    batch = 1
    case = build_case(name, seq_len, batch, profile)
    visible = dense_mask(seq_len, seq_len, causal=True, device=profile.device, **case.flash_kwargs)
    keep = recover_keep_mask(case, batch, seq_len, profile, seed)
    q, k, v = _inputs(batch, seq_len, profile)
    want = _reference_grads(q, k, v, visible, torch.randn_like(q), keep, DROPOUT)
    attend = flash_fn(case, DROPOUT, seq_len, profile.dtype)

    def seeded(q, k, v):
        torch.manual_seed(seed)
        return attend(q, k, v)

    result = _compare(seeded, q, k, v, want, profile.dtype)
    respects_mask = not bool((keep & ~visible).any())
    return {"mask": name, **result, "respects_mask": respects_mask, "passed": result["passed"] and respects_mask}


def _guarded(label: str, fn: Callable[[], dict]) -> dict:
    """A check that raises is a failed check with its reason, not a crash."""
    try:
        result = fn()
    except Exception as err:
        result = {"passed": False, "error": f"{type(err).__name__}: {err}"[:500]}
    gc.collect()
    errors = {k: v["rel_err"] for k, v in result.items() if isinstance(v, dict) and "rel_err" in v}
    errors = errors or ({"flash": result["rel_err"]} if "rel_err" in result else {})
    brief = " ".join(f"{who}: " + " ".join(f"{n}={e:.1e}" for n, e in errs.items()) for who, errs in errors.items())
    print(f"check {label}: {'ok' if result['passed'] else 'FAILED'} {brief} {result.get('error', '')}", flush=True)
    return {"check": label, **result}


def run_checks(masks: Sequence[str], profile: Profile, with_flex: bool) -> dict:
    torch.set_float32_matmul_precision("highest")  # the reference must be real fp32, not tf32
    seq_len, long = profile.check_seq_len, profile.long_check_seq_len
    results = [_guarded(f"{m} T={seq_len}", lambda m=m: check_mask(m, seq_len, profile, with_flex)) for m in masks]
    if long is not None:  # ours only: FlexAttention's check at check_seq_len suffices
        results += [_guarded(f"{m} T={long}", lambda m=m: check_mask(m, long, profile, False)) for m in masks]
    for t in (profile.dropout_check_seq_len, profile.long_dropout_check_seq_len):
        if t is not None:
            results += [
                _guarded(f"{m} dropout {DROPOUT} T={t}", lambda m=m, t=t: check_dropout(m, t, profile))
                for m in masks
                if m != "dense"
            ]
    return {"passed": all(r["passed"] for r in results), "results": results}


# --- timing -----------------------------------------------------------------------------------------------


def measure(row: Row, fn: Callable[[Tensor, Tensor, Tensor], Tensor], profile: Profile) -> None:
    import triton.testing

    shape = (row.batch, HEADS, row.seq_len, HEAD_DIM)
    q, k, v = (torch.randn(shape, device="cuda", dtype=profile.dtype, requires_grad=True) for _ in range(3))
    grad_out = torch.randn_like(q)
    fn(q, k, v).backward(grad_out)  # compilation and autotuning stay out of the timing

    def bench(step: Callable[[], object]) -> float:
        return triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")

    def fwd_bwd() -> None:
        fn(q, k, v).backward(grad_out)
        q.grad = k.grad = v.grad = None

    row.fwd_ms = bench(lambda: fn(q, k, v))
    row.fwd_bwd_ms = bench(fwd_bwd)
    row.host_ms = host_ms_per_call(fwd_bwd, HOST_CALLS)
    row.gpu_ms = gpu_ms_per_call(fwd_bwd, HOST_CALLS)
    flops = 4 * HEAD_DIM * row.visible_pairs
    row.tflops = {"fwd": flops / row.fwd_ms * 1e-9, "fwd_bwd": 3.5 * flops / row.fwd_bwd_ms * 1e-9}


def bench_row(row: Row, make_fn: Callable[[], Callable], profile: Profile) -> Row:
    try:
        measure(row, make_fn(), profile)
    except torch.OutOfMemoryError as err:
        row.status, row.reason = "oom", str(err).split("\n")[0]
    except Exception as err:  # one provider's failure must not end the sweep
        row.status, row.reason = "error", f"{type(err).__name__}: {err}"[:500]
    gc.collect()
    torch.cuda.empty_cache()
    print(progress(row), flush=True)
    return row


def bench_seq_len(seq_len: int, masks: Sequence[str], providers: Sequence[str], profile: Profile) -> list[Row]:
    batch = max(1, TOKENS_PER_CALL // seq_len)
    rows = []
    for name in masks:
        case = build_case(name, seq_len, batch, profile)
        for provider, dropout in (("flash", 0.0), ("flex", 0.0), ("flash", DROPOUT)):
            if provider not in providers:
                continue
            row = Row(name, provider, seq_len, batch, dropout, case.density, case.visible_pairs)
            make = (lambda c=case, p=dropout: flash_fn(c, p, seq_len, profile.dtype)) if provider == "flash" else (
                lambda c=case: flex_fn(c, seq_len, batch)
            )  # fmt: skip
            rows.append(bench_row(row, make, profile))
    add_ratios(rows)
    return rows


def add_ratios(rows: list[Row]) -> None:
    """x_flex (FlexAttention time / ours, same mask) and x_dense (ours / our dense causal TFLOP/s, same dropout),
    also from the GPU times alone (x_dense_gpu)."""
    ok = {(r.mask, r.provider, r.dropout): r for r in rows if r.status == "ok"}
    for row in rows:
        if row.status != "ok" or row.provider != "flash":
            continue
        flex = ok.get((row.mask, "flex", 0.0))
        if row.dropout == 0.0 and flex is not None:
            row.x_flex = flex.fwd_bwd_ms / row.fwd_bwd_ms
        dense = ok.get(("dense", "flash", row.dropout))
        if dense is not None:
            row.x_dense = row.tflops["fwd_bwd"] / dense.tflops["fwd_bwd"]
            if row.gpu_ms is not None and dense.gpu_ms is not None:
                row.x_dense_gpu = (row.visible_pairs / row.gpu_ms) / (dense.visible_pairs / dense.gpu_ms)


def progress(row: Row) -> str:
    where = f"T={row.seq_len:>6} {row.mask:>12} {row.provider:>5} p={row.dropout}"
    if row.status != "ok":
        return f"{where}: {row.status} ({row.reason})"
    return (
        f"{where}: {row.fwd_bwd_ms:9.3f} ms fwd+bwd ({row.host_ms:.3f} ms host, {_ms(row.gpu_ms)} GPU), "
        f"{row.tflops['fwd_bwd']:6.1f} effective TFLOP/s"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ms"


def markdown_table(rows: Sequence[dict]) -> str:
    """One line per (T, mask): density, fwd+bwd ms (and our host and GPU ms) and effective TFLOP/s of ours /
    FlexAttention / ours with dropout, and the two ratios (the dropout row's x_dense is against our dense kernel with
    dropout). x dense reads "measured (from the GPU times)"; a time that measured the host is marked †."""
    header = ["T", "mask", "density", "ours ms", "ours host / GPU ms", "flex ms", "ours TFLOP/s", "flex TFLOP/s",
              "x flex", "x dense", f"ours p={DROPOUT} ms", f"p={DROPOUT} TFLOP/s", f"p={DROPOUT} x dense"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    keyed = {(r["seq_len"], r["mask"], r["provider"], r["dropout"]): r for r in rows}

    def number(r: dict | None, key: str, digits: int = 2) -> str:
        return "" if r is None or r.get(key) is None else f"{r[key]:.{digits}f}"

    def ms(r: dict | None) -> str:
        if r is None or r["status"] != "ok":
            return "" if r is None else r["status"].upper()
        return f"{r['fwd_bwd_ms']:.2f}" + (" †" if host_bound(r) else "")

    def tflops(r: dict | None) -> str:
        return "" if r is None or r["status"] != "ok" else f"{r['tflops']['fwd_bwd']:.0f}"

    def x_dense(r: dict | None) -> str:
        gpu = number(r, "x_dense_gpu")
        return number(r, "x_dense") + (f" ({gpu})" if gpu else "")

    def host_gpu(r: dict | None) -> str:
        return " / ".join(filter(None, (number(r, "host_ms"), number(r, "gpu_ms"))))

    for seq_len, mask in dict.fromkeys((r["seq_len"], r["mask"]) for r in rows):
        ours, flex = keyed.get((seq_len, mask, "flash", 0.0)), keyed.get((seq_len, mask, "flex", 0.0))
        drop = keyed.get((seq_len, mask, "flash", DROPOUT))
        density = next(r["density"] for r in (ours, flex, drop) if r is not None)
        cells = [str(seq_len), mask, f"{density:.3f}", ms(ours), host_gpu(ours), ms(flex), tflops(ours), tflops(flex),
                 number(ours, "x_flex"), x_dense(ours), ms(drop), tflops(drop), x_dense(drop)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    if any(host_bound(r) for r in rows):
        lines += ["", HOST_BOUND_NOTE]
    return "\n".join(lines)


# --- entry point ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=csv_list(int), default=list(SEQ_LENS), help="comma-separated")
    parser.add_argument("--masks", type=csv_list(str), default=list(MASKS), help=f"from {','.join(MASKS)}")
    parser.add_argument("--providers", type=csv_list(str), default=["flash", "flex"], help="flash,flex")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--out", type=Path, help="JSON path or folder (default results/bench_masks)")
    args = parser.parse_args(argv)
    if unknown := set(args.masks) - set(MASKS):
        parser.error(f"unknown masks {sorted(unknown)}; choose from {list(MASKS)}")
    if unknown := set(args.providers) - {"flash", "flex"}:
        parser.error(f"unknown providers {sorted(unknown)}; choose from flash, flex")
    if "dense" not in args.masks:
        args.masks = ["dense", *args.masks]  # every x_dense ratio needs it
    return args


def out_path(out: Path | None, device: str, date: str) -> Path:
    if out is not None and not out.is_dir():
        return out
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return (out or ROOT / "results" / "bench_masks") / f"{slug}-{date}.json"


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda:  # triton reads it once, when the kernels are defined: before anything imports them
        os.environ.setdefault("TRITON_INTERPRET", "1")
    profile = (
        Profile(
            "cuda",
            torch.bfloat16,
            block_size=128,
            check_seq_len=4096,
            dropout_check_seq_len=1024,
            long_check_seq_len=16384,
            long_dropout_check_seq_len=16384,
        )
        if cuda
        else Profile("cpu", torch.float32, block_size=32, check_seq_len=160, dropout_check_seq_len=96)
    )
    import triton

    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    date = datetime.date.today().isoformat()
    started = time.perf_counter()
    check = run_checks(args.masks, profile, with_flex=cuda and "flex" in args.providers) if args.check else None
    report: dict = {
        "device": device,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": date,
        "command": command_line("bench_masks.py", argv),
        "shape": {"heads": HEADS, "head_dim": HEAD_DIM, "tokens_per_call": TOKENS_PER_CALL, "dtype": "bfloat16"},
        "block_size": profile.block_size,
        "target_density": TARGET_DENSITY,
        "check": check,
        "rows": [],
    }
    path = out_path(args.out, device, date) if cuda or args.out is not None else None

    def write() -> None:  # after the check and after every T, so a job killed at its time limit keeps its rows
        report["seconds"] = round(time.perf_counter() - started, 1)
        if path is not None:
            write_json(path, report)

    write()
    if cuda and not args.check_only:
        for seq_len in args.seq_lens:
            report["rows"] += [asdict(r) for r in bench_seq_len(seq_len, args.masks, args.providers, profile)]
            write()
        print("\n" + markdown_table(report["rows"]))
    print(f"wrote {path}" if path is not None else f"no CUDA: checks only ({report['seconds']} s), nothing written")
    return 0 if check is None or check["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
