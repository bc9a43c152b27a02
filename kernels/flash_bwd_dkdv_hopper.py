"""The split backward's dK/dV pass for Hopper, in Gluon: warp-specialised, with every product asynchronous.

Same math as `flash_bwd.py`'s dK/dV pass; one program per key tile walks the query tiles that see it:

    Sᵀ = K·Qᵀ,  Pᵀ = exp2(Sᵀ·scale·log2 e − LSE·log2 e),  dPᵀ = V·dOᵀ,
    dV += Pᵀ·dO,  dSᵀ = Pᵀ ∘ (dPᵀ − δ),  dK += dSᵀ·Q       (dK scaled by `scale` once, at the end)

What Triton's compiler does not express, and this pass does:
- **A producer warp** (`_producer`, 24 registers) owns a ring of STAGES buffers. It waits until a buffer is handed
  back, starts the TMA loads of a query tile's Q and dO into it, and stores the tile's LSE·log2 e and δ beside
  them (plain loads). It runs up to STAGES tiles ahead, so no load's latency is on the consumer's path.
- **The consumer warpgroup** (`_consumer`, the launch's num_warps) issues every product as an asynchronous
  warpgroup MMA and waits for each only where its result is read. It meets no CTA-wide barrier in its loop:
  a buffer's `ready` mbarrier says it is full, its `empty` mbarrier hands it back.

        issue Sᵀ_j, dPᵀ_j │ wait Sᵀ_j (dV_{j−1}, dK_{j−1} retire; their buffer goes back) │ Pᵀ_j ‖ dPᵀ_j runs
        issue dV_j        │ wait dPᵀ_j                                                    │ dSᵀ_j ‖ dV_j runs
        issue dK_j        │ next tile                                                     ‖ dV_j, dK_j run

  Pᵀ and dSᵀ stay in registers as the left operand of their products. The first tile is peeled so that its
  products, not zeros written by the warps, start dK and dV: an accumulator written by ordinary instructions where
  paths merge with its product in flight makes ptxas serialise every product of the kernel (warning C7515).

Launched with maxnreg = 128 so that two programs share an SM; the producer's registers go to the consumer (232).
BLOCK_M is a multiple of 32 (the producer's LSE/δ vector spans its 32 lanes), BLOCK_N of 16 × num_warps.
Dense (no window, document or block mask), no dropout, bf16 or fp16, Tq ≤ Tk (causal: aligned to the bottom
right), any T: rows past T arrive as zeros with LSE = +inf, so their P is 0. The tensors must suit tensor
descriptors (`launch.hopper_launch_config` checks).
Gluon has no interpreter path: the CPU tests compile this pass for sm_90a (`tests/test_kernel_codegen.py`), and
`scripts/bench_attention.py` checks it against the reference on the GPU; same-process A/B and history:
`results/tuning/h200-2026-11-27-gluon-dkdv/`.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .gluon_common import LOG2E, load_head_tile, mma_layout, tile_layout


@gluon.jit
def _producer(descs, ring, rows, lo, n_tiles, b, h):
    """Fill the ring: query tile t's Q, dO (TMA), LSE·log2 e and δ (plain loads; rows past Tq get LSE = +inf, so
    P = 0, and δ = 0) into buffer t mod STAGES, once the consumer has handed that buffer back."""
    q_desc, do_desc = descs
    ready, empty, q_ring, do_ring, lse_ring, delta_ring = ring
    lse_row, delta_row, seq_len_q = rows
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    vec: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    for tile in range(n_tiles):
        slot = tile % STAGES
        mbarrier.wait(empty.index(slot), ((tile // STAGES) & 1) ^ 1)  # a fresh barrier reads as handed back
        start_m = lo + tile * BLOCK_M
        bar = ready.index(slot)
        mbarrier.expect(bar, 2 * q_desc.block_type.nbytes)
        load_head_tile(q_desc, b, h, start_m, bar, q_ring.index(slot))
        load_head_tile(do_desc, b, h, start_m, bar, do_ring.index(slot))
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=vec)
        row_ok = offs_m < seq_len_q
        lse_ring.index(slot).store(gl.load(lse_row + offs_m, mask=row_ok, other=float("inf")) * LOG2E)
        delta_ring.index(slot).store(gl.load(delta_row + offs_m, mask=row_ok, other=0.0))
        mbarrier.arrive(bar, count=1)


@gluon.jit
def _dkdv_step(dk, dv, tile, kv, ring, lo, offs_n, shift, qk_scale, MASKED: gl.constexpr, FIRST: gl.constexpr):
    """One query tile's share of (dK, dV), both still in flight when it returns. MASKED: the tile crosses the
    causal diagonal. FIRST: the program's first tile, whose products start dK and dV."""
    k_smem, v_smem = kv
    ready, empty, q_ring, do_ring, lse_ring, delta_ring = ring
    STAGES: gl.constexpr = q_ring.shape[0]
    BLOCK_M: gl.constexpr = q_ring.shape[1]
    HEAD_DIM: gl.constexpr = q_ring.shape[2]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), BLOCK_M)
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)

    slot = tile % STAGES
    mbarrier.wait(ready.index(slot), (tile // STAGES) & 1)
    q_tile = q_ring.index(slot)
    do_tile = do_ring.index(slot)
    zeros = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
    sT = warpgroup_mma(k_smem, q_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    dpT = warpgroup_mma(v_smem, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
    lse2 = lse_ring.index(slot).load(row_layout)
    delta = delta_ring.index(slot).load(row_layout)
    if FIRST:
        sT = warpgroup_mma_wait(num_outstanding=1, deps=(sT,))
    else:
        # Retires the previous tile's dV and dK products with Sᵀ: their buffer goes back to the producer.
        sT, dk, dv = warpgroup_mma_wait(num_outstanding=1, deps=(sT, dk, dv))
        mbarrier.arrive(empty.index((tile - 1) % STAGES), count=1)

    pT = gl.exp2(sT * qk_scale - lse2[None, :])
    if MASKED:
        offs_m = lo + tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_layout)
        pT = gl.where((offs_m + shift)[None, :] >= offs_n[:, None], pT, 0.0)
    dv = warpgroup_mma(gl.convert_layout(pT.to(k_smem.dtype), p_layout), do_tile, dv, use_acc=not FIRST, is_async=True)
    dpT = warpgroup_mma_wait(num_outstanding=1, deps=(dpT,))
    dsT = pT * (dpT - delta[None, :])
    dk = warpgroup_mma(gl.convert_layout(dsT.to(k_smem.dtype), p_layout), q_tile, dk, use_acc=not FIRST, is_async=True)
    return dk, dv


@gluon.jit
def _consumer(kv, kv_ready, ring, lo, n_tiles, n_masked, outs, start_n, shift, qk_scale, CAUSAL: gl.constexpr):
    """Walk the query tiles, then write this key tile's dK (times the softmax scale) and dV."""
    k_smem = kv[0]
    dk_ptrs, dv_ptrs, stride_dkt, stride_dvt, seq_len_k, softmax_scale = outs
    HEAD_DIM: gl.constexpr = k_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = mma_layout(gl.num_warps(), ring[2].shape[1])
    acc_layout: gl.constexpr = mma_layout(gl.num_warps(), HEAD_DIM)
    offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
    zeros = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_ready, 0)
    # The first tile is peeled (see the module docstring: C7515). Every key tile meets at least one query tile.
    dk, dv = _dkdv_step(zeros, zeros, 0, kv, ring, lo, offs_n, shift, qk_scale, CAUSAL, True)
    for tile in range(1, n_masked):
        dk, dv = _dkdv_step(dk, dv, tile, kv, ring, lo, offs_n, shift, qk_scale, True, False)
    for tile in range(gl.maximum(n_masked, 1), n_tiles):
        dk, dv = _dkdv_step(dk, dv, tile, kv, ring, lo, offs_n, shift, qk_scale, False, False)
    dk, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv))

    rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    row_ok = (rows < seq_len_k)[:, None]
    dtype: gl.constexpr = k_smem.dtype
    gl.store(dk_ptrs + rows[:, None] * stride_dkt + cols[None, :], (dk * softmax_scale).to(dtype), mask=row_ok)
    gl.store(dv_ptrs + rows[:, None] * stride_dvt + cols[None, :], dv.to(dtype), mask=row_ok)


