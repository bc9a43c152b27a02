"""Benchmark our fused Triton `flash` kernel against PyTorch's attention backends, after checking it.

Method (shared/anchors/h100-attention.md, so numbers compare with the anchors): torch.randn q, k, v of shape
(B, H, T, D), causal, B = 16384 // T, H = 12 for D = 64, 16 for D = 128 and 2048 // D for other head dims;
triton.testing.do_bench(warmup=25, rep=100) median; bwd = (fwd+bwd) - fwd; FLOPs fwd = 4·B·H·T²·D·0.5,
bwd = 2.5·fwd (with the caller's D: padding a head dim is the kernel's cost); memory = peak allocated during one
fwd+bwd above what q, k, v hold.

Host time per call: at a shape whose GPU work is a few microseconds (B=1, H=2, T=128, D=64), the wall time of
many back-to-back calls is what the CPU spends issuing one call (argument checks, autograd, launches): the
cost that bounds short sequences. Measured for flash eager and under torch.compile, and for the SDPA backends.
Each timed row also records the host time of its own fwd+bwd (`host_ms`) and the GPU time of its kernels with the
host out of the picture (`gpu_ms`, `flashgpt.gpu_timing`); where the first nears the second, the row measured the CPU
rather than the GPU, and the tables mark it (`flashgpt.benchmark_tables.host_bound`).
Autograd runs a CUDA backward on its device thread: every timed call hands it over, which wakes another CPU core
(on a VM, often tens of µs or more), where a training step does so once per `backward()`. `--backward-thread
caller` times the rows with the backward on the calling thread, for every provider alike, to tell kernel speed
from that hand-off.

    python scripts/bench_attention.py                      # GPU: correctness check, then the full sweep
    python scripts/bench_attention.py --quick              # GPU: a fast subset
    python scripts/bench_attention.py --check-only         # correctness only; on CPU a tiny fp32 smoke test
    python scripts/bench_attention.py --check-only --head-dims 40,80,96,160,256   # + checks at those head dims
    python scripts/bench_attention.py --out $OUT           # write $OUT/<device-slug>-<date>.json

The check compares o, lse, dq, dk and dv with an fp32 reference (with dropout: under the kernel's own keep-mask, and
its seeds and bias), and repeats `deterministic=True` calls, which must give bit-identical gradients, as must
`torch.use_deterministic_algorithms(True)`.

Without CUDA the kernel runs in Triton's interpreter at tiny fp32 shapes (a smoke path, numbers meaningless).
Exit status: 1 if the correctness check fails, else 0 (unsupported or out-of-memory configs are recorded).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import math
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

# Pure torch, safe to import before TRITON_INTERPRET is set; the kernels are imported when first used.
from flashgpt.attention_reference import recover_keep_mask as recover_dropout_mask
from flashgpt.attention_reference import reference_attention, rel_err
from flashgpt.benchmark_tables import anchors_for, host_bound, markdown_tables, tflops_cell
from flashgpt.command_line import command_line, csv_list, write_json
from flashgpt.gpu_timing import gpu_ms_per_call, host_ms_per_call

ROOT = Path(__file__).resolve().parents[1]
HEADS = {64: 12, 128: 16}  # GPT-2 shape at D = 64; the anchors' choice at D = 128
MODEL_WIDTH = 2048  # H·D at any other head dim, as at D = 128 (and in FlashAttention's own benchmark)
SEQ_LENS = (1024, 2048, 4096, 8192, 16384)
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 1e-3}  # GPU fp32 dots are tf32
# The dropout checks use 32/256: a rate the kernel's 8-bit decisions represent exactly, so the reference's 1/(1 - p)
# is the kernel's keep-scale (other rates are rounded to a multiple of 1/256; tests/test_kernels.py checks that).
CHECK_DROPOUT_P = 0.125
BIAS_RATIO_MAX = 1.5  # dropout mean vs no-dropout, in units of the sampling noise (unbiased -> about 1)

AttentionFn = Callable[[Tensor, Tensor, Tensor, float], Tensor]  # (q, k, v, dropout_p) -> o, causal
Timer = Callable[[Callable[[], object], list[Tensor]], float]  # (fn, tensors whose grads to clear) -> ms


@dataclass(frozen=True)
class CheckCase:
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool
    packed: bool = False  # q, k, v as strided views of one (B, T, 3, H, D) tensor, the way the model calls it
    samples: int | None = None  # compare this many (b, h) slices against the fp32 reference; None: all
    queries: int | None = None  # Tq < Tk = seq_len: the queries are the last `queries` positions; None: Tq = Tk

    def __post_init__(self) -> None:
        if self.queries is not None and (self.packed or not 0 < self.queries <= self.seq_len):
            raise ValueError(f"CheckCase: queries must be in 1..seq_len, unpacked (one qkv tensor has one T): {self}")


@dataclass(frozen=True)
class Profile:
    """What differs between a real GPU run and the CPU smoke path."""

    device: str
    dtype: torch.dtype
    tokens_per_call: int
    seq_lens: tuple[int, ...]
    check_cases: tuple[CheckCase, ...]
    dropout_cases: tuple[CheckCase, ...]
    dropout_seeds: int
    # Seeds of the mask check, one call each on a case's signature: from the third, a call replays its bound
    # launches (`kernels/launch_plans.py`), which must pass each call's seed and offset to every pass.
    mask_seeds: tuple[int, ...] = (1234,)
    determinism_cases: tuple[CheckCase, ...] = ()  # deterministic=True repeated, without and with dropout
    max_heads: int | None = None  # caps heads_for(D) in the timed rows


@dataclass
class Row:
    provider: str
    seq_len: int
    head_dim: int
    heads: int
    batch: int
    dropout: float
    status: str = "ok"  # ok | oom | skipped | error
    reason: str | None = None
    fwd_ms: float | None = None
    fwd_bwd_ms: float | None = None
    peak_extra_gib: float | None = None
    host_ms: float | None = None  # the CPU time to issue one fwd+bwd, calls back to back
    gpu_ms: float | None = None  # the GPU time to run one fwd+bwd, the host out of the picture (CUDA only)
    tflops: dict[str, float] = field(default_factory=dict)  # fwd / bwd / fwd_bwd


# --- providers --------------------------------------------------------------------------------------------


@functools.cache
def _flash_kernel() -> Callable[..., Tensor]:
    from flashgpt.kernels import flash_attention

    return flash_attention


def flash(q: Tensor, k: Tensor, v: Tensor, p: float) -> Tensor:
    return _flash_kernel()(q, k, v, causal=True, dropout_p=p)


def flash_deterministic(q: Tensor, k: Tensor, v: Tensor, p: float) -> Tensor:
    """The backward whose gradients are bit-identical from run to run (7 products instead of 5, no atomics)."""
    return _flash_kernel()(q, k, v, causal=True, dropout_p=p, deterministic=True)


@functools.cache
def _causal_mask(seq_len: int, device: torch.device) -> Tensor:
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(1)


def naive(q: Tensor, k: Tensor, v: Tensor, p: float) -> Tensor:
    """The textbook version: materialised scores, mask, softmax in float, dropout, matmul."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(_causal_mask(q.shape[-2], q.device), float("-inf"))
    prob = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return (F.dropout(prob, p) if p > 0 else prob) @ v


