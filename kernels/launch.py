"""Kernel launches: grids, strides and scalars for each pass, given a launch configuration.

`attention_op.py` calls these with the tuned configurations; `scripts/tune_attention.py` calls them with
candidates. Inputs are assumed valid (checked once in `attention_op.py`).
"""

import functools
import math
import os
from dataclasses import dataclass, replace

import torch
import triton

from .dropout import keep_scale, keep_threshold
from .fast_launch import TESTED_TRITON, BoundLaunch, FastLauncher
from .flash_bwd import (
    flash_bwd_dkdv_kernel,
    flash_bwd_dq_convert_kernel,
    flash_bwd_dq_kernel,
    flash_bwd_preprocess_kernel,
)
from .flash_fwd import flash_fwd_kernel
from .tile_schedule import FlashMask, TileKey, tile_key
from .tuning import MIN_TILE, LaunchConfig, backward_schedule, hopper_config, launch_config, nearest_hopper_config

# The Gluon passes are written against the experimental Gluon API of the Triton release CI installs; with any
# other release the split backward keeps the Triton passes.
if triton.__version__.startswith(TESTED_TRITON):
    from .flash_bwd_dkdv_hopper import flash_bwd_dkdv_hopper_kernel
    from .flash_bwd_dq_hopper import flash_bwd_dq_hopper_kernel
    from .flash_bwd_fused_hopper import flash_bwd_fused_hopper_kernel
    from .flash_fwd_hopper import flash_fwd_hopper_kernel
    from .gluon_common import head_descriptor
else:
    flash_bwd_dkdv_hopper_kernel = flash_bwd_dq_hopper_kernel = flash_bwd_fused_hopper_kernel = None
    flash_fwd_hopper_kernel = None

LOG2E = math.log2(math.e)
PREPROCESS_BLOCK_M = 128


# Triton decides at import whether @triton.jit kernels run in its interpreter; so does this module, once.
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpreting() -> bool:
    """The kernels run through Triton's CPU interpreter (TRITON_INTERPRET=1 when they were imported)."""
    return _INTERPRETING


