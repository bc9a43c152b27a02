"""The dK/dV pass on Hopper, written in Gluon: the split backward's key-major pass with its products in flight.

Same math as `flash_bwd.py`'s dK/dV pass (one program per key tile walks the query tiles that see it):

    Sᵀ = K·Qᵀ,  Pᵀ = exp2(Sᵀ·scale·log2 e − LSE·log2 e),  dPᵀ = V·dOᵀ,
    dV += Pᵀ·dO,  dSᵀ = Pᵀ ∘ (dPᵀ − δ),  dK += dSᵀ·Q       (dK scaled by `scale` once, at the end)

What Triton's compiler cannot express and this pass does: every product is an asynchronous warpgroup MMA, waited
for only where its result is read, so the tensor cores always hold the next product while the warps compute:

    issue Sᵀ_j, dPᵀ_j │ wait Sᵀ_j (dV_{j−1}, dK_{j−1} retire) │ Pᵀ_j = exp2(…)  ‖ dPᵀ_j runs
    issue dV_j        │ wait dPᵀ_j                           │ dSᵀ_j = …      ‖ dV_j runs
    issue dK_j        │ next tile's loads, LSE and δ                          ‖ dV_j, dK_j run

Q and dO tiles arrive through TMA into a ring of STAGES buffers; a buffer is refilled once the products that read
it have retired (the compiler's own barrier orders that). LSE and δ are loaded into registers a tile ahead. Pᵀ and
dSᵀ stay in registers as the left operand of their products. Dense (no window, document or block mask) and without
dropout; causal or not, Tq ≤ Tk (causal: aligned to the bottom right), any T (rows past T arrive as zeros, and
their LSE as +inf, so their P is 0).

An experiment, kept beside its A/B (README.md): Gluon has no interpreter path, so only `ab_gluon_dkdv.py` checks
it, against float64 gradients on the GPU.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from flashgpt.kernels.flash_bwd_dkdv_hopper import LOG2E, _head_desc, _mma_layout  # shared with the kept pass


@gluon.jit
def _load_rows(ring, tile, lo, n_tiles, BLOCK_M: gl.constexpr):
    """Start the TMA loads of query tile `tile` (its Q and dO) into its ring buffer, if the program walks it."""
    q_desc, do_desc, ready, q_ring, do_ring = ring
    slot = tile % q_ring.shape[0]
    pred = tile < n_tiles
    bar = ready.index(slot)
    mbarrier.expect(bar, 2 * q_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [lo + tile * BLOCK_M, 0], bar, q_ring.index(slot), pred=pred)
    tma.async_copy_global_to_shared(do_desc, [lo + tile * BLOCK_M, 0], bar, do_ring.index(slot), pred=pred)


@gluon.jit
def _load_row_stats(lse_row, delta_row, offs_m, seq_len_q):
    """LSE·log2 e and δ of the query rows offs_m (rows past Tq: LSE = +inf, so P = 0, and δ = 0), loaded a tile
    ahead of their use so that their latency hides behind a tile's products."""
    row_ok = offs_m < seq_len_q
    lse2 = gl.load(lse_row + offs_m, mask=row_ok, other=float("inf")) * LOG2E
    return lse2, gl.load(delta_row + offs_m, mask=row_ok, other=0.0)