@gluon.jit
def flash_bwd_dkdv_hopper_kernel(
    q_desc,
    k_desc,
    v_desc,
    do_desc,
    LSE,
    Delta,
    DK,
    DV,
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
    STAGES: gl.constexpr,
    CAUSAL: gl.constexpr,
):
    """dK, dV (B, H, Tk, D) of the key tile program_id(0) of head program_id(1), from Q, dO (B, H, Tq, D), K, V
    (B, H, Tk, D), the forward's LSE and δ = rowsum(dO ∘ O) − dlse (B·H·Tq fp32 each, as the dQ pass leaves them).
    Q, dO (tiles of BLOCK_M rows), K and V (BLOCK_N rows) arrive as descriptors made on the host
    (`launch.launch_dkdv_hopper`)."""
    dtype: gl.constexpr = q_desc.dtype
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[3]
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[2]
    bh = gl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    start_n = gl.program_id(0) * BLOCK_N

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], tile_layout(BLOCK_N, HEAD_DIM, dtype))
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], tile_layout(BLOCK_N, HEAD_DIM, dtype))
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    ring = (
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout()),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, dtype)),
        gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], tile_layout(BLOCK_M, HEAD_DIM, dtype)),
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout),
        gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout),
    )
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ring[0].index(i), count=2)  # the expect (TMA bytes) and the LSE/δ stores
        mbarrier.init(ring[1].index(i), count=1)
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
    load_head_tile(k_desc, b, h, start_n, kv_ready, k_smem)
    load_head_tile(v_desc, b, h, start_n, kv_ready, v_smem)

    row_start = bh.to(gl.int64) * seq_len_q
    rows = (LSE + row_start, Delta + row_start, seq_len_q)
    dk_ptrs = DK + b.to(gl.int64) * stride_dkb + h.to(gl.int64) * stride_dkh
    dv_ptrs = DV + b.to(gl.int64) * stride_dvb + h.to(gl.int64) * stride_dvh
    outs = (dk_ptrs, dv_ptrs, stride_dkt, stride_dvt, seq_len_k, softmax_scale)
    qk_scale = softmax_scale * LOG2E
    kv = (k_smem, v_smem)
    gl.warp_specialize(
        [
            (_consumer, (kv, kv_ready, ring, lo, n_tiles, n_masked, outs, start_n, shift, qk_scale, CAUSAL)),
            (_producer, ((q_desc, do_desc), ring, rows, lo, n_tiles, b, h)),
        ],
        [1],
        [24],
    )