def _cdiv(a: int, b: int) -> int:
    """⌈a / b⌉. triton.cdiv is a constexpr function, whose call wrapper costs ~10 µs of host time per grid."""
    return -(-a // b)


@functools.cache
def _fast_launcher(kernel) -> FastLauncher:
    return FastLauncher(kernel)


@dataclass(frozen=True)
class Launch:
    """One launch as it was made: the kernel, its grid, positional arguments and constexprs."""

    kernel: object
    grid: tuple[int, int]
    args: tuple
    constexprs: dict

    def bind(
        self, slots: list[tuple[int, int]], descriptors: list[tuple[int, int]], baked: list[int]
    ) -> BoundLaunch | None:
        """`FastLauncher.bind` of this launch; None in the interpreter, which launches through Triton only."""
        if interpreting():
            return None
        return _fast_launcher(self.kernel).bind(self.grid, self.args, self.constexprs, slots, descriptors, baked)


def _launch(kernel, grid: tuple[int, int], *args, **constexprs) -> Launch:
    """kernel[grid](*args, **constexprs); on a GPU through `FastLauncher`, which skips Triton's per-call binding."""
    if interpreting():
        kernel[grid](*args, **constexprs)
    else:
        _fast_launcher(kernel)(grid, *args, **constexprs)
    return Launch(kernel, grid, args, constexprs)


@dataclass(frozen=True)
class AttentionParams:
    """What every pass needs besides the tensors."""

    causal: bool
    dropout_p: float
    softmax_scale: float
    seed: int = 0
    offset: int = 0

    @property
    def dropout(self) -> bool:
        return self.dropout_p > 0

    @functools.cached_property
    def scalars(self) -> tuple:
        """(qk_scale, seed, offset_lo, offset_hi, dropout_threshold, dropout_scale) as the kernels take them.

        An element is kept when its 8-bit random number is >= threshold, i.e. with probability exactly
        1 − threshold/256; kept values are scaled by the inverse of that probability (unbiased, `dropout.py`)."""
        offset_lo, offset_hi = self.offset & 0xFFFFFFFF, self.offset >> 32
        threshold, scale = keep_threshold(self.dropout_p), keep_scale(self.dropout_p)
        return self.softmax_scale * LOG2E, self.seed, offset_lo, offset_hi, threshold, scale


@functools.cache
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.cache
def _is_hopper(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] == 9


def is_hopper(device: torch.device) -> bool:
    """An H100/H200-class GPU (compute capability 9.x); False for any other device."""
    if device.type != "cuda":
        return False
    return _is_hopper(device.index if device.index is not None else torch.cuda.current_device())


def fit_tiles_to_blocks(cfg: LaunchConfig, block_size: int) -> LaunchConfig:
    """Shrink tiles so that both divide block_size: a tile then lies in one block of a block-sparse mask, which
    keeps or drops it whole, with no per-element lookup. Only when block_size is a multiple of the smallest tile;
    other block sizes keep the tuned tiles and the kernels look the block mask up per element."""
    if block_size % MIN_TILE:
        return cfg
    largest = block_size & -block_size  # the largest power of two dividing block_size
    return replace(cfg, block_m=min(cfg.block_m, largest), block_n=min(cfg.block_n, largest))


@functools.lru_cache(maxsize=1024)  # a pure lookup, made on every launch: a dict hit instead
def config_for(
    kernel_pass: str,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    causal: bool,
    dropout: bool,
    seq_len_k: int,
    block_size: int | None = None,
) -> LaunchConfig:
    """The configuration for queries of `head_dim` and `dtype` on `device` and keys of length seq_len_k; with the
    block_size of a block mask, tiles that fit it (`fit_tiles_to_blocks`)."""
    hopper = is_hopper(device)
    cfg = launch_config(
        kernel_pass, head_dim, dtype_name(dtype), causal, dropout, seq_len_k, interpreting=interpreting(), hopper=hopper
    )
    if block_size is not None:
        cfg = fit_tiles_to_blocks(cfg, block_size)
    cfg.validate(kernel_pass)
    return cfg


def tuned_config(
    kernel_pass: str,
    q: torch.Tensor,
    params: AttentionParams,
    *,
    seq_len_k: int | None = None,
    block_size: int | None = None,
) -> LaunchConfig:
    """`config_for` q and keys of length seq_len_k (default Tq)."""
    seq_len_k = q.shape[2] if seq_len_k is None else seq_len_k
    return config_for(kernel_pass, q.shape[-1], q.dtype, q.device, params.causal, params.dropout, seq_len_k, block_size)


@functools.lru_cache(maxsize=1024)
def backward_schedule_for(
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    causal: bool,
    dropout: bool,
    seq_len_k: int,
    documents: bool = False,
) -> str:
    """`tuning.backward_schedule` ("fused" or "split") for queries of head_dim and dtype on device."""
    hopper = is_hopper(device)
    return backward_schedule(head_dim, dtype_name(dtype), causal, dropout, seq_len_k, documents=documents,
                             interpreting=interpreting(), hopper=hopper)  # fmt: skip


@torch.compiler.assume_constant_result
def launch_tiles(
    passes: tuple[str, ...],
    head_dim: int,
    dtype: torch.dtype,
    device_type: str,
    device_index: int | None,
    causal: bool,
    dropout: bool,
    seq_len_bucket: int,
    block_size: int | None,
    documents: bool = False,
) -> tuple[TileKey, ...]:
    """The tiling each of `passes` launches with (`config_for`; seq_len_bucket: `tuning.seq_len_bucket` of Tk), and
    on a Hopper GPU that of its Gluon pass, which may take the call instead (`gluon_tiles`; block_size: a block
    mask's, documents: whether there are document ids). A constant to torch.compile, which then neither traces the
    table lookup (it reads a file) nor guards on more than the T bucket."""
    device = torch.device(device_type, device_index)
    tiles = tuple(
        tile_key(p, config_for(p, head_dim, dtype, device, causal, dropout, seq_len_bucket, block_size)) for p in passes
    )
    if device_type == "cuda" and not interpreting() and is_hopper(device):
        tiles += gluon_tiles(passes, head_dim, dtype, causal, dropout, seq_len_bucket, block_size, documents)
    return tiles


def gluon_tiles(
    passes: tuple[str, ...],
    head_dim: int,
    dtype: torch.dtype,
    causal: bool,
    dropout: bool,
    seq_len_bucket: int,
    block_size: int | None = None,
    documents: bool = False,
) -> tuple[TileKey, ...]:
    """The tilings of the Gluon passes that may take the place of `passes` under document ids (documents) or a
    block mask (block_size) on a Hopper GPU (`_gluon_masks`), which need the mask's schedules for them:
    `gluon_config`'s, for causal bf16 or fp16 calls; none without either mask."""
    if not causal or dtype not in (torch.bfloat16, torch.float16) or (block_size is None and not documents):
        return ()
    tiles = []
    for name in (GLUON_PASSES[p] for p in passes if p in GLUON_PASSES):
        cfg = gluon_config(name, head_dim, dtype_name(dtype), causal, dropout, seq_len_bucket,
                           block_size=block_size, documents=documents)  # fmt: skip
        if cfg is not None and globals()[f"flash_{name}_kernel"] is not None:
            tiles.append(tile_key(name, cfg))
    return tuple(tiles)


def gluon_config(
    kernel_pass: str,
    head_dim: int,
    dtype: str,
    causal: bool,
    dropout: bool,
    seq_len: int,
    *,
    window: bool = False,
    documents: bool = False,
    block_size: int | None = None,
) -> LaunchConfig | None:
    """The configuration of the Gluon pass `kernel_pass` for a call with these masks (window: a sliding window;
    documents: document ids; block_size: a block mask's), None where the Triton pass takes it: the table's
    (`tuning.hopper_config`), fitted to the masks (`fit_gluon_to_masks`). The table measured dense calls; at
    D ≤ 64 it lists no Gluon forward with dropout (dense, it lost to the Triton one) and no Gluon dQ pass with
    dropout from 8K (the fused backward takes those calls). Masked calls with dropout take their configuration
    without dropout there, fitted: at 16K, the forward under documents and block masks ran 1.11-1.37x the Triton
    one, and the split backward through the Gluon passes (which deterministic calls take; the others now take the
    Gluon fused pass) 0.99-1.33x the Triton fused one, fwd+bwd 1.02-1.40x.
    Under a window alone the Gluon forward with dropout ran 0.82-0.90x, and the Triton forward keeps those calls
    (`results/tuning/h200-2026-11-27-masked-dropout/`). Without dropout, calls under documents or a window take
    the configuration of the nearest length the table lists where it lists none for theirs (the Triton pass won or
    tied dense calls there; at D = 64, the forward and the dQ pass at 1K): under documents fwd+bwd ran 1.19x at 1K;
    under block masks the Gluon forward lost there (0.75-0.79x), and they keep the table's choice
    (`results/tuning/h200-2026-11-28-nearest-bucket/`). Without dropout the table lists the fused backward only with a
    dQ warpgroup (`has_dq_warpgroup`); masked calls take it at D = 64 only where it measured faster than the split
    passes: past 4K under a window, past 8K under documents and past 16K under a block mask (0.87x at 4K and 0.95x
    at 8K under documents, 1.12-1.16x from 8K under a 4K window: `results/tuning/h200-2026-11-28-dq-warpgroup-all/`;
    under block masks 1.03-1.07x fwd+bwd at 64K, `results/tuning/h200-2026-11-28-masked-dq-warpgroup/`, and at 16K
    the split passes' backward 1.04-1.07x the fused one's, fwd+bwd 1.01-1.05x:
    `results/tuning/h200-2026-11-29-block-split-16k/`)."""
    tensor_masks = documents or block_size is not None
    if kernel_pass == "bwd_fused_hopper" and not dropout and (window or tensor_masks):
        # The split passes ran as fast or faster up to there.
        split_up_to = 16384 if block_size is not None else 8192 if documents else 4096
        if head_dim > 64 or seq_len <= split_up_to:
            return None
        cfg = hopper_config(kernel_pass, head_dim, dtype, causal, False, seq_len)
        return cfg if cfg is None or block_size is None else fit_gluon_to_blocks(kernel_pass, cfg, block_size)
    cfg = hopper_config(kernel_pass, head_dim, dtype, causal, dropout, seq_len)
    if cfg is None and dropout and head_dim <= 64 and (tensor_masks or (window and kernel_pass != "fwd_hopper")):
        cfg = hopper_config(kernel_pass, head_dim, dtype, causal, False, seq_len)
    if cfg is None and not dropout and (window or documents) and block_size is None:
        cfg = nearest_hopper_config(kernel_pass, head_dim, dtype, causal, False, seq_len)
    if cfg is None or not (window or tensor_masks):
        return cfg
    return fit_gluon_to_masks(kernel_pass, cfg, head_dim, seq_len, block_size, documents, dropout)


def fit_gluon_to_masks(
    kernel_pass: str,
    cfg: LaunchConfig,
    head_dim: int,
    seq_len: int,
    block_size: int | None,
    documents: bool,
    dropout: bool,
) -> LaunchConfig | None:
    """The configuration of a Gluon pass under masks (causal, with a window, documents or a block mask): programs of
    three math warpgroups drop to one (the forward's 192 rows to 64, the dK/dV pass's 32 × 192 tiles to 64 × 64),
    since a taller tile spans more of the masks' edges, each costing it whole tiles; under documents, and with
    dropout under every mask, the dQ pass takes 64-key tiles (with dropout 64 × 128 spills 240 bytes, and at 4K
    under a block mask the 64-key pass ran 1.12x faster); under a block mask, tiles that its blocks hold whole
    (`fit_gluon_to_blocks`). The fused backward with dropout at D ≤ 64 takes 32-query tiles with four stages (dense
    calls run 64 × 128 with a dQ warpgroup from 4K): on 64-query tiles its masked steps spill 112-176 bytes, on 32 none
    (fwd+bwd 1.05-1.11x at 16K under every mask with dropout, 1.04x under documents at 64K against 64 × 64 tiles; dense,
    the 64-query tiles stay 1.06x faster: `results/tuning/h200-2026-11-27-masked-dropout/`). Up to 8K those are one math
    warpgroup's 32 × 64; past 8K, 32 × 128 with a dQ warpgroup, which against them ran the backward 0.90-0.98x at 4K,
    0.98-1.08x at 16K and 1.02-1.13x at 64K under each mask (`results/tuning/h200-2026-11-28-masked-dq-warpgroup/`). A
    forward of one math warpgroup at D ≤ 64 takes 64 × 64 tiles at maxnreg 80, which fit three programs an SM instead of
    two: masked walks are short, and a third program's walk covers the others' prologues and epilogues (forward
    1.07-1.10x at 16K under every mask, 1.24-1.31x at 4K, 1.18x for a 1K window at 64K; the same tiles at maxnreg 128
    ran 0.89-0.96x). Same-process A/Bs: `results/tuning/h200-2026-11-27-mask-tiles/`."""
    if kernel_pass == "fwd_hopper" and cfg.block_m > 128:
        cfg = replace(cfg, block_m=64)
    elif kernel_pass == "bwd_dkdv_hopper" and cfg.block_n > 128:
        cfg = replace(cfg, block_m=64, block_n=64)
    elif (documents or dropout) and kernel_pass == "bwd_dq_hopper":
        cfg = replace(cfg, block_n=64)
    elif kernel_pass == "bwd_fused_hopper" and (cfg.block_n == 64 or (dropout and head_dim <= 64)):
        keys = 128 if dropout and cfg.block_n == 128 and seq_len > 8192 else 64  # 128: with a dQ warpgroup
        cfg = replace(cfg, block_m=32, block_n=keys, num_stages=4)
    if kernel_pass == "fwd_hopper" and cfg.block_m == 64 and head_dim <= 64:
        cfg = replace(cfg, block_n=64, maxnreg=80)
    return cfg if block_size is None else fit_gluon_to_blocks(kernel_pass, cfg, block_size)


def fit_gluon_to_blocks(kernel_pass: str, cfg: LaunchConfig, block_size: int) -> LaunchConfig | None:
    """The configuration of a Gluon pass under a block mask: its tiles must divide block_size, since it walks the
    kept tiles whole, with no per-element lookup. A program of several math warpgroups whose tile does not (the
    dK/dV pass's 192 keys; a forward's 128 rows for 64-token blocks) drops to the table's one-warpgroup tiles
    (64 × 128 and 64 × 64: its 4K configurations at D = 64); None where those do not divide it either (the Triton
    passes then take the call)."""
    if block_size % cfg.block_m or block_size % cfg.block_n:
        if kernel_pass == "fwd_hopper":
            cfg = replace(cfg, block_m=64)
        elif kernel_pass == "bwd_dkdv_hopper":
            cfg = replace(cfg, block_m=64, block_n=64)
    return None if block_size % cfg.block_m or block_size % cfg.block_n else cfg


def _flags(q: torch.Tensor, params: AttentionParams, cfg: LaunchConfig, masks: FlashMask) -> dict:
    """Constexprs shared by all passes. The interpreter computes bf16 tl.dot wrongly (triton#11584), so bf16
    tiles are upcast to fp32 there; fp32 inputs get IEEE products (Triton's fp32 default on GPUs is TF32). Each
    mask is a constexpr flag, so the unmasked kernel compiles to exactly the code it had before masks existed.
    GATHER: tiles straddle blocks of the block mask, which is then also applied per element."""
    sparse = masks.block_mask is not None
    return dict(
        HEAD_DIM=q.shape[-1],
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        CAUSAL=params.causal,
        WINDOW=masks.window_size is not None,
        DOCS=masks.document_ids is not None,
        SPARSE=sparse,
        GATHER=sparse and not masks.block_exact(cfg.block_m, cfg.block_n),
        SPARSE_BLOCK=masks.block_size if sparse else 1,
        DROPOUT=params.dropout,
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
        INPUT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
    )


def one_loop(kernel_pass: str, masks: FlashMask, dropout: bool, seq_len_k: int) -> bool:
    """Whether a masked pass walks its three runs of tiles (masked, mask-free, masked) in one loop, each tile
    deciding at run time whether it pays for the elementwise mask. A loop costs every program a pipeline fill and
    drain, which short loops cannot amortise; one loop makes the mask-free tiles test and branch, which long loops
    feel. Measured on an H100 against three loops, same process (results/tuning/h100-2026-11-26-one-loop/):
    - dK/dV pass: 1.06-1.25x with windows, documents and block masks from 4K to 64K; with a block mask and dropout
      0.91-0.95x, and in the fused pass ptxas serialises the wgmma pipeline (C7515): three loops there;
    - forward and dQ pass: 1.04-1.18x with block masks up to 16K and with documents at 4K; 0.86-0.98x with documents
      from 16K up and with block masks at 64K; no gain with windows (0.95-1.02x); and with dropout ptxas serialises
      the dQ pass's pipeline (C7515)."""
    if not masks.any:
        return False
    if kernel_pass == "bwd_dkdv":
        return not (dropout and masks.block_mask is not None)
    if kernel_pass not in ("fwd", "bwd_dq") or dropout:
        return False
    if masks.block_mask is not None:
        return seq_len_k <= 16384
    return masks.document_ids is not None and seq_len_k <= 8192


def _mask_args(masks: FlashMask, cfg: LaunchConfig, kernel_pass: str, element_mask: bool = True) -> tuple:
    """(window_size, documents, blocks) of a pass: documents = (DocIds, stride, DocRanges, stride), blocks =
    (KeptCount, stride_h, KeptIndex, stride_h, stride_r[, BlockMask, stride_h, stride_row]) (`tile_ranges`), the
    block mask itself only with element_mask (the Triton passes, whose tiles may straddle blocks); None for the
    tensors of masks not given. The schedules are the mask's, built beforehand for the pass's tiling."""
    window = masks.window_size or 0
    documents: tuple = (None, 0, None, 0)
    blocks: tuple = (None, 0, None, 0, 0, None, 0, 0) if element_mask else (None, 0, None, 0, 0)
    if masks.document_ids is None and masks.block_mask is None:
        return window, documents, blocks
    schedule = masks.tile_schedule(kernel_pass, cfg)
    if masks.document_ids is not None:
        ranges = schedule.ranges
        documents = (masks.document_ids, masks.document_ids.stride(0), ranges, ranges.stride(0))
    if masks.block_mask is not None:
        counts, indices = schedule.counts, schedule.indices
        shared = masks.block_mask.shape[0] == 1  # one mask for every head: head strides 0
        blocks = (counts, 0 if shared else counts.stride(0), indices, 0 if shared else indices.stride(0),
                  indices.stride(1))  # fmt: skip
        if element_mask:
            block_mask = masks.block_mask.view(torch.uint8)  # the same bytes: the kernels load them as integers
            blocks += (block_mask, 0 if shared else block_mask.stride(0), block_mask.stride(1))
    return window, documents, blocks


NO_MASKS = FlashMask()


def _tma_scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Scratch memory for the descriptors a kernel builds (tl.make_tensor_descriptor), from PyTorch's allocator."""
    return torch.empty(size, device="cuda", dtype=torch.int8)


def provide_tma_scratch() -> None:
    """Triton asks its allocator for descriptor scratch at launch. The allocator is a context variable, i.e. per
    thread: autograd runs backward passes on its own threads, so it is set before every launch that needs it, not
    once per process (a ContextVar.set, well under a microsecond)."""
    triton.set_allocator(_tma_scratch)


def _descriptors_fit(*tiles: torch.Tensor) -> bool:
    """Whether tensor descriptors can address these (B, H, T, D) tensors: unit stride along D, every other stride
    and the base address on 16-byte boundaries."""
    for t in tiles:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s * size % 16 for s in t.stride()[:-1]):
            return False
    return True


