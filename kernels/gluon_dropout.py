"""The dropout keep-mask of `dropout.py`, drawn by the Gluon passes for Hopper.

Same function of (seed, call offset, batch·head, query m, key n) as the Triton passes draw, bit for bit: one
Philox-4x32-7 draw with counter (g, bh, offset_lo, offset_hi) and key seed decides the sixteen elements that share
g (`dropout.py` gives g and the byte each element reads). That grouping is the set of elements one thread holds in
the accumulator of a key-major product (Sᵀ: keys as rows), so there the draws are laid out for each thread to draw
exactly the numbers of its elements: no draw twice, no exchange between threads (`keep_mask_t`; the conversion at
its end is asserted free). A query-major tile (S: queries as rows) holds each draw's elements on four threads, in
two warps: it draws key-major and moves the decisions through shared memory (`keep_mask`), one exchange of bytes
a tile, where drawing in place would draw every number four times.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function

from .dropout import PHILOX_ROUNDS
from .gluon_common import mma_layout


@constexpr_function
def draw_layout(block_n, block_m, num_warps):
    """Where the draws of a key-major (block_n, block_m) accumulator tile live: draw (k, q) with k = n // 16 · 8 +
    n % 8 and q = m // 32 · 4 + (m % 8) // 2, on the thread that holds elements (n, m) in `mma_layout(num_warps,
    block_m)`: lanes 0-1 carry (m % 8) // 2, lanes 2-4 carry n % 8, warps the slabs of 16 keys, and the registers
    the 32-query groups, then the slabs past 16 · num_warps keys."""
    assert block_n % (16 * num_warps) == 0 and block_m % 32 == 0, (block_n, block_m, num_warps)
    groups = [[0, 4 << i] for i in range((block_m // 32).bit_length() - 1)]
    slabs = [[8 * num_warps << i, 0] for i in range((block_n // (16 * num_warps)).bit_length() - 1)]
    lanes = [[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]]
    warps = [[8 << i, 0] for i in range(num_warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(groups + slabs, lanes, warps, [], [block_n // 2, block_m // 8])


@gluon.jit
def _philox(seed, c0, c1, c2, c3):
    """PHILOX_ROUNDS rounds of Philox-4x32 on counter (c0, c1, c2, c3) (uint32) with key seed (its low and high 32
    bits), as `tl.philox` computes them."""
    seed = seed.to(gl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(gl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(gl.uint32)
    for _ in gl.static_range(PHILOX_ROUNDS):
        # (c0, c1, c2, c3) ← (hi(B·c2) ⊕ c1 ⊕ k0, lo(B·c2), hi(A·c0) ⊕ c3 ⊕ k1, lo(A·c0)); the key steps by
        # Weyl constants.
        a0, a2 = c0, c2
        c0 = gl.umulhi(a2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = gl.umulhi(a0, 0xD2511F53) ^ c3 ^ k1
        c1 = a2 * 0xCD9E8D57
        c3 = a0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@gluon.jit
def _byte_decisions(word, threshold_top):
    """(byte j0·2 + e kept) as [..., j0, e]: byte b kept when (word << (24 − 8·b)) >= t·2²⁴. (join(join(a, c),
    join(b, d))[..., i, j] = (a, b, c, d)[2·i + j]: a join's new axis is the last.)"""
    return gl.join(
        gl.join((word << 24) >= threshold_top, (word << 8) >= threshold_top),
        gl.join((word << 16) >= threshold_top, word >= threshold_top),
    )


@gluon.jit
def keep_mask_t(rng, start_m, start_n, seq_len_k, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr):
    """Keep-mask (BLOCK_N, BLOCK_M), key-major, in the accumulator layout of a key-major warpgroup product
    (`mma_layout(num_warps, BLOCK_M)`): key columns [start_n, start_n + BLOCK_N) as rows, query rows [start_m,
    start_m + BLOCK_M) as columns, of one head's stream rng = (seed, offset_lo, offset_hi, bh, threshold). start_n
    is a multiple of 16, start_m of 32; BLOCK_N a multiple of 16 · num_warps."""
    seed, offset_lo, offset_hi, bh, threshold = rng
    draws: gl.constexpr = draw_layout(BLOCK_N, BLOCK_M, gl.num_warps())
    keys = start_n // 16 * 8 + gl.arange(0, BLOCK_N // 2, layout=gl.SliceLayout(1, draws))
    queries = start_m // 32 * 4 + gl.arange(0, BLOCK_M // 8, layout=gl.SliceLayout(0, draws))
    per_group = gl.cdiv(seq_len_k, 16) * 8
    counter = (queries[None, :] * per_group + keys[:, None]).to(gl.uint32, bitcast=True)
    w0, w1, w2, w3 = _philox(seed, counter, bh.to(gl.uint32), offset_lo.to(gl.uint32), offset_hi.to(gl.uint32))
    top = threshold.to(gl.uint32) << 24
    # Element (n, m) reads byte j0·2 + e of word h·2 + j1, with h = (n % 16) // 8 and j1, j0, e the bits of
    # (m % 32) // 16, (m % 16) // 8, m % 2: the decisions as (k, q, j0, e, h, j1) ...
    keep = gl.join(
        gl.join(_byte_decisions(w0, top), _byte_decisions(w2, top)),
        gl.join(_byte_decisions(w1, top), _byte_decisions(w3, top)),
    )
    # ... = (n // 16, n % 8, m // 32, (m % 8) // 2, j0, e, h, j1), reordered into (n, m).
    keep = gl.reshape(keep, [BLOCK_N // 16, 8, BLOCK_M // 32, 4, 2, 2, 2, 2])
    keep = gl.permute(keep, [0, 6, 1, 2, 7, 4, 3, 5])  # (n // 16, h, n % 8, m // 32, j1, j0, c, e)
    keep = gl.reshape(keep, [BLOCK_N, BLOCK_M])
    return gl.convert_layout(keep, mma_layout(gl.num_warps(), BLOCK_M), assert_trivial=True)


@gluon.jit
def keep_mask(rng, start_m, start_n, seq_len_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """The same mask query-major, (BLOCK_M, BLOCK_N) in the accumulator layout of a query-major product
    (`mma_layout(num_warps, BLOCK_N)`). A thread there holds elements of draws that other threads' elements share,
    so the decisions are drawn key-major and moved through shared memory (the one exchange of the mask)."""
    keep_t = keep_mask_t(rng, start_m, start_n, seq_len_k, BLOCK_N, BLOCK_M)
    return gl.convert_layout(gl.permute(keep_t, [1, 0]), mma_layout(gl.num_warps(), BLOCK_N))
