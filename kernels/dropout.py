"""Attention-dropout keep-mask, regenerated bit-for-bit wherever a kernel needs it.

The mask is a pure function of (seed, call offset, batch·head, row, column). One Philox-4x32-10 draw with

    counter = (row · ⌈T/4⌉ + col // 4,  batch·head,  offset_lo,  offset_hi),   key = seed

yields four 32-bit words that decide four neighbouring columns (word j decides column 4·(col // 4) + j).
Because nothing depends on the tile shape, the forward and both backward kernels, which tile the T×T matrix
differently, see the same mask, and nothing of size T×T is ever stored.

An element is kept when its word is >= threshold = floor(p · 2³²), i.e. with probability exactly
1 − threshold / 2³²; the caller scales kept values by the inverse of that probability, so the expectation of
the output is exactly the no-dropout output.
"""

import triton
import triton.language as tl


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
    groups_per_row = (seq_len + 3) // 4
    offs_g = start_n // 4 + tl.arange(0, BLOCK_N // 4)
    counter = (offs_m[:, None] * groups_per_row + offs_g[None, :]).to(tl.uint32, bitcast=True)
    zeros = tl.zeros_like(counter)
    r0, r1, r2, r3 = tl.philox(
        seed,
        counter,
        zeros + bh.to(tl.uint32),
        zeros + offset_lo.to(tl.uint32),
        zeros + offset_hi.to(tl.uint32),
    )
    # Interleave so that word j of group g lands on column 4·g + j: join(join(r0, r2), join(r1, r3)) has
    # shape (BLOCK_M, BLOCK_N // 4, 2, 2) with word index 2·i + j at [..., i, j].
    words = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BLOCK_M, BLOCK_N))
    return words >= threshold.to(tl.uint32)