def _use_tma(cfg: LaunchConfig, *tiles: torch.Tensor) -> bool:
    """Whether a pass launched with cfg streams these tensors' tiles through tensor descriptors: if cfg asks for it
    and descriptors fit them. The descriptors are built in the kernel, in scratch memory."""
    if not cfg.tma or not _descriptors_fit(*tiles):
        return False
    provide_tma_scratch()
    return True


def launch_forward(
    q, k, v, o, lse, params: AttentionParams, cfg: LaunchConfig, masks: FlashMask | None = None
) -> Launch:
    """o (B, H, Tq, D) and lse (B, H, Tq) fp32 from q (B, H, Tq, D) and k, v (B, H, Tk, D)."""
    masks = masks or NO_MASKS
    tma = _use_tma(cfg, k, v)
    batch, heads, seq_len_q, _ = q.shape
    seq_len_k = k.shape[2]
    qk_scale, *rng = params.scalars
    return _launch(
        flash_fwd_kernel, (_cdiv(seq_len_q, cfg.block_m), batch * heads),
        q, k, v, o, lse, q.stride(), k.stride(), v.stride(), o.stride(),
        heads, seq_len_q, seq_len_k, qk_scale, *rng,
        *_mask_args(masks, cfg, "fwd"), EXTRA_MASKS=masks.any, RAGGED=seq_len_k % cfg.block_n != 0,
        ONE_LOOP=one_loop("fwd", masks, params.dropout, seq_len_k), TMA=tma, **_flags(q, params, cfg, masks),
    )  # fmt: skip


