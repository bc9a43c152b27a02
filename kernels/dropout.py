"""Attention-dropout keep-mask, regenerated bit-for-bit wherever a kernel needs it.

The mask is a pure function of (seed, call offset, batch·head, row, column). One Philox-4x32-7 draw with

    counter = (row · ⌈T/8⌉ + col // 8,  batch·head,  offset_lo,  offset_hi),   key = seed

yields four 32-bit words, i.e. eight 16-bit numbers, that decide eight neighbouring columns (column 8·g + 2·w + h
takes half h of word w). Because nothing depends on the tile shape, the forward and both backward kernels, which
tile the T×T matrix differently, see the same mask, and nothing of size T×T is ever stored.

Why 7 rounds and 16 bits: the random numbers, not the matrix products, bound the speed of attention with dropout.
Seven rounds is the fewest for which Philox-4x32 passes TestU01's BigCrush (Salmon et al., SC 2011), and 16 bits
per decision give eight decisions per draw. An element is kept when its number is >= threshold, so it is kept with
probability exactly 1 − threshold/2¹⁶, where threshold = round(p·2¹⁶); kept values are scaled by the inverse of that
probability, so the output is unbiased. The drop rate is p to within 2⁻¹⁷.
"""

import triton
import triton.language as tl

PHILOX_ROUNDS = tl.constexpr(7)
LEVELS = 2**16


def keep_threshold(dropout_p: float) -> int:
    """16-bit numbers below this are dropped."""
    return min(round(dropout_p * LEVELS), LEVELS - 1)


def keep_scale(dropout_p: float) -> float:
    """1 / P(keep): what kept probabilities are multiplied by."""
    return LEVELS / (LEVELS - keep_threshold(dropout_p))


@triton.jit
def dropout_keep_mask(
    seed,
    offset_lo,
    offset_hi,
    bh,
    offs_m,
    start_n,
    seq_len,
    threshold,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Keep-mask (BLOCK_M, BLOCK_N) for rows offs_m and columns [start_n, start_n + BLOCK_N)."""
    groups_per_row = (seq_len + 7) // 8
    offs_g = start_n // 8 + tl.arange(0, BLOCK_N // 8)
    counter = (offs_m[:, None] * groups_per_row + offs_g[None, :]).to(tl.uint32, bitcast=True)
    zeros = tl.zeros_like(counter)
    w0, w1, w2, w3 = tl.philox(
        seed,
        counter,
        zeros + bh.to(tl.uint32),
        zeros + offset_lo.to(tl.uint32),
        zeros + offset_hi.to(tl.uint32),
        PHILOX_ROUNDS,
    )
    # join(join(w0, w2), join(w1, w3)) has shape (BLOCK_M, BLOCK_N // 8, 2, 2) with word 2·i + j at [..., i, j];
    # flattening puts word w of group g at 4·g + w. Half h of that word then decides column 2·(4·g + w) + h.
    words = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), (BLOCK_M, BLOCK_N // 2))
    # Comparing whole words against threshold·2¹⁶ decides on the high half without extracting it.
    threshold_hi = threshold.to(tl.uint32) << 16
    keep_lo = (words << 16) >= threshold_hi
    keep_hi = words >= threshold_hi
    return tl.reshape(tl.join(keep_lo, keep_hi), (BLOCK_M, BLOCK_N))
