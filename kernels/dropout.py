"""Attention-dropout keep-mask, regenerated bit-for-bit wherever a kernel needs it.

The mask is a pure function of (seed, call offset, batch·head, query row m, key column n). One Philox-4x32-7 draw
with

    counter = (g,  batch·head,  offset_lo,  offset_hi),   key = seed,
    g = ((m // 32)·4 + (m % 8) // 2) · ⌈Tk/16⌉·8 + (n // 16)·8 + n % 8

yields four 32-bit words, i.e. sixteen 8-bit numbers. They decide the sixteen elements that share g: keys n and
n + 8 (n % 16 < 8) times the queries 32·i + 8·j + 2·c + e (j < 4, e < 2) of one (i, c). Element (m, n) takes byte
b = 8·((n % 16) // 8) + 2·((m % 32) // 8) + m % 2, i.e. byte b % 4 of word b // 4. Because nothing depends on the
tile shape, the forward and both backward kernels, which tile the Tq×Tk matrix differently, see the same mask, and
nothing of that size is ever stored.

Why this grouping: it is the set of elements one thread holds in a Hopper wgmma accumulator of a key-major tile
(keys as rows: rows r and r + 8 of a 16-row slab, columns 2·c, 2·c + 1 of every 8), the layout of the dK/dV pass,
the slowest with dropout. There each thread draws exactly the numbers it uses, with no exchange through shared
memory. The forward and dQ passes, whose tiles are query-major, exchange the draws' 32-bit words instead
(`dropout_keep_mask`). Against drawing 16 neighbouring keys of one query, as before, this measured 1.11-1.14x
faster fwd+bwd with dropout at D = 64 (results/tuning/h200-2026-11-26-dropout-bwd/).

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
def _tile_draws(rng, start_m, start_n, seq_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KEY_MAJOR: tl.constexpr):
    """The four words of every draw a tile's elements use: draw (n // 16·8 + n % 8, m // 32·4 + (m % 8) // 2), i.e.
    key slab and row within it × query group and column pair, laid out (keys, queries) if KEY_MAJOR, else
    (queries, keys). A 16-row query tile draws its whole 32-row group."""
    keys = start_n // 16 * 8 + tl.arange(0, BLOCK_N // 16 * 8)
    queries = start_m // 32 * 4 + tl.arange(0, (BLOCK_M + 31) // 32 * 4)
    per_group = (seq_len + 15) // 16 * 8
    if KEY_MAJOR:
        counter = queries[None, :] * per_group + keys[:, None]
    else:
        counter = queries[:, None] * per_group + keys[None, :]
    return _draw(rng, counter.to(tl.uint32, bitcast=True))


@triton.jit
def dropout_keep_mask_t(rng, start_m, start_n, seq_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keep-mask (BLOCK_N, BLOCK_M), key-major: key columns [start_n, start_n + BLOCK_N) as rows, query rows
    [start_m, start_m + BLOCK_M) as columns, of one head's stream rng = (seed, offset_lo, offset_hi, bh, threshold).

    seq_len is the number of key columns Tk; start_n, BLOCK_N are multiples of 16, start_m of BLOCK_M, and BLOCK_M
    is 16 or a multiple of 32."""
    NB: tl.constexpr = BLOCK_N // 16
    MB: tl.constexpr = (BLOCK_M + 31) // 32
    w0, w1, w2, w3 = _tile_draws(rng, start_m, start_n, seq_len, BLOCK_M, BLOCK_N, True)
    # Element (m, n) reads byte j0·2 + e of word h·2 + j1, with h = (n % 16) // 8 and j1, j0, e the bits of
    # (m % 32) // 16, (m % 16) // 8, m % 2. join(join(a, c), join(b, d)) has shape (..., 2, 2) with its
    # [..., i, j] = (a, b, c, d)[2·i + j]: each word's decisions as [..., j0, e].
    a0, a1, a2, a3 = _byte_decisions(w0, rng[4])
    b0, b1, b2, b3 = _byte_decisions(w1, rng[4])
    c0, c1, c2, c3 = _byte_decisions(w2, rng[4])
    d0, d1, d2, d3 = _byte_decisions(w3, rng[4])
    by_word0 = tl.join(tl.join(a0, a2), tl.join(a1, a3))
    by_word1 = tl.join(tl.join(b0, b2), tl.join(b1, b3))
    by_word2 = tl.join(tl.join(c0, c2), tl.join(c1, c3))
    by_word3 = tl.join(tl.join(d0, d2), tl.join(d1, d3))
    if BLOCK_M == 16:  # half a query group: the words of its j1, (NB·8, 4, j0, e, h)
        upper = (start_m % 32) >= 16
        keep = tl.join(tl.where(upper, by_word1, by_word0), tl.where(upper, by_word3, by_word2))
        keep = tl.reshape(keep, (NB, 8, 4, 2, 2, 2))  # (n // 16, n % 8, c, j0, e, h)
        keep = tl.permute(keep, (0, 5, 1, 3, 2, 4))  # (n // 16, h, n % 8, j0, c, e)
    else:
        keep = tl.join(tl.join(by_word0, by_word2), tl.join(by_word1, by_word3))  # (NB·8, MB·4, j0, e, h, j1)
        keep = tl.reshape(keep, (NB, 8, MB, 4, 2, 2, 2, 2))  # (n // 16, n % 8, m // 32, c, j0, e, h, j1)
        keep = tl.permute(keep, (0, 6, 1, 2, 7, 4, 3, 5))  # (n // 16, h, n % 8, m // 32, j1, j0, c, e)
    return tl.reshape(keep, (BLOCK_N, BLOCK_M))