def launch_preprocess(o, do, delta, dlse=None, dq_acc=None) -> Launch:
    """delta (B, H, Tq) fp32 = rowsum(dO ∘ O) − dlse (dlse: an optional gradient of the returned LSE); zeroes
    dq_acc (B, H, Tq, D) fp32 contiguous if given."""
    batch, heads, seq_len, head_dim = o.shape
    dlse = dlse.contiguous() if dlse is not None else None  # often an expanded (stride 0) tensor of ones
    return _launch(
        flash_bwd_preprocess_kernel, (_cdiv(seq_len, PREPROCESS_BLOCK_M), batch * heads), o, do, dlse, delta, dq_acc,
        o.stride(), do.stride(), heads, seq_len, HEAD_DIM=head_dim, BLOCK_M=PREPROCESS_BLOCK_M,
    )  # fmt: skip


def launch_dq_convert(dq_acc, dq, softmax_scale: float) -> Launch:
    """dq = softmax_scale · dq_acc, cast to dq's dtype (dq_acc: the fused pass's fp32 sums)."""
    batch, heads, seq_len, head_dim = dq.shape
    return _launch(
        flash_bwd_dq_convert_kernel, (_cdiv(seq_len, PREPROCESS_BLOCK_M), batch * heads), dq_acc, dq, dq.stride(),
        heads, seq_len, softmax_scale, HEAD_DIM=head_dim, BLOCK_M=PREPROCESS_BLOCK_M,
    )  # fmt: skip