@gluon.jit
def _dkdv_step(
    dk,
    dv,
    row_stats,
    tile,
    kv,
    ring,
    lo,
    n_tiles,
    rows,
    offs_n,
    shift,
    qk_scale,
    MASKED: gl.constexpr,
    BLOCK_M: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    FIRST: gl.constexpr = False,
):
    """One query tile's share of (dK, dV), both still in flight when it returns (see the module's schedule).
    MASKED: the tile crosses the causal diagonal, so Pᵀ is zeroed where the query precedes the key. FIRST: the
    program's first tile, whose products start dK and dV."""
    k_smem, v_smem = kv
    _, _, ready, q_ring, do_ring = ring
    lse_row, delta_row, seq_len_q = rows
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_M)
    acc_layout: gl.constexpr = _mma_layout(gl.num_warps(), HEAD_DIM)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    slot = tile % STAGES
    mbarrier.wait(ready.index(slot), (tile // STAGES) & 1)
    q_tile = q_ring.index(slot)
    do_tile = do_ring.index(slot)
    zeros = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    sT = warpgroup_mma(k_smem, q_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    dpT = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    lse2, delta = row_stats
    offs_m = lo + tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
    next_stats = _load_row_stats(lse_row, delta_row, offs_m + BLOCK_M, seq_len_q)
    # Retires the previous tile's dV and dK products with Sᵀ: that tile's buffer is free for the tile STAGES − 1
    # ahead, once every warp is past this point.
    if FIRST:
        sT = warpgroup_mma_wait(num_outstanding=1, deps=(sT,))
    else:
        sT, dk, dv = warpgroup_mma_wait(num_outstanding=1, deps=(sT, dk, dv))
    _load_rows(ring, tile + STAGES - 1, lo, n_tiles, BLOCK_M)

    pT = gl.exp2(sT * qk_scale - lse2[None, :])
    if MASKED:
        pT = gl.where((offs_m + shift)[None, :] >= offs_n[:, None], pT, 0.0)
    dv = warpgroup_mma(gl.convert_layout(pT.to(k_smem.dtype), p_layout), do_tile, dv, use_acc=not FIRST, is_async=True)
    dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))
    dsT = pT * (dpT - delta[None, :])
    dk = warpgroup_mma(gl.convert_layout(dsT.to(k_smem.dtype), p_layout), q_tile, dk, use_acc=not FIRST, is_async=True)
    return dk, dv, next_stats


@gluon.jit
def flash_bwd_dkdv_hopper_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    Delta,
    DK,
    DV,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_dob,
    stride_doh,
    stride_dot,
    stride_dkb,
    stride_dkh,
    stride_dkt,
    stride_dvb,
    stride_dvh,
    stride_dvt,
    n_heads,
    seq_len_q,
    seq_len_k,
    softmax_scale,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
):
    """dK, dV (B, H, Tk, D) of the key tile program_id(0) of head program_id(1), from Q, dO (B, H, Tq, D), K, V
    (B, H, Tk, D), the forward's LSE and δ = rowsum(dO ∘ O) (B·H·Tq fp32 each, as the dQ pass leaves them)."""
    dtype: gl.constexpr = Q.dtype.element_ty
    s_layout: gl.constexpr = _mma_layout(gl.num_warps(), BLOCK_M)
    acc_layout: gl.constexpr = _mma_layout(gl.num_warps(), HEAD_DIM)

    bh = gl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_n = gl.program_id(0) * BLOCK_N
    q_desc = _head_desc(Q, b, h, stride_qb, stride_qh, stride_qt, seq_len_q, HEAD_DIM, BLOCK_M)
    do_desc = _head_desc(DO, b, h, stride_dob, stride_doh, stride_dot, seq_len_q, HEAD_DIM, BLOCK_M)
    k_desc = _head_desc(K, b, h, stride_kb, stride_kh, stride_kt, seq_len_k, HEAD_DIM, BLOCK_N)
    v_desc = _head_desc(V, b, h, stride_vb, stride_vh, stride_vt, seq_len_k, HEAD_DIM, BLOCK_N)

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], v_desc.layout)
    ring = (
        q_desc,
        do_desc,
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout),
    )
    ready = ring[2]
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()

    # Query tiles [lo, hi) see this key tile; those below `free` cross the diagonal (shift: Tk − Tq).
    shift = seq_len_k - seq_len_q
    hi = gl.cdiv(seq_len_q, BLOCK_M) * BLOCK_M
    if CAUSAL:
        lo = gl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M
        free = gl.minimum(gl.cdiv(gl.maximum(start_n + BLOCK_N - 1 - shift, 0), BLOCK_M) * BLOCK_M, hi)
    else:
        lo = 0
        free = 0
    n_tiles = (hi - lo) // BLOCK_M
    n_masked = (free - lo) // BLOCK_M

    mbarrier.expect(kv_ready, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [start_n, 0], kv_ready, k_smem)
    tma.async_copy_global_to_shared(v_desc, [start_n, 0], kv_ready, v_smem)
    for i in gl.static_range(STAGES - 1):
        _load_rows(ring, i, lo, n_tiles, BLOCK_M)

    kv = (k_smem, v_smem)
    row_start = bh.to(gl.int64) * seq_len_q
    rows = (LSE + row_start, Delta + row_start, seq_len_q)
    row_stats = _load_row_stats(
        LSE + row_start, Delta + row_start, lo + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout)), seq_len_q
    )
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    qk_scale = softmax_scale * LOG2E
    # Every key tile meets at least one query tile. The first is peeled, so that its products, not zeros written
    # by the warps, start dK and dV: registers written while products are in flight make ptxas serialise them.
    zeros = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    dk, dv, row_stats = _dkdv_step(
        zeros, zeros, row_stats, 0, kv, ring, lo, n_tiles, rows, offs_n, shift, qk_scale, CAUSAL, BLOCK_M, HEAD_DIM,
        FIRST=True,
    )  # fmt: skip
    for tile in range(1, n_masked):
        dk, dv, row_stats = _dkdv_step(
            dk, dv, row_stats, tile, kv, ring, lo, n_tiles, rows, offs_n, shift, qk_scale, True, BLOCK_M, HEAD_DIM
        )  # fmt: skip
    for tile in range(gl.maximum(n_masked, 1), n_tiles):
        dk, dv, row_stats = _dkdv_step(
            dk, dv, row_stats, tile, kv, ring, lo, n_tiles, rows, offs_n, shift, qk_scale, False, BLOCK_M, HEAD_DIM
        )  # fmt: skip
    dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))

    mbarrier.invalidate(kv_ready)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    row_ok = (rows < seq_len_k)[:, None]
    dk_ptrs = DK + b.to(gl.int64) * stride_dkb + h.to(gl.int64) * stride_dkh
    dv_ptrs = DV + b.to(gl.int64) * stride_dvb + h.to(gl.int64) * stride_dvh
    gl.store(dk_ptrs + rows[:, None] * stride_dkt + cols[None, :], (dk * softmax_scale).to(dtype), mask=row_ok)
    gl.store(dv_ptrs + rows[:, None] * stride_dvt + cols[None, :], dv.to(dtype), mask=row_ok)
