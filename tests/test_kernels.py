"""The Triton FlashAttention kernel against a float64 reference, through the Triton interpreter.

Every check draws fresh random inputs (its seed is in the failure message); shapes are small because the
interpreter runs each tile as numpy operations.
"""

import math
import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flashgpt.attention_reference import lse_err, reference_attention, rel_err
from flashgpt.attention_reference import recover_keep_mask as recover_dropout_mask
from flashgpt.kernels import attention_op, flash_attention
from flashgpt.kernels.dropout import (
    dropout_keep_mask,
    dropout_keep_mask_t,
    effective_dropout_p,
    keep_scale,
    keep_threshold,
)

FP32_TOL = 1e-5  # the interpreter's fp32 products are exact; what remains is summation order
LOW_PRECISION_TOL = 2e-2  # bf16/fp16 inputs, outputs and probabilities rounded to 8/11 mantissa bits


@pytest.fixture
def seed() -> int:
    """A fresh seed for every check, printed on failure so any failure can be replayed."""
    value = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(value)
    return value


def make_qkv(batch: int, heads: int, seq_len: int, head_dim: int, layout: str, dtype=torch.float32):
    """q, k, v of shape (B, H, T, D): contiguous, views of a fused qkv projection, or with a non-unit D stride."""
    if layout == "contiguous":
        tensors = [torch.randn(batch, heads, seq_len, head_dim, dtype=dtype) for _ in range(3)]
    elif layout == "fused_qkv":
        qkv = torch.randn(batch, seq_len, 3, heads, head_dim, dtype=dtype)
        tensors = [qkv[:, :, i].transpose(1, 2) for i in range(3)]
    elif layout == "transposed_d":
        tensors = [torch.randn(batch, heads, head_dim, seq_len, dtype=dtype).transpose(-1, -2) for _ in range(3)]
    else:
        raise ValueError(layout)
    return [t.requires_grad_() for t in tensors]


def check_against_reference(q, k, v, *, causal: bool, tol: float, seed: int, scale: float | None = None):
    o, lse = flash_attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True)
    do = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)

    ref_o, ref_lse = reference_attention(q, k, v, causal=causal, scale=scale)
    ref_dq, ref_dk, ref_dv = torch.autograd.grad(ref_o, (q, k, v), do.double())

    assert o.dtype == q.dtype and o.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:3]
    for name, got, want in (("o", o, ref_o), ("lse", lse, ref_lse), ("dq", dq, ref_dq), ("dk", dk, ref_dk),
                            ("dv", dv, ref_dv)):  # fmt: skip
        assert torch.isfinite(got).all(), f"{name} has non-finite values (seed {seed})"
        err = lse_err(got, want) if name == "lse" else rel_err(got, want)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol} (seed {seed}, shape {tuple(q.shape)})"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("seq_len", [1, 17, 64, 77, 200])
def test_matches_float64_reference(seq_len, head_dim, causal, seed):
    q, k, v = make_qkv(1, 2, seq_len, head_dim, "contiguous")
    check_against_reference(q, k, v, causal=causal, tol=FP32_TOL, seed=seed)