def launch_dkdv(
    q,
    k,
    v,
    do,
    lse,
    delta,
    dk,
    dv,
    params: AttentionParams,
    cfg: LaunchConfig,
    masks: FlashMask | None = None,
    *,
    dq_acc: torch.Tensor | None = None,
    dq_reduce: str = "none",
) -> Launch:
    """dk, dv (B, H, Tk, D); with dq_reduce "atomic" or "tma" also adds dS·K into dq_acc (B, H, Tq, D) fp32
    contiguous, zeroed beforehand (`launch_preprocess`), through element-wise atomics or bulk tensor reduce-adds.
    The mask's schedules are those of the pass whose tiles cfg holds: bwd_fused with dq_reduce, else bwd_dkdv."""
    masks = masks or NO_MASKS
    batch, heads, seq_len_q, _ = q.shape
    seq_len_k = k.shape[2]
    tma = _use_tma(cfg, q, do)
    if dq_reduce == "tma":
        provide_tma_scratch()
    return _launch(
        flash_bwd_dkdv_kernel, (_cdiv(seq_len_k, cfg.block_n), batch * heads), q, k, v, do, lse, delta, dk, dv, dq_acc,
        q.stride(), k.stride(), v.stride(), do.stride(), dk.stride(), dv.stride(),
        heads, seq_len_q, seq_len_k, params.softmax_scale, *params.scalars,
        *_mask_args(masks, cfg, "bwd_fused" if dq_reduce != "none" else "bwd_dkdv"),
        DENSE=not masks.any and seq_len_q == seq_len_k, RAGGED=seq_len_q % cfg.block_m != 0,
        ONE_LOOP=one_loop("bwd_dkdv" if dq_reduce == "none" else "bwd_fused", masks, params.dropout, seq_len_k),
        DQ_REDUCE=dq_reduce, TMA=tma,
        **_flags(q, params, cfg, masks),
    )  # fmt: skip