@triton.jit
def dropout_keep_mask(rng, start_m, start_n, seq_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The same mask query-major, (BLOCK_M, BLOCK_N), for the forward and dQ tiles. A thread there holds the
    elements of several draws, so the draws' words, not their decisions, are laid out per element (an exchange of
    32-bit words; transposing the key-major booleans costs a byte-wise one with many more barriers), and each
    element then tests its byte."""
    NB: tl.constexpr = BLOCK_N // 16
    MB: tl.constexpr = (BLOCK_M + 31) // 32
    w0, w1, w2, w3 = _tile_draws(rng, start_m, start_n, seq_len, BLOCK_M, BLOCK_N, False)
    # Element (m, n) reads word h·2 + j1 (h = (n % 16) // 8, j1 = (m % 32) // 16), broadcast over j0 and e.
    if BLOCK_M == 16:  # half a query group: the words of its j1, (4, NB·8, h)
        upper = (start_m % 32) >= 16
        words = tl.where(upper, tl.join(w1, w3), tl.join(w0, w2))
        words = tl.broadcast_to(tl.reshape(words, (4, NB, 8, 2, 1, 1)), (4, NB, 8, 2, 2, 2))  # (c, ·, ·, h, j0, e)
        words = tl.permute(words, (4, 0, 5, 1, 3, 2))  # (j0, c, e, n // 16, h, n % 8)
    else:
        words = tl.join(tl.join(w0, w2), tl.join(w1, w3))  # (MB·4, NB·8, h, j1)
        words = tl.broadcast_to(tl.reshape(words, (MB, 4, NB, 8, 2, 2, 1, 1)), (MB, 4, NB, 8, 2, 2, 2, 2))
        words = tl.permute(words, (0, 5, 6, 1, 7, 2, 4, 3))  # (m // 32, j1, j0, c, e, n // 16, h, n % 8)
    words = tl.reshape(words, (BLOCK_M, BLOCK_N))
    # Byte j0·2 + e of the word (j0 = (m % 16) // 8, e = m % 2), moved to the top as in `_byte_decisions`.
    rows = tl.arange(0, BLOCK_M)
    shift = (24 - 8 * ((rows % 16) // 8 * 2 + rows % 2)).to(tl.uint32)
    return (words << shift[:, None]) >= (rng[4].to(tl.uint32) << 24)
