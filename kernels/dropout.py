"""Attention-dropout keep-mask, regenerated bit-for-bit wherever a kernel needs it.

The mask is a pure function of (seed, call offset, batch·head, row, column). One Philox-4x32-7 draw with

    counter = (row · ⌈Tk/16⌉ + col // 16,  batch·head,  offset_lo,  offset_hi),   key = seed

yields four 32-bit words, i.e. sixteen 8-bit numbers, that decide sixteen neighbouring columns: column
16·g + 4·w + b takes byte b of word w. Because nothing depends on the tile shape, the forward and both backward
kernels, which tile the Tq×Tk matrix differently, see the same mask, and nothing of that size is ever stored.

Why 8 bits: the random numbers, not the matrix products, bound the speed of attention with dropout, and a
decision costs one shift and one compare once the draw is made; 8-bit numbers give sixteen decisions per draw
(FlashAttention-2 does the same). Why 7 rounds: it is the fewest for which Philox-4x32 passes TestU01's BigCrush
(Salmon et al., SC 2011); fewer rounds would save integer multiplies but have no published statistical guarantee.

The rounding, exactly: an element is kept when its byte is >= t, where t = round(p·256) (at most 255), so it is
kept with probability exactly 1 − t/256, and kept values are multiplied by 256/(256 − t), the exact inverse of
that probability: E[output] is the no-dropout output (unbiased). The drop rate is therefore p rounded to the
nearest multiple of 1/256 — `effective_dropout_p(p)`, at most 1/512 away from p. Policy: rates are rounded
silently (0.1 becomes 26/256 = 0.1016): 1/512 is far below any difference in regularisation a run could measure,
and a warning would fire for every common setting. Only small rates move noticeably relative to themselves
(0.01 becomes 3/256 = 0.0117), which `effective_dropout_p` reports. A nonzero rate below 1/512 would round to 0
and silently turn dropout off, so it raises (`check_dropout_p`).
"""

import numbers

import triton
import triton.language as tl

PHILOX_ROUNDS = tl.constexpr(7)
LEVELS = 256  # 8-bit decisions


def keep_threshold(dropout_p: float) -> int:
    """Bytes below this are dropped: t = round(p·256), capped so that at least one byte value is kept."""
    return min(round(dropout_p * LEVELS), LEVELS - 1)


def effective_dropout_p(dropout_p: float) -> float:
    """The drop probability the kernel applies for `dropout_p`: p rounded to the nearest multiple of 1/256."""
    return keep_threshold(dropout_p) / LEVELS


def keep_scale(dropout_p: float) -> float:
    """1 / P(keep) = 256 / (256 − t): what kept probabilities are multiplied by."""
    return LEVELS / (LEVELS - keep_threshold(dropout_p))


def check_dropout_p(dropout_p: float) -> None:
    """Refuse non-numbers (numpy scalars are numbers), rates outside [0, 1) and nonzero rates the 8-bit decisions
    would round to zero."""
    if not isinstance(dropout_p, numbers.Real) or isinstance(dropout_p, bool):
        raise TypeError(f"flash_attention: dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if not 0.0 <= dropout_p < 1.0:  # also refuses NaN
        raise ValueError(f"flash_attention: dropout_p must be in [0, 1), got {dropout_p!r}")
    if dropout_p > 0 and keep_threshold(dropout_p) == 0:
        raise ValueError(
            f"flash_attention: dropout_p={dropout_p} rounds to 0 with the kernel's 8-bit dropout decisions "
            f"(rates are multiples of 1/{LEVELS}); use 0 or at least {1 / (2 * LEVELS):.5f}"
        )


@triton.jit
def _draw(rng, counter):
    """The four 32-bit words of one Philox-4x32-7 draw per element of `counter`, in the head's stream
    rng = (seed, offset_lo, offset_hi, bh, threshold)."""
    seed, offset_lo, offset_hi, bh, _ = rng
    zeros = tl.zeros_like(counter)
    return tl.philox(
        seed,
        counter,
        zeros + bh.to(tl.uint32),
        zeros + offset_lo.to(tl.uint32),
        zeros + offset_hi.to(tl.uint32),
        PHILOX_ROUNDS,
    )


@triton.jit
def _byte_decisions(words, threshold):
    """Keep-decisions of bytes 0..3 of every word: byte b is kept when (word << (24 − 8·b)) >= t·2²⁴. The shift
    moves byte b to the top and the bits below it cannot lift a smaller top byte over t·2²⁴: no masking needed."""
    threshold_top = threshold.to(tl.uint32) << 24
    return (
        (words << 24) >= threshold_top,
        (words << 16) >= threshold_top,
        (words << 8) >= threshold_top,
        (words >= threshold_top),
    )


@triton.jit
def dropout_keep_mask(rng, offs_m, start_n, seq_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keep-mask (BLOCK_M, BLOCK_N) for rows offs_m and key columns [start_n, start_n + BLOCK_N) of one head's
    stream rng = (seed, offset_lo, offset_hi, bh, threshold).

    seq_len is the number of key columns Tk; start_n and BLOCK_N must be multiples of 16."""
    groups_per_row = (seq_len + 15) // 16
    offs_g = start_n // 16 + tl.arange(0, BLOCK_N // 16)
    w0, w1, w2, w3 = _draw(rng, (offs_m[:, None] * groups_per_row + offs_g[None, :]).to(tl.uint32, bitcast=True))
    # join(join(a, c), join(b, d)) has shape (..., 2, 2) with its [..., i, j] = (a, b, c, d)[2·i + j], so
    # flattening the last two dims lists a, b, c, d in order. Here: word w of group g lands at 4·g + w.
    words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (BLOCK_M, BLOCK_N // 4))
    keep0, keep1, keep2, keep3 = _byte_decisions(words, rng[4])
    # Byte b of word 4·g + w decides column 4·(4·g + w) + b = 16·g + 4·w + b.
    return tl.reshape(tl.join(tl.join(keep0, keep2), tl.join(keep1, keep3)), (BLOCK_M, BLOCK_N))


@triton.jit
def dropout_keep_mask_t(rng, offs_m, start_n, seq_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The transpose of `dropout_keep_mask`, (BLOCK_N, BLOCK_M), drawn in that orientation (key columns as rows)."""
    groups_per_row = (seq_len + 15) // 16
    offs_g = start_n // 16 + tl.arange(0, BLOCK_N // 16)
    w0, w1, w2, w3 = _draw(rng, (offs_g[:, None] + offs_m[None, :] * groups_per_row).to(tl.uint32, bitcast=True))
    words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (BLOCK_N // 16, BLOCK_M, 4))  # [g, m, w]
    keep0, keep1, keep2, keep3 = _byte_decisions(words, rng[4])
    keep = tl.reshape(tl.join(tl.join(keep0, keep2), tl.join(keep1, keep3)), (BLOCK_N // 16, BLOCK_M, 16))
    return tl.reshape(tl.permute(keep, (0, 2, 1)), (BLOCK_N, BLOCK_M))  # row 16·g + 4·w + b