# The Gluon pass that may take a Triton pass's place under masks (`_gluon_masks`).
GLUON_PASSES = {"fwd": "fwd_hopper", "bwd_dq": "bwd_dq_hopper", "bwd_dkdv": "bwd_dkdv_hopper",
                "bwd_fused": "bwd_fused_hopper"}  # fmt: skip


def _gluon_masks(kernel_pass: str, masks: FlashMask, causal: bool, cfg: LaunchConfig) -> bool:
    """Whether the Gluon pass `kernel_pass` takes these masks at cfg: none; or, causal, a sliding window, document
    ids and a block mask, the latter two where the mask holds a schedule for the pass's tiling (`flash_mask` builds
    them where the passes are Gluon ones) and a block mask's blocks hold its tiles whole."""
    if not masks.any:
        return True
    if not causal:
        return False
    if masks.block_mask is not None and not masks.block_exact(cfg.block_m, cfg.block_n):
        return False
    return (masks.document_ids is None and masks.block_mask is None) or tile_key(kernel_pass, cfg) in masks.tiles


def hopper_launch_config(
    kernel_pass: str, q, k, v, o, do, params: AttentionParams, masks: FlashMask
) -> LaunchConfig | None:
    """The configuration of the Gluon pass `kernel_pass` ("fwd_hopper": `flash_fwd_hopper.py`, "bwd_dq_hopper":
    `flash_bwd_dq_hopper.py`, "bwd_dkdv_hopper": `flash_bwd_dkdv_hopper.py`, "bwd_fused_hopper":
    `flash_bwd_fused_hopper.py`) where the call should take it instead of the Triton pass: on Hopper, outside the
    interpreter, with the masks it takes (`_gluon_masks`), with or without dropout (each pass draws the mask
    itself), bf16 or fp16 (both checked on the GPU), tensors that descriptors fit (o: the forward's output or
    the backward's input; do: the backward's, None for the forward), a shape the table measured it faster for
    (masked calls take the dense configuration, fitted to the masks: `gluon_config`), and the tested
    Triton. Else None."""
    # The kernel is looked up by name, so that a test can take one away as another Triton release would.
    if globals()[f"flash_{kernel_pass}_kernel"] is None or q.dtype not in (torch.bfloat16, torch.float16):
        return None
    cfg = gluon_config(
        kernel_pass, q.shape[-1], dtype_name(q.dtype), params.causal, params.dropout, k.shape[2],
        window=masks.window_size is not None, documents=masks.document_ids is not None,
        block_size=masks.block_size if masks.block_mask is not None else None,
    )  # fmt: skip
    if (
        cfg is None
        or interpreting()
        or not is_hopper(q.device)
        or not _gluon_masks(kernel_pass, masks, params.causal, cfg)
    ):
        return None
    return cfg if _descriptors_fit(*(t for t in (q, k, v, o, do) if t is not None)) else None


def heads_fastest(kernel_pass: str, masks: FlashMask) -> bool:
    """Whether the Gluon pass `kernel_pass` (forward, dQ or dK/dV) launches a grid of (B·H, tiles) rather than
    (tiles, B·H) under these masks (`gluon_common.tile_and_head`). A grid of (tiles, B·H) runs a head's programs
    together, so that they share its rows in L2; but walks under documents differ in length by up to T / tile, and
    in that grid the last heads' longest walks start last and finish long after the rest. In a grid of (B·H, tiles)
    every head's tile t launches before any head's t + 1: documents ran 1.11-1.15x faster at 16K, every pass
    alike. Block masks keep (tiles, B·H): strided walks reach across the keys, and spread over every head they lose
    L2 (0.96-0.99x for the dK/dV pass alone, 0.89-0.94x for all three; `results/tuning/h200-2026-11-27-grid-masks/`).
    Their few long walks (a global column) go first instead, in the dK/dV pass (`_walk_order`)."""
    return masks.document_ids is not None


def gluon_grid(tiles: int, batch_heads: int, heads_first: bool) -> tuple[int, int]:
    """The grid of a Gluon forward, dQ or dK/dV pass (heads_first: `heads_fastest`)."""
    return (batch_heads, tiles) if heads_first else (tiles, batch_heads)


def _gluon_mask_args(masks: FlashMask, kernel_pass: str, cfg: LaunchConfig) -> tuple:
    """(window_size, documents, blocks) of a Gluon pass (`_gluon_masks`), as `_mask_args` gives a Triton pass's but
    for the block mask itself, which the Gluon passes' tiles fit whole: blocks = (KeptCount, stride_h, KeptIndex,
    stride_h, stride_r)."""
    return _mask_args(masks, cfg, kernel_pass, element_mask=False)