@pytest.mark.parametrize("layout", ["fused_qkv", "transposed_d"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("seq_len", [77, 200])
def test_strided_inputs(seq_len, causal, layout, seed):
    q, k, v = make_qkv(2, 3, seq_len, 64, layout)
    assert not q.is_contiguous()
    check_against_reference(q, k, v, causal=causal, tol=FP32_TOL, seed=seed)


# Every multiple of 8 up to 256 runs: 16/32/64/128/256 natively, the others zero-padded to the next of those.
@pytest.mark.parametrize(
    ("head_dim", "seq_len", "causal"),
    [(16, 50, True), (24, 33, False), (40, 70, True), (48, 33, False), (80, 45, True), (96, 33, False),
     (160, 40, True), (200, 17, False), (256, 36, True), (256, 20, False)],
)  # fmt: skip
def test_head_dims(head_dim, seq_len, causal, seed):
    q, k, v = make_qkv(1, 2, seq_len, head_dim, "fused_qkv")
    check_against_reference(q, k, v, causal=causal, tol=FP32_TOL, seed=seed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_padded_head_dim_low_precision(dtype, seed):
    q, k, v = make_qkv(1, 2, 40, 80, "contiguous", dtype=dtype)
    check_against_reference(q, k, v, causal=True, tol=LOW_PRECISION_TOL, seed=seed)


# The forward scales mask-free tiles' scores inside the exponent and takes the row max before scaling, which needs a
# scale >= 0: a negative one runs as (−q)·kᵀ·|scale|, and 0 gives uniform attention.
@pytest.mark.parametrize("scale", [0.3, -0.7, 0.0])
def test_custom_softmax_scale(scale, seed):
    q, k, v = make_qkv(1, 2, 77, 32, "contiguous")
    check_against_reference(q, k, v, causal=True, scale=scale, tol=FP32_TOL, seed=seed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(dtype, seed):
    q, k, v = make_qkv(1, 2, 100, 64, "fused_qkv", dtype=dtype)
    check_against_reference(q, k, v, causal=True, tol=LOW_PRECISION_TOL, seed=seed)


# The backward's exp2 overflows to inf on masked entries before the mask zeroes them; numpy says so.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")
def test_large_logits_stay_finite(seed):
    """Online softmax must not overflow where a naive exp would (scores ~ 1e4). Only the forward is compared:
    with near one-hot probabilities the score gradients are pure cancellation, ill-conditioned in any precision."""
    q, k, v = make_qkv(1, 2, 77, 32, "contiguous")
    q, k = q.detach() * 100.0, k.detach() * 100.0
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    ref_o, ref_lse = reference_attention(q, k, v, causal=True)
    assert rel_err(o, ref_o) < 1e-4 and rel_err(lse, ref_lse) < 1e-6, f"seed {seed}"
    grads = torch.autograd.grad(o.sum(), v)
    assert torch.isfinite(grads[0]).all()


# ----------------------------------------------------------------------------------------------------------
# Dropout


@triton.jit
def _keep_mask_kernel(out, seed, offset_lo, offset_hi, bh, n_rows, seq_len, threshold, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, KEY_MAJOR: tl.constexpr):  # fmt: skip
    """Writes the keep-mask of rows [0, n_rows) and columns [0, seq_len), tile by tile, drawn query-major
    (`dropout_keep_mask`, the forward's and dQ's) or key-major (`dropout_keep_mask_t`, the dK/dV pass's)."""
    start_m = tl.program_id(0) * BLOCK_M
    start_n = tl.program_id(1) * BLOCK_N
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    rng = (seed, offset_lo, offset_hi, bh, threshold)
    inside = (offs_m[:, None] < n_rows) & (offs_n[None, :] < seq_len)
    if KEY_MAJOR:
        keep = tl.trans(dropout_keep_mask_t(rng, start_m, start_n, seq_len, BLOCK_M, BLOCK_N))
    else:
        keep = dropout_keep_mask(rng, start_m, start_n, seq_len, BLOCK_M, BLOCK_N)
    tl.store(out + offs_m[:, None] * seq_len + offs_n[None, :], keep.to(tl.int8), mask=inside)


def philox4x32(counter: list[np.ndarray], key: tuple[int, int], rounds: int = 7) -> list[np.ndarray]:
    """Philox-4x32 as published (Salmon et al., SC 2011): the independent reference for the kernel's draws."""
    c0, c1, c2, c3 = (c.astype(np.uint64) for c in counter)
    k0, k1 = key
    low = np.uint64(0xFFFFFFFF)
    for _ in range(rounds):
        p0, p2 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2  # 32 x 32 -> 64-bit products
        c0, c1, c2, c3 = (
            (p2 >> np.uint64(32)) ^ c1 ^ np.uint64(k0),
            p2 & low,
            (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1),
            p0 & low,
        )
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return [c0, c1, c2, c3]


def reference_keep_mask(seed: int, offset: int, bh: int, n_rows: int, seq_len: int, threshold: int) -> torch.Tensor:
    """The layout dropout.py documents: element (m, n) takes byte b = 8·((n % 16) // 8) + 2·((m % 32) // 8) + m % 2
    of draw ((m // 32)·4 + (m % 8) // 2)·⌈T/16⌉·8 + (n // 16)·8 + n % 8, i.e. byte b % 4 of word b // 4."""
    rows, cols = np.meshgrid(np.arange(n_rows), np.arange(seq_len), indexing="ij")
    counter = ((rows // 32) * 4 + (rows % 8) // 2) * ((seq_len + 15) // 16 * 8) + (cols // 16) * 8 + cols % 8
    fill = np.ones_like(counter)
    words = philox4x32([counter, fill * bh, fill * (offset & 0xFFFFFFFF), fill * (offset >> 32)],
                       (seed & 0xFFFFFFFF, seed >> 32))  # fmt: skip
    b = 8 * ((cols % 16) // 8) + 2 * ((rows % 32) // 8) + rows % 2
    word = np.choose(b // 4, words)
    byte = (word >> (8 * (b % 4)).astype(np.uint64)) & np.uint64(0xFF)
    return torch.from_numpy(byte >= threshold)


@pytest.mark.parametrize("key_major", [False, True], ids=["query-major", "key-major"])
@pytest.mark.parametrize("tile", [(16, 16), (32, 64), (64, 32), (128, 16)], ids=str)
def test_keep_mask_is_the_documented_philox_layout(tile, key_major, seed):
    """Every tile shape the kernels launch with, in either orientation, yields the same mask, and it is the
    documented one."""
    rng = np.random.default_rng(seed)
    draw_seed, offset, bh = (int(x) for x in rng.integers(0, 2**62, 3))
    bh %= 1000
    n_rows, seq_len, threshold = 70, 90, keep_threshold(0.3)
    out = torch.empty(n_rows, seq_len, dtype=torch.int8)
    grid = (triton.cdiv(n_rows, tile[0]), triton.cdiv(seq_len, tile[1]))
    _keep_mask_kernel[grid](
        out, draw_seed, offset & 0xFFFFFFFF, offset >> 32, bh, n_rows, seq_len, threshold, *tile, key_major
    )
    expected = reference_keep_mask(draw_seed, offset, bh, n_rows, seq_len, threshold)
    assert torch.equal(out.bool(), expected), f"seed {seed}"


def recover_keep_mask(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool, p: float, rng_seed: int):
    """The kernel's keep-mask for the call made right after torch.manual_seed(rng_seed) (`recover_dropout_mask`),
    which never keeps a probability above the causal diagonal."""
    keep = recover_dropout_mask(
        lambda q, k, v: flash_attention(q, k, v, causal=causal, dropout_p=p), (batch, heads, seq_len, head_dim),
        seq_len, rng_seed,
    )  # fmt: skip
    if causal:
        assert not keep.triu(1).any(), "dropout kept a probability above the diagonal"
    return keep


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("seq_len", [17, 77])
def test_backward_uses_the_forward_mask(seq_len, causal, seed):
    """o and dq, dk, dv equal the float64 reference under the recovered mask, so forward and backward agree."""
    p, rng_seed = 0.3, seed
    keep = recover_keep_mask(2, 2, seq_len, 128, causal, p, rng_seed)
    q, k, v = make_qkv(2, 2, seq_len, 128, "fused_qkv")

    torch.manual_seed(rng_seed)
    o = flash_attention(q, k, v, causal=causal, dropout_p=p)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)

    ref_o, _ = reference_attention(q, k, v, causal=causal, keep=keep, keep_scale=keep_scale(p))
    ref_grads = torch.autograd.grad(ref_o, (q, k, v), do.double())
    assert rel_err(o, ref_o) < FP32_TOL, f"seed {seed}"
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True):
        assert rel_err(got, want) < FP32_TOL, f"{name} disagrees with the forward's mask (seed {seed})"


def test_dropout_is_reproducible_from_the_seed(seed):
    q, k, v = make_qkv(1, 2, 64, 32, "contiguous")

    def run(rng_seed: int):
        torch.manual_seed(rng_seed)
        o = flash_attention(q, k, v, dropout_p=0.2)
        return (o, *torch.autograd.grad(o.sum(), (q, k, v)))

    first, again, other = run(seed), run(seed), run(seed + 1)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b), f"same seed, different result (seed {seed})"
    assert not torch.equal(first[0], other[0]), f"different seeds gave the same output (seed {seed})"
    # Consecutive calls draw fresh masks.
    torch.manual_seed(seed)
    o1 = flash_attention(q, k, v, dropout_p=0.2)
    o2 = flash_attention(q, k, v, dropout_p=0.2)
    assert not torch.equal(o1, o2)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_drop_fraction(p, seed):
    """Over ~100K visible entries the dropped fraction is the effective rate within 5 standard deviations."""
    keep = recover_keep_mask(2, 4, 128, 128, False, p, seed)
    p = effective_dropout_p(p)
    n = keep.numel()
    dropped = 1.0 - keep.double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(dropped - p) < 5 * sigma, f"dropped {dropped:.5f}, expected {p} ± {5 * sigma:.5f} (seed {seed})"
    # Sixteen neighbouring columns come from one Philox draw: columns 1 apart share a 32-bit word, 4 apart share
    # the draw, 16 apart come from the next draw. Each pair must still be independent.
    for gap in (1, 4, 16):
        first, second = keep[..., : 128 - gap], keep[..., gap:]
        both_kept = (first & second).double().mean().item()
        sigma = math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / first.numel())
        assert abs(both_kept - (1 - p) ** 2) < 6 * sigma, f"columns {gap} apart are correlated (seed {seed})"


def test_dropout_rate_rounding():
    """Rates are multiples of 1/256, the kept values scaled by the exact inverse keep probability."""
    assert effective_dropout_p(0.1) == 26 / 256 and keep_scale(0.1) == 256 / 230
    assert effective_dropout_p(0.5) == 0.5 and keep_scale(0.5) == 2.0
    assert effective_dropout_p(0.999) == 255 / 256  # at least one byte value is kept
    assert effective_dropout_p(0.002) == 1 / 256


def test_dropout_is_unbiased(seed):
    """The mean of the output over many seeds converges to the no-dropout output at the rate 1/√N.

    E‖mean − o‖² = Σ Var / N; the ratio of the two sides is near 1 for an unbiased estimator and grows with N
    for a biased one (e.g. a keep-scale that is off by the resolution of the random numbers).
    """
    n_seeds, p = 48, 0.25
    q, k, v = (t.detach() for t in make_qkv(1, 2, 48, 32, "contiguous"))
    exact, _ = reference_attention(q, k, v, causal=True)
    samples = []
    for i in range(n_seeds):
        torch.manual_seed(seed + i)
        samples.append(flash_attention(q, k, v, causal=True, dropout_p=p).double())
    samples = torch.stack(samples)
    mean, var = samples.mean(0), samples.var(0)
    ratio = (mean - exact).pow(2).sum().item() / (var.sum().item() / n_seeds)
    assert 0.5 < ratio < 2.0, f"squared error / expected = {ratio:.2f} (seed {seed})"


def test_zero_dropout_is_exact(seed):
    q, k, v = make_qkv(1, 2, 77, 64, "contiguous")
    o = flash_attention(q, k, v, dropout_p=0.0)
    ref, _ = reference_attention(q, k, v, causal=True)
    assert rel_err(o, ref) < FP32_TOL


@pytest.mark.parametrize(
    "options",
    [{}, {"dropout_p": 0.25, "window_size": 9}, {"document_ids": torch.arange(40)[None] // 13}],
    ids=["plain", "dropout-window", "documents"],
)
def test_a_call_without_gradients_computes_what_a_differentiable_one_does(options, seed):
    """Without gradients to compute (no_grad, or inputs that need none) the call builds no autograd node; its o and
    lse are the differentiable call's, bit for bit, dropout included."""
    q, k, v = make_qkv(1, 2, 40, 32, "fused_qkv")
    torch.manual_seed(seed)
    o, lse = flash_attention(q, k, v, return_lse=True, **options)
    for plain_call in (torch.no_grad, torch.enable_grad):
        torch.manual_seed(seed)
        with plain_call():
            o_plain, lse_plain = flash_attention(q.detach(), k.detach(), v.detach(), return_lse=True, **options)
        assert o_plain.grad_fn is None and torch.equal(o_plain, o) and torch.equal(lse_plain, lse)


# ----------------------------------------------------------------------------------------------------------
# Bad input


def test_numpy_scalars_are_numbers(seed):
    """Settings read from numpy (a config, a sweep) work as the equal Python numbers do."""
    q, k, v = make_qkv(1, 2, 40, 32, "contiguous")
    doc = torch.zeros(1, 40, dtype=torch.long)
    torch.manual_seed(seed)
    expected = flash_attention(q, k, v, dropout_p=0.25, softmax_scale=0.5, window_size=8, document_ids=doc)
    torch.manual_seed(seed)
    got = flash_attention(
        q, k, v, dropout_p=np.float32(0.25), softmax_scale=np.float64(0.5), window_size=np.int64(8), document_ids=doc
    )
    assert torch.equal(got, expected)


def test_checks_still_refuse_what_a_checked_signature_looks_like():
    """Eager calls check their inputs once per signature (`attention_op._check_inputs_once`): values that compare
    equal to a checked call's but are not valid (causal=1 for True, dropout_p=False for 0.0) still raise, and so
    does a call that differs in a property the checks read (its dtype, its Tq)."""
    q = torch.randn(1, 2, 16, 32)
    flash_attention(q, q, q, causal=True, dropout_p=0.0)  # this signature now passes without the checks
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attention(q, q, q, causal=1, dropout_p=0.0)
    with pytest.raises(TypeError, match="dropout_p must be a number"):
        flash_attention(q, q, q, causal=True, dropout_p=False)
    with pytest.raises(TypeError, match="dtype"):
        flash_attention(q.double(), q.double(), q.double(), causal=True, dropout_p=0.0)
    with pytest.raises(ValueError, match="Tq <= Tk"):
        flash_attention(torch.randn(1, 2, 17, 32), q, q, causal=True, dropout_p=0.0)


def test_errors_name_the_problem(monkeypatch):
    q = torch.randn(1, 2, 16, 32)
    with pytest.raises(ValueError, match="same shape"):
        flash_attention(q, q, torch.randn(1, 2, 17, 32))
    with pytest.raises(ValueError, match=r"\(B, H, T, D\)"):
        flash_attention(q[0], q[0], q[0])
    with pytest.raises(TypeError, match="dtype"):
        flash_attention(q.long(), q.long(), q.long())
    with pytest.raises(TypeError, match="dtype"):
        flash_attention(q.double(), q.double(), q.double())
    with pytest.raises(TypeError, match="share a dtype"):
        flash_attention(q, q.half(), q)
    with pytest.raises(ValueError, match="one device"):
        flash_attention(q, q, q.to("meta"))
    for head_dim in (8, 44, 264):
        with pytest.raises(ValueError, match=f"head dim {head_dim} .*multiples of 8 from 16 to 256"):
            bad = torch.randn(1, 2, 16, head_dim)
            flash_attention(bad, bad, bad)
    for p in (1.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
            flash_attention(q, q, q, dropout_p=p)
    for p in (True, "0.1", None):
        with pytest.raises(TypeError, match="dropout_p must be a number"):
            flash_attention(q, q, q, dropout_p=p)
    for scale in (float("nan"), float("inf"), "0.125", True):
        with pytest.raises(ValueError, match="softmax_scale must be a finite number or None"):
            flash_attention(q, q, q, softmax_scale=scale)
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        flash_attention(q, q, q, return_lse="no")
    with pytest.raises(ValueError, match="rounds to 0"):
        flash_attention(q, q, q, dropout_p=0.001)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attention(q, q, q, causal="no")
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        flash_attention(q.numpy(), q, q)
    monkeypatch.setattr(attention_op, "interpreting", lambda: False)  # as if imported without TRITON_INTERPRET=1
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        flash_attention(q, q, q)