def _sdpa(backend: SDPBackend) -> AttentionFn:
    def run(q: Tensor, k: Tensor, v: Tensor, p: float) -> Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)

    return run


PROVIDERS: dict[str, AttentionFn] = {
    "flash": flash,
    "flash_deterministic": flash_deterministic,
    "sdpa_cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION),
    "sdpa_flash": _sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa_mem_eff": _sdpa(SDPBackend.EFFICIENT_ATTENTION),
    "naive": naive,
}


def heads_for(head_dim: int) -> int:
    return HEADS.get(head_dim, max(1, MODEL_WIDTH // head_dim))


# --- timing -----------------------------------------------------------------------------------------------


def cuda_timer(fn: Callable[[], object], grads: list[Tensor]) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grads, return_mode="median")


def cpu_timer(fn: Callable[[], object], grads: list[Tensor], reps: int = 3) -> float:
    """Median wall time; only exercises the pipeline on machines without CUDA."""
    times = []
    for _ in range(reps):
        for t in grads:
            t.grad = None
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def fwd_flops(batch: int, heads: int, seq_len: int, head_dim: int) -> float:
    return 4 * batch * heads * seq_len**2 * head_dim * 0.5  # causal: half the score matrix


def _run_measuring_peak(run: Callable[[], Tensor], device: str) -> tuple[Tensor, float | None]:
    """`run()` and, on CUDA, its peak allocation in GiB above what was allocated before it."""
    if device != "cuda":
        return run(), None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = run()
    torch.cuda.synchronize()
    return out, (torch.cuda.max_memory_allocated() - base) / 2**30


def _measure(row: Row, fn: AttentionFn, profile: Profile, timer: Timer) -> None:
    shape = (row.batch, row.heads, row.seq_len, row.head_dim)
    q, k, v = (torch.randn(shape, device=profile.device, dtype=profile.dtype, requires_grad=True) for _ in range(3))
    fn(q, k, v, row.dropout).backward(torch.randn_like(q))  # compilation, autotuning, cached masks: not in the peak
    q.grad = k.grad = v.grad = None

    def one_step() -> Tensor:
        grad_out = torch.randn_like(q)  # do counts: one fwd+bwd needs it on top of q, k, v
        fn(q, k, v, row.dropout).backward(grad_out)
        return grad_out

    grad_out, row.peak_extra_gib = _run_measuring_peak(one_step, profile.device)
    row.fwd_ms = timer(lambda: fn(q, k, v, row.dropout), [q, k, v])
    row.fwd_bwd_ms = timer(lambda: fn(q, k, v, row.dropout).backward(grad_out), [q, k, v])

    def issue_fwd_bwd() -> None:  # as the timer calls it, gradients cleared first
        q.grad = k.grad = v.grad = None
        fn(q, k, v, row.dropout).backward(grad_out)

    if profile.device == "cuda":
        row.host_ms = host_ms_per_call(issue_fwd_bwd, HOST_CALLS_PER_ROW)
        row.gpu_ms = gpu_ms_per_call(issue_fwd_bwd, HOST_CALLS_PER_ROW)
    else:  # the interpreter: a smoke test only
        row.host_ms = host_ms_per_call(issue_fwd_bwd, 1)
    flops = fwd_flops(row.batch, row.heads, row.seq_len, row.head_dim)
    bwd_ms = row.fwd_bwd_ms - row.fwd_ms
    row.tflops = {
        "fwd": flops / row.fwd_ms * 1e-9,
        "bwd": 2.5 * flops / bwd_ms * 1e-9 if bwd_ms > 0 else math.nan,
        "fwd_bwd": 3.5 * flops / row.fwd_bwd_ms * 1e-9,
    }


HOST_SHAPE = (1, 2, 128, 64)  # B, H, T, D
HOST_CALLS_PER_ROW = 20  # a timed row's host time: few enough calls that the GPU's launch queue never fills
HOST_PROVIDERS = ("flash", "sdpa_cudnn", "sdpa_flash", "sdpa_mem_eff")


def host_overhead(providers: Sequence[str], profile: Profile, calls: int) -> list[dict]:
    """Microseconds of host time per fwd (no grad) and per fwd+bwd call, each provider at HOST_SHAPE; flash also
    compiled (fullgraph), the way train.py's compile=true calls it."""
    variants: dict[str, AttentionFn] = {name: PROVIDERS[name] for name in providers if name in HOST_PROVIDERS}
    if "flash" in variants and profile.device == "cuda":
        torch._dynamo.reset()
        kernel = _flash_kernel()  # outside the compiled function: dynamo does not trace through the cache wrapper
        compiled = torch.compile(lambda q, k, v, p: kernel(q, k, v, causal=True, dropout_p=p), fullgraph=True)
        variants["flash (torch.compile)"] = compiled
    q, k, v = (torch.randn(HOST_SHAPE, device=profile.device, dtype=profile.dtype, requires_grad=True) for _ in "qkv")
    grad_out = torch.randn_like(q)
    results = []
    for name, fn in variants.items():
        result: dict = {"provider": name, "shape": list(HOST_SHAPE)}
        try:

            def forward(fn=fn) -> None:
                with torch.no_grad():
                    fn(q, k, v, 0.0)

            def forward_backward(fn=fn) -> None:
                torch.autograd.grad(fn(q, k, v, 0.0), (q, k, v), grad_out)  # no accumulation into .grad

            result["fwd_us"] = host_ms_per_call(forward, calls) * 1e3
            result["fwd_bwd_us"] = host_ms_per_call(forward_backward, calls) * 1e3
        except RuntimeError as err:
            result["status"] = "skipped" if _is_unsupported(err) else "error"
            result["reason"] = str(err)[:300]
        results.append(result)
        print(f"host time {name:>22}: " + _host_cell(result), flush=True)
    torch._dynamo.reset()
    return results


def _host_cell(result: dict) -> str:
    if "fwd_bwd_us" not in result:
        return result["status"]
    return f"fwd {result['fwd_us']:.0f} us, fwd+bwd {result['fwd_bwd_us']:.0f} us"


def _is_unsupported(err: RuntimeError) -> bool:
    return bool(re.search(r"No available kernel|No viable backend", str(err)))


def bench_row(row: Row, profile: Profile, timer: Timer) -> Row:
    """Fills `row`; an unsupported config or an out-of-memory is recorded on it, never raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # SDPA explains a refused backend only through warnings
        try:
            _measure(row, PROVIDERS[row.provider], profile, timer)
        except torch.OutOfMemoryError as err:
            row.status, row.reason = "oom", str(err).split("\n")[0]
        except RuntimeError as err:
            unsupported = _is_unsupported(err)
            why = " ".join(str(w.message) for w in caught) if unsupported else ""
            row.status, row.reason = ("skipped" if unsupported else "error"), f"{err} {why}".strip()[:500]
        except Exception as err:  # one provider's failure must not end the sweep
            row.status, row.reason = "error", f"{type(err).__name__}: {err}"[:500]
    if row.status != "ok":
        row.tflops, row.fwd_ms, row.fwd_bwd_ms, row.peak_extra_gib, row.host_ms, row.gpu_ms = {}, *[None] * 5
    gc.collect()  # the traceback held the failed config's tensors
    if profile.device == "cuda":
        torch.cuda.empty_cache()
    return row


def bench_rows(args: argparse.Namespace, profile: Profile, timer: Timer) -> Iterator[Row]:
    for head_dim in args.head_dims:
        for p in args.dropout:
            for seq_len in args.seq_lens:
                for provider in args.provider:
                    batch = max(1, profile.tokens_per_call // seq_len)
                    heads = min(heads_for(head_dim), profile.max_heads or heads_for(head_dim))
                    row = Row(provider, seq_len, head_dim, heads, batch, p)
                    yield bench_row(row, profile, timer)


def _progress(row: Row) -> str:
    where = f"{row.provider:>12} D={row.head_dim} p={row.dropout} T={row.seq_len:>5}"
    if row.status != "ok":
        return f"{where}: {row.status} ({row.reason})"
    mem = f", {row.peak_extra_gib:.2f} GiB" if row.peak_extra_gib is not None else ""
    gpu = f", GPU {row.gpu_ms:.3f}" if row.gpu_ms is not None else ""
    bound = ", host-bound" if host_bound(asdict(row)) else ""
    host = f" (host {row.host_ms:.3f}{gpu} of {row.fwd_bwd_ms:.3f} ms{bound})"
    return f"{where}: {tflops_cell(row.tflops)} TFLOP/s{mem}{host}"


# --- correctness ------------------------------------------------------------------------------------------


def _inputs(case: CheckCase, profile: Profile) -> tuple[Tensor, Tensor, Tensor]:
    b, h, t, d = case.batch, case.heads, case.seq_len, case.head_dim
    opts = {"device": profile.device, "dtype": profile.dtype}
    if case.packed:
        qkv = torch.randn(b, t, 3, h, d, **opts).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D), strided
        return tuple(x.detach().requires_grad_() for x in qkv.unbind(0))
    rows = (case.queries or t, t, t)
    return tuple(torch.randn(b, h, n, d, **opts, requires_grad=True) for n in rows)


def _slices(case: CheckCase) -> list[tuple[int, int]]:
    """(b, h) pairs to compare: all, or first / last / spread between, to keep fp32 T x T memory sane."""
    pairs = [(b, h) for b in range(case.batch) for h in range(case.heads)]
    if case.samples is None or case.samples >= len(pairs):
        return pairs
    step = (len(pairs) - 1) / max(1, case.samples - 1)
    return [pairs[round(i * step)] for i in range(case.samples)]


def _reference_grads(
    q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, causal: bool, keep: Tensor | None, p: float
) -> dict[str, Tensor]:
    from flashgpt.kernels.dropout import keep_scale  # with the kernels, once TRITON_INTERPRET is decided

    leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
    o, lse = reference_attention(*leaves, causal=causal, keep=keep, keep_scale=keep_scale(p), dtype=torch.float32)
    o.backward(grad_out.float())
    return {
        "o": o.detach(),
        "lse": lse.detach(),
        **{f"d{n}": x.grad for n, x in zip("qkv", leaves, strict=True)},
    }


def _errors(got: dict[str, list[Tensor]], want: dict[str, list[Tensor]], dtype: torch.dtype) -> dict:
    errors = {name: rel_err(torch.stack(got[name]), torch.stack(want[name])) for name in got}
    return {"rel_err": errors, "passed": all(e <= TOLERANCE[dtype] for e in errors.values())}


def check_case(case: CheckCase, profile: Profile) -> dict:
    """bf16 (or fp32) flash vs an fp32 reference: o, lse, dq, dk, dv over sampled (b, h) slices."""
    q, k, v = _inputs(case, profile)
    kernel = _flash_kernel()
    o = kernel(q, k, v, causal=case.causal)
    grad_out = torch.randn_like(o)
    o.backward(grad_out)
    with torch.no_grad():
        _, lse = kernel(q, k, v, causal=case.causal, return_lse=True)
    flash_out = {"o": o.detach(), "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    got: dict[str, list[Tensor]] = {n: [] for n in flash_out}
    want: dict[str, list[Tensor]] = {n: [] for n in flash_out}
    for b, h in _slices(case):
        ref = _reference_grads(q[b, h], k[b, h], v[b, h], grad_out[b, h], case.causal, None, 0.0)
        for name, tensor in flash_out.items():
            got[name].append(tensor[b, h])
            want[name].append(ref[name])
    return {"case": asdict(case), **_errors(got, want, profile.dtype)}


def _seeded(seed: int, fn: Callable[[], Tensor]) -> Tensor:
    torch.manual_seed(seed)  # assumption: the kernel draws its dropout seed from torch's RNG
    return fn()


def recover_keep_mask(case: CheckCase, profile: Profile, p: float, seed: int) -> Tensor:
    """The kernel's dropout mask (B, H, T, T) for `seed` (`attention_reference.recover_keep_mask`)."""
    shape = (case.batch, case.heads, case.seq_len, case.head_dim)
    attend = functools.partial(_flash_kernel(), causal=case.causal, dropout_p=p)
    return recover_dropout_mask(attend, shape, case.seq_len, seed, device=profile.device, dtype=profile.dtype)


def _keep_rate(keep: Tensor, causal: bool, p: float) -> tuple[float, bool]:
    """Share of kept allowed entries, and whether it is within 6 sigma of 1 - p."""
    t = keep.shape[-1]
    allowed = ~_causal_mask(t, keep.device) if causal else torch.ones(t, t, dtype=torch.bool, device=keep.device)
    n = allowed.sum().item() * keep.shape[0] * keep.shape[1]
    rate = (keep & allowed).sum().item() / n
    return rate, abs(rate - (1 - p)) <= 6 * math.sqrt(p * (1 - p) / n)


def check_dropout_mask(case: CheckCase, profile: Profile, p: float, seed: int) -> dict:
    """Forward and backward with dropout vs the fp32 reference under the kernel's own (recovered) mask, through
    both backwards: the default one (fused where the table takes it) and the deterministic one (split; "_det")."""
    keep = recover_keep_mask(case, profile, p, seed)
    inputs = _inputs(case, profile)
    got: dict[str, list[Tensor]] = {}
    grad_out = None
    for suffix, deterministic in (("", False), ("_det", True)):
        q, k, v = (x.detach().requires_grad_() for x in inputs)
        attend = functools.partial(
            _flash_kernel(), q, k, v, causal=case.causal, dropout_p=p, deterministic=deterministic
        )
        o = _seeded(seed, attend)
        grad_out = torch.randn_like(o) if grad_out is None else grad_out
        o.backward(grad_out)
        got |= {f"o{suffix}": [o.detach()], f"dq{suffix}": [q.grad], f"dk{suffix}": [k.grad], f"dv{suffix}": [v.grad]}
    ref = _reference_grads(*inputs, grad_out, case.causal, keep, p)
    result = _errors(got, {n: [ref[n.removesuffix("_det")]] for n in got}, profile.dtype)
    rate, rate_ok = _keep_rate(keep, case.causal, p)
    per_head = keep.flatten(0, 1).flatten(1)
    distinct = torch.unique(per_head, dim=0).shape[0] == per_head.shape[0]  # no (b, h) reuses another's mask
    passed = result["passed"] and rate_ok and distinct
    return {**result, "keep_rate": rate, "heads_differ": distinct, "passed": passed}


def check_dropout_seeds(case: CheckCase, profile: Profile, p: float, n_seeds: int) -> dict:
    """Same seed -> same output; another seed or the next call -> different; mean over seeds -> no dropout."""
    q, k, v = (x.detach() for x in _inputs(case, profile))
    run = functools.partial(_flash_kernel(), q, k, v, causal=case.causal)
    with torch.no_grad():
        first = _seeded(0, lambda: run(dropout_p=p))
        following = run(dropout_p=p)
        again = _seeded(0, lambda: run(dropout_p=p))
        exact = run(dropout_p=0.0).float()
        samples = torch.stack([_seeded(s, lambda: run(dropout_p=p)).float() for s in range(1, n_seeds + 1)])
    # E|mean - exact|^2 = sum(var) / n when unbiased; the eps term absorbs rounding of low-precision outputs
    noise = samples.var(0).sum() / n_seeds + ((torch.finfo(profile.dtype).eps * exact) ** 2).sum()
    ratio = (((samples.mean(0) - exact) ** 2).sum() / noise).item()
    flags = {
        "same_seed_equal": torch.equal(first, again),
        "next_call_differs": not torch.equal(first, following),
        "other_seed_differs": not torch.equal(first, samples[0].to(first.dtype)),
    }
    return {**flags, "bias_ratio": ratio, "passed": all(flags.values()) and ratio <= BIAS_RATIO_MAX}


def check_deterministic_repeats(case: CheckCase, profile: Profile, p: float, seed: int = 1234) -> dict:
    """`deterministic=True` gives bit-identical dq, dk, dv from call to call (with dropout, under one seed), and
    `torch.use_deterministic_algorithms(True)` takes the same backward when `deterministic` is left as None."""
    inputs = _inputs(case, profile)
    grad_out = torch.randn_like(inputs[0])

    def grads(deterministic: bool | None) -> list[Tensor]:
        q, k, v = (x.detach().requires_grad_() for x in inputs)
        attend = functools.partial(
            _flash_kernel(), q, k, v, causal=case.causal, dropout_p=p, deterministic=deterministic
        )
        _seeded(seed, attend).backward(grad_out)
        return [q.grad, k.grad, v.grad]

    first, again = grads(True), grads(True)
    enabled, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn_only: the check's own ops may have no such mode
    try:
        by_flag = grads(None)
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    flags = {
        "repeat_equal": all(map(torch.equal, first, again)),
        "torch_flag_equal": all(map(torch.equal, first, by_flag)),
    }
    return {**flags, "passed": all(flags.values())}


def _guarded(name: str, fn: Callable[[], dict]) -> dict:
    """A check that raises is a failed check with its reason, not a crash."""
    try:
        result = fn()
    except Exception as err:
        result = {"passed": False, "error": f"{type(err).__name__}: {err}"[:500]}
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    print(f"check {name}: {'ok' if result['passed'] else 'FAILED'} {_brief(result)}", flush=True)
    return {"name": name, **result}


def _brief(result: dict) -> str:
    parts = [f"{n}={e:.1e}" for n, e in result.get("rel_err", {}).items()]
    flags = ("heads_differ", "same_seed_equal", "next_call_differs", "other_seed_differs", "repeat_equal",
             "torch_flag_equal", "error")  # fmt: skip
    parts += [f"{n}={result[n]:.3g}" for n in ("keep_rate", "bias_ratio") if n in result]
    parts += [f"{n}={result[n]}" for n in flags if n in result]
    return " ".join(parts)


def _case_name(case: CheckCase) -> str:
    layout = ", packed qkv" if case.packed else ""
    queries = f" Tq={case.queries}" if case.queries else ""
    shape = f"B={case.batch} H={case.heads} T={case.seq_len}{queries} D={case.head_dim}"
    return f"{'causal' if case.causal else 'full'} {shape}{layout}"


def run_checks(profile: Profile, p: float = CHECK_DROPOUT_P) -> dict:
    torch.set_float32_matmul_precision("highest")  # the reference must be real fp32, not tf32
    results = [_guarded(_case_name(c), lambda c=c: check_case(c, profile)) for c in profile.check_cases]
    for c in profile.dropout_cases:
        name = f"dropout {p} {_case_name(c)}"
        for seed in profile.mask_seeds:
            check = functools.partial(check_dropout_mask, c, profile, p, seed)
            results.append(_guarded(f"{name}: mask, seed {seed}", check))
        results.append(
            _guarded(f"{name}: seeds", lambda c=c: check_dropout_seeds(c, profile, p, profile.dropout_seeds))
        )
    for c in profile.determinism_cases:
        for drop in (0.0, p):
            check = functools.partial(check_deterministic_repeats, c, profile, drop)
            results.append(_guarded(f"deterministic, dropout {drop}, {_case_name(c)}: repeated", check))
    return {"passed": all(r["passed"] for r in results), "dtype": str(profile.dtype), "results": results}


# --- entry point ------------------------------------------------------------------------------------------


def _extra_head_dim_cases(head_dims: Sequence[int], seq_len: int, heads: int) -> tuple[list, list]:
    """Check cases for head dims other than 64 and 128 (the padded ones, 256, ...): causal with a ragged T and
    packed qkv, full attention, and dropout."""
    extra = [d for d in head_dims if d not in HEADS]
    cases = [c for d in extra for c in (CheckCase(2, heads, seq_len - 24, d, causal=True, packed=True),
                                       CheckCase(2, heads, seq_len, d, causal=False))]  # fmt: skip
    return cases, [CheckCase(1, 2, min(seq_len, 256), d, causal=True) for d in extra]


def gpu_profile(quick: bool, head_dims: Sequence[int]) -> Profile:
    cases = [
        CheckCase(4, 12, 1024, 64, causal=True),
        CheckCase(4, 12, 1024, 64, causal=False),
        CheckCase(2, 16, 1024, 128, causal=True, packed=True),
        CheckCase(2, 16, 1024, 128, causal=False, packed=True),
        CheckCase(2, 12, 1000, 64, causal=True),  # T not a multiple of any block size
        CheckCase(4, 12, 4096, 64, causal=True, packed=True, samples=3),
        CheckCase(2, 12, 3000, 64, causal=True, samples=3),  # ragged, through the fused backward's dQ warpgroup
        CheckCase(1, 12, 16384, 64, causal=True, samples=2),
        CheckCase(1, 12, 16384, 64, causal=False, samples=2),
        CheckCase(1, 16, 16384, 128, causal=True, samples=2),
        CheckCase(2, 16, 4096, 128, causal=True, packed=True, samples=2),  # the Gluon passes on packed qkv
        CheckCase(2, 12, 4096, 64, causal=True, samples=3, queries=3000),  # Tq < Tk: the causal diagonal shifted
    ]
    dropout = [
        CheckCase(2, 4, 256, 64, causal=True),
        CheckCase(1, 2, 1024, 128, causal=False),
        CheckCase(1, 2, 1000, 64, causal=True),
        CheckCase(2, 4, 2048, 64, causal=True),  # the Gluon fused backward with dropout (deterministic: dQ, dK/dV)
        CheckCase(1, 4, 2048, 128, causal=True, packed=True),  # the same at D = 128, on packed qkv
        CheckCase(1, 4, 4000, 64, causal=True),  # ragged, through the fused backward's dQ warpgroup with dropout
    ]
    extra_cases, extra_dropout = _extra_head_dim_cases(head_dims, 1024, 8)
    return Profile(
        device="cuda",
        dtype=torch.bfloat16,
        tokens_per_call=16384,
        seq_lens=(1024, 4096) if quick else SEQ_LENS,
        check_cases=tuple((cases[:5] if quick else cases) + extra_cases),
        dropout_cases=tuple((dropout[:1] if quick else dropout) + extra_dropout),
        dropout_seeds=64,
        mask_seeds=(1234, 1235, 1236),
        determinism_cases=(  # dense, ragged, packed: the split passes that deterministic=True takes everywhere
            CheckCase(2, 12, 4096, 64, causal=True),
            CheckCase(1, 12, 3000, 64, causal=True),
            CheckCase(1, 16, 4096, 128, causal=True, packed=True),
        ),
    )


def cpu_profile(head_dims: Sequence[int] = ()) -> Profile:
    """Triton's interpreter is slow (seconds per call at T = 256): tiny shapes, fp32."""
    extra_cases, extra_dropout = _extra_head_dim_cases(head_dims, 64, 2)
    return Profile(
        device="cpu",
        dtype=torch.float32,
        tokens_per_call=256,
        seq_lens=(64, 128),
        check_cases=(
            CheckCase(2, 2, 128, 64, causal=True),
            CheckCase(2, 2, 128, 64, causal=False),
            CheckCase(1, 2, 100, 64, causal=True, packed=True),
            CheckCase(1, 2, 96, 64, causal=True, queries=40),
            *extra_cases,
        ),
        dropout_cases=(CheckCase(2, 2, 64, 64, causal=True), *extra_dropout),
        dropout_seeds=32,
        determinism_cases=(CheckCase(1, 2, 80, 64, causal=True),),
        max_heads=2,
    )


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", type=csv_list(str), default=list(PROVIDERS), help="comma-separated")
    parser.add_argument("--seq-lens", type=csv_list(int), help="default 1024..16384 (--quick: 1K, 4K; CPU: 64, 128)")
    parser.add_argument(
        "--head-dims", type=csv_list(int), help="multiples of 8 from 16 to 256; default 64,128 (--quick: 64)"
    )
    parser.add_argument("--dropout", type=csv_list(float), help="default 0,0.1 (--quick: 0)")
    parser.add_argument("--quick", action="store_true", help="a fast subset of configs and checks")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument(
        "--host-calls", type=int, default=200, help="calls per host-time measurement (0: skip it; CPU: 1)"
    )
    parser.add_argument(
        "--backward-thread",
        choices=("device", "caller"),
        default="device",
        help="where autograd runs the timed rows' backward: on its device thread (the default, as in training) or on "
        "the calling thread, which spares each call the hand-off to another CPU core",
    )
    parser.add_argument("--out", type=Path, help="JSON path or folder (default results/bench_attention)")
    args = parser.parse_args(argv)
    args.head_dims = args.head_dims or ([64] if args.quick else list(HEADS))
    args.dropout = args.dropout or ([0.0] if args.quick else [0.0, 0.1])
    if unknown := set(args.provider) - set(PROVIDERS):
        parser.error(f"unknown providers {sorted(unknown)}; choose from {list(PROVIDERS)}")
    if unsupported := sorted(d for d in args.head_dims if d % 8 or not 16 <= d <= 256):
        parser.error(f"unsupported head dims {unsupported}; the kernel takes multiples of 8 from 16 to 256")
    return args


def device_name() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def out_path(out: Path | None, name: str, date: str) -> Path:
    """--out as given, or <device-slug>-<date>.json in it when it is a folder (default results/bench_attention)."""
    if out is not None and not out.is_dir():
        return out
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return (out or ROOT / "results" / "bench_attention") / f"{slug}-{date}.json"


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda:  # triton reads it once, at its own import: before anything imports triton or kernels
        os.environ.setdefault("TRITON_INTERPRET", "1")
    profile = gpu_profile(args.quick, args.head_dims) if cuda else cpu_profile(args.head_dims)
    args.seq_lens = args.seq_lens or list(profile.seq_lens)
    name, date = device_name(), datetime.date.today().isoformat()
    import triton

    out = out_path(args.out, name, date)
    report: dict = {
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": date,
        "command": command_line("bench_attention.py", argv),
        "dtype": str(profile.dtype),
        "tokens_per_call": profile.tokens_per_call,
        "complete": False,  # rewritten after the check and every row: a killed job keeps what it measured
        "check": run_checks(profile) if args.check or args.check_only else None,
        "host_overhead": None,
        "backward_thread": args.backward_thread,
        "rows": [],
    }
    write_json(out, report)
    if not args.check_only and args.host_calls > 0:
        calls = args.host_calls if cuda else 1  # the interpreter: a smoke test only
        report["host_overhead"] = host_overhead(args.provider, profile, calls)
        write_json(out, report)
    if not args.check_only:
        with torch.autograd.set_multithreading_enabled(args.backward_thread == "device"):
            for row in bench_rows(args, profile, cuda_timer if cuda else cpu_timer):
                print(_progress(row), flush=True)
                report["rows"].append(asdict(row))
                write_json(out, report)
        print("\n" + markdown_tables(report["rows"], anchors_for(name, str(profile.dtype), profile.tokens_per_call)))
    report["complete"] = True
    write_json(out, report)
    print(f"wrote {out}")
    failed = report["check"] is not None and not report["check"]["passed"]
    if failed:
        print("CORRECTNESS CHECK FAILED (see 'check' in the JSON)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