def _walk_order(kernel_pass: str, masks: FlashMask, cfg: LaunchConfig) -> torch.Tensor | None:
    """The order the programs of a Gluon pass over key tiles (`kernel_pass`: the dK/dV or the fused backward) take
    their key tiles in under a block mask (long walks first,
    `gluon_common.long_walks_first`); None without one. Under local + global, whose first key tiles every query
    sees, the pass ran 1.46x faster at 16K (0.390 -> 0.267 ms), fwd+bwd 1.18x, and 1.03x at 64K; strided and
    butterfly, whose walks are even, kept their speed (`results/tuning/h200-2026-11-27-long-walks/`). The forward
    and dQ passes' walks are even under every block mask the project names (a causal global row sees one tile)."""
    return masks.tile_schedule(kernel_pass, cfg).order if masks.block_mask is not None else None


def launch_forward_hopper(
    q, k, v, o, lse, params: AttentionParams, cfg: LaunchConfig, masks: FlashMask = NO_MASKS
) -> Launch:
    """o (B, H, Tq, D) and lse (B, H, Tq) through the Gluon forward, at cfg (`hopper_launch_config`): a program of
    cfg.block_m // 64 math warpgroups of 64 query rows each, which store O by TMA: o must suit a tensor descriptor
    (`hopper_launch_config` checks, given o and the masks); with dropout, the mask of params' seed and offset."""
    batch, heads, seq_len_q, _ = q.shape
    first = heads_fastest("fwd_hopper", masks)
    grid = gluon_grid(_cdiv(seq_len_q, cfg.block_m), batch * heads, first)
    return _launch(
        flash_fwd_hopper_kernel, grid, head_descriptor(q, 64), head_descriptor(k, cfg.block_n),
        head_descriptor(v, cfg.block_n), head_descriptor(o, 64), lse, heads, seq_len_q, k.shape[2],
        params.softmax_scale, *params.scalars[1:], *_gluon_mask_args(masks, "fwd_hopper", cfg),
        STAGES=cfg.num_stages, CONSUMERS=cfg.block_m // 64, CAUSAL=params.causal,
        WINDOW=masks.window_size is not None, HEADS_FASTEST=first, DROPOUT=params.dropout, num_warps=4,
        maxnreg=cfg.maxnreg,
    )  # fmt: skip


def launch_dq_hopper(
    q, k, v, do, o, lse, dlse, delta, dq, params: AttentionParams, cfg: LaunchConfig, masks: FlashMask = NO_MASKS
) -> Launch:
    """dq (B, H, Tq, D) through the Gluon pass, at cfg (`hopper_launch_config`), which also writes delta =
    rowsum(dO ∘ O) − dlse for the dK/dV pass, as `launch_dq` does given o. dq is stored by TMA: a tensor descriptor
    must fit it, as it fits q when dq is q's `empty_like`."""
    batch, heads, seq_len_q, _ = q.shape
    m, n = cfg.block_m, cfg.block_n
    first = heads_fastest("bwd_dq_hopper", masks)
    return _launch(
        flash_bwd_dq_hopper_kernel, gluon_grid(_cdiv(seq_len_q, m), batch * heads, first), head_descriptor(q, m),
        head_descriptor(k, n), head_descriptor(v, n), head_descriptor(do, m), do, o, lse, dlse, delta,
        head_descriptor(dq, m), do.stride()[:3], o.stride()[:3],  # every D stride is 1
        heads, seq_len_q, k.shape[2], params.softmax_scale, *params.scalars[1:],
        *_gluon_mask_args(masks, "bwd_dq_hopper", cfg), STAGES=cfg.num_stages, CAUSAL=params.causal,
        WINDOW=masks.window_size is not None, HEADS_FASTEST=first, DROPOUT=params.dropout,
        num_warps=cfg.num_warps, maxnreg=cfg.maxnreg,
    )  # fmt: skip


def launch_dkdv_hopper(
    q, k, v, do, lse, delta, dk, dv, params: AttentionParams, cfg: LaunchConfig, masks: FlashMask = NO_MASKS
) -> Launch:
    """dk, dv (B, H, Tk, D) through the Gluon pass, at cfg (`hopper_launch_config`): a program of cfg.block_n // 64
    math warpgroups of 64 keys each; delta as the dQ pass leaves it; with dropout, the mask of params' seed and
    offset. dk and dv are stored by TMA: tensor descriptors must fit them, as they fit k and v when dk and dv are
    their `empty_like`."""
    batch, heads, seq_len_q, _ = q.shape
    seq_len_k = k.shape[2]
    m, n = cfg.block_m, cfg.block_n
    first = heads_fastest("bwd_dkdv_hopper", masks)
    return _launch(
        flash_bwd_dkdv_hopper_kernel, gluon_grid(_cdiv(seq_len_k, n), batch * heads, first), head_descriptor(q, m),
        head_descriptor(k, 64), head_descriptor(v, 64), head_descriptor(do, m), lse, delta, head_descriptor(dk, 64),
        head_descriptor(dv, 64), heads, seq_len_q, seq_len_k, params.softmax_scale, *params.scalars[1:],
        *_gluon_mask_args(masks, "bwd_dkdv_hopper", cfg), _walk_order("bwd_dkdv_hopper", masks, cfg),
        STAGES=cfg.num_stages,
        CONSUMERS=n // 64,
        CAUSAL=params.causal, WINDOW=masks.window_size is not None, HEADS_FASTEST=first, DROPOUT=params.dropout,
        num_warps=4, maxnreg=cfg.maxnreg,
    )  # fmt: skip


def has_dq_warpgroup(cfg: LaunchConfig, head_dim: int, masks: FlashMask, dropout: bool) -> bool:
    """Whether the Gluon fused backward at cfg runs a dQ warpgroup (`flash_bwd_fused_hopper._dq_warpgroup`): its two
    math warpgroups hand their dS to a third, which sums dQ and sends it. At D = 64 on 64 × 128 tiles, dense calls
    and masked calls without dropout, and on 32 × 128 tiles masked calls with dropout; at D = 128 on 32 × 128 tiles,
    dense calls without dropout. Those are the calls it was measured faster for (`gluon_config` and
    `fit_gluon_to_masks` pick those tiles only where it was: `results/tuning/h200-2026-11-28-dq-warpgroup-all/`,
    `../h200-2026-11-28-masked-dq-warpgroup/`); other calls on these tiles (with dropout at D = 128) keep two
    warpgroups that each send their own dQ."""
    if head_dim > 64:
        return (cfg.block_m, cfg.block_n) == (32, 128) and not masks.any and not dropout
    return cfg.block_n == 128 and cfg.block_m == (32 if dropout and masks.any else 64)


def launch_fused_hopper(
    q, k, v, do, lse, delta, dk, dv, dq_acc, params: AttentionParams, cfg: LaunchConfig, masks: FlashMask = NO_MASKS
) -> Launch:
    """dk, dv (B, H, Tk, D), and dS·K added into dq_acc (B, H, Tq, D) fp32 contiguous, through the Gluon fused
    backward at cfg (`hopper_launch_config`): programs of cfg.block_n // 64 math warpgroups of 64 keys each, under
    the masks as the dK/dV pass takes them. δ and the zeroed dq_acc come from `launch_preprocess`, dq from
    `launch_dq_convert`; dk and dv are stored by TMA, as in `launch_dkdv_hopper`."""
    batch, heads, seq_len_q, head_dim = q.shape
    seq_len_k = k.shape[2]
    m, n = cfg.block_m, cfg.block_n
    first = heads_fastest("bwd_fused_hopper", masks)
    paired = has_dq_warpgroup(cfg, head_dim, masks, params.dropout)
    return _launch(
        flash_bwd_fused_hopper_kernel, gluon_grid(_cdiv(seq_len_k, n), batch * heads, first), head_descriptor(q, m),
        head_descriptor(k, 64), head_descriptor(v, 64), head_descriptor(do, m), lse, delta, head_descriptor(dk, 64),
        head_descriptor(dv, 64), head_descriptor(dq_acc, m), heads, seq_len_q, seq_len_k, params.softmax_scale,
        *params.scalars[1:], *_gluon_mask_args(masks, "bwd_fused_hopper", cfg),
        _walk_order("bwd_fused_hopper", masks, cfg), STAGES=cfg.num_stages, CONSUMERS=n // 64, PAIRED_DQ=paired,
        CAUSAL=params.causal, WINDOW=masks.window_size is not None, HEADS_FASTEST=first, DROPOUT=params.dropout,
        num_warps=4, maxnreg=cfg.maxnreg,
    )  # fmt: skip


def launch_dq(
    q,
    k,
    v,
    do,
    lse,
    delta,
    dq,
    params: AttentionParams,
    cfg: LaunchConfig,
    masks: FlashMask | None = None,
    *,
    o: torch.Tensor | None = None,
    dlse: torch.Tensor | None = None,
) -> Launch:
    """dq (B, H, Tq, D). Given the forward's output o, the kernel also computes delta = rowsum(dO ∘ O) − dlse
    (dlse: an optional gradient of the returned LSE) and writes it for launch_dkdv, which must run after it;
    without o, delta must hold it already (launch_preprocess)."""
    masks = masks or NO_MASKS
    batch, heads, seq_len_q, _ = q.shape
    seq_len_k = k.shape[2]
    tma = _use_tma(cfg, k, v)
    o_strides = o.stride() if o is not None else (0, 0, 0, 0)
    dlse = dlse.contiguous() if dlse is not None else None  # often an expanded (stride 0) tensor of ones
    return _launch(
        flash_bwd_dq_kernel, (_cdiv(seq_len_q, cfg.block_m), batch * heads), q, k, v, do, o, lse, dlse, delta, dq,
        q.stride(), k.stride(), v.stride(), do.stride(), dq.stride(), o_strides,
        heads, seq_len_q, seq_len_k, params.softmax_scale, *params.scalars,
        *_mask_args(masks, cfg, "bwd_dq"), EXTRA_MASKS=masks.any, RAGGED=seq_len_k % cfg.block_n != 0,
        ONE_LOOP=one_loop("bwd_dq", masks, params.dropout, seq_len_k), FUSED_DELTA=o is not None, TMA=tma,
        **_flags(q, params, cfg, masks),
    )  # fmt: skip
