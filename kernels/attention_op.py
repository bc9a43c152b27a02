"""`flash_attention`: argument checks, the PyTorch operators that launch the kernels, and their autograd.

The kernels run inside two `torch.library` custom operators, so `torch.compile` traces a model through them
(static or dynamic shapes, no graph break) and AOTAutograd sees their backward:

    flashgpt::flash_attention_forward(q, k, v, rng_state, causal, dropout_p, softmax_scale, window_size,
        document_ids, block_mask, block_size, schedule, schedule_tiles) -> (o, lse)
    flashgpt::flash_attention_backward(do, q, k, v, o, lse, dlse, rng_state, causal, dropout_p, softmax_scale,
        window_size, document_ids, block_mask, block_size, schedule, schedule_tiles) -> (dq, dk, dv)

Both are pure functions of their inputs; the launch configuration is looked up inside them at run time. Document
ids and block masks come with their tile schedules (`tile_schedule.FlashMask`: one int32 tensor and its tilings
as ints), built outside the operators, once per batch by `flash_mask` or once per call by `flash_attention`, so
the operators run no schedule operation and the backward reuses the forward's.

Dropout randomness: `rng_state` is a CPU int64 tensor [seed, offset] drawn by `torch.randint` in
`flash_attention`, i.e. from PyTorch's default CPU generator, so `torch.manual_seed` (and a checkpoint's saved
generator state) reproduces the mask. Under `torch.compile` it is a random op in the graph, drawn afresh on every
call, never a constant baked into the graph. Drawing it outside the operator is deliberate: the compiler merges
identical calls of a pure operator (common-subexpression elimination), so an operator that drew its own seed
would give two identical dropout calls in one graph the same mask; random ops are exempt from that and from
being recomputed in the backward. The backward reads the same tensor from the forward's saved inputs, with no
device sync.

Gradients: the backward kernels take δ = rowsum(dO ∘ O) per query row. A gradient dlse flowing into the returned
log-sum-exp adds dlse·P to dS (∂lse/∂s = P), which is the same as using δ' = δ − dlse, so the dQ kernel, which
computes δ, subtracts it and nothing else changes. The backward is not itself differentiable: asking for a second
derivative raises instead of returning a wrong value.

Head dims: the kernels are compiled for D in NATIVE_HEAD_DIMS; any other multiple of 8 up to 256 is zero-padded
to the next native one. That is exact: zero columns add nothing to q·kᵀ, the padded output and gradient columns
are sliced away, and the softmax scale stays 1/√D of the caller's D.
"""

import functools
import math
import numbers
import operator
import weakref

import torch
from torch import Tensor

from flashgpt.attention_masks import validate_masks

from . import launch_plans
from .dropout import check_dropout_p
from .launch import (
    NO_MASKS,
    AttentionParams,
    backward_schedule_for,
    hopper_launch_config,
    interpreting,
    is_hopper,
    launch_dkdv,
    launch_dkdv_hopper,
    launch_dq,
    launch_dq_convert,
    launch_dq_hopper,
    launch_forward,
    launch_forward_hopper,
    launch_fused_hopper,
    launch_preprocess,
    launch_tiles,
    tuned_config,
)
from .tile_schedule import FlashMask, TileKey
from .tuning import NATIVE_HEAD_DIMS, PASSES, LaunchConfig, seq_len_bucket

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIM_MULTIPLE = 8
MAX_HEAD_DIM = NATIVE_HEAD_DIMS[-1]
# Dropout counters are 32-bit: ((row // 32)·4 + 4)·⌈T/16⌉·8 (dropout.py) must stay within 2³², i.e. T <= 2¹⁸.
MAX_DROPOUT_SEQ_LEN = 262_144


def native_head_dim(head_dim: int) -> int:
    """The kernel head dim that `head_dim` runs at: itself if native, else the next native one (zero-padded)."""
    return next(d for d in NATIVE_HEAD_DIMS if d >= head_dim)


def _check_head_dim(head_dim: int, caller: str) -> None:
    if head_dim % HEAD_DIM_MULTIPLE or not NATIVE_HEAD_DIMS[0] <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"{caller}: head dim {head_dim} is not supported; supported: multiples of {HEAD_DIM_MULTIPLE} "
            f"from {NATIVE_HEAD_DIMS[0]} to {MAX_HEAD_DIM}"
        )


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float) -> None:
    # Every eager call runs this: each property is read once (a tensor's shape, device and strides are new Python
    # objects on every access).
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"flash_attention: {name} must have shape (B, H, T, D), got {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"flash_attention: {name} has dtype {t.dtype}; supported: float16, bfloat16 (GPU) and float32"
            )
    q_shape, k_shape = q.shape, k.shape
    if k_shape != v.shape or q_shape[:2] != k_shape[:2] or q_shape[3] != k_shape[3]:
        raise ValueError(
            "flash_attention: k and v must have the same shape (B, H, Tk, D) and q (B, H, Tq, D), got "
            f"{tuple(q_shape)}, {tuple(k_shape)}, {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"flash_attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    device = q.device
    if not (device == k.device == v.device):
        raise ValueError(f"flash_attention: q, k, v must be on one device, got {device}, {k.device}, {v.device}")
    if device.type != "cuda":
        if device.type != "cpu":
            raise ValueError(f"flash_attention: unsupported device {device}; use CUDA (or CPU when interpreting)")
        if not interpreting():
            raise ValueError(
                "flash_attention: q is a CPU tensor; the kernel needs CUDA tensors, or TRITON_INTERPRET=1 set "
                "before `flashgpt.kernels` is first imported to run through the Triton interpreter"
            )
    if causal is not True and causal is not False:
        raise TypeError(f"flash_attention: causal must be a bool, got {causal!r}")
    batch, heads, seq_len, head_dim = q_shape
    validate_masks(seq_len, k_shape[2], caller="flash_attention")  # with no masks: Tq <= Tk
    _check_head_dim(head_dim, "flash_attention")
    if seq_len < 1 or batch < 1 or heads < 1:
        raise ValueError(f"flash_attention: empty input of shape {tuple(q_shape)}")
    if type(dropout_p) is not float or dropout_p != 0.0:  # 0.0 is the common case and valid
        check_dropout_p(dropout_p)
    if dropout_p > 0 and k_shape[2] > MAX_DROPOUT_SEQ_LEN:  # rows are at most Tk too
        raise ValueError(
            f"flash_attention: dropout supports sequences up to {MAX_DROPOUT_SEQ_LEN} tokens, got {k_shape[2]}"
        )
    for name, t, rows in (("q", q, seq_len), ("k", k, k_shape[2]), ("v", v, k_shape[2])):
        # Offsets inside one (batch, head) are 32-bit in the kernels; batch and head offsets are 64-bit.
        _, _, stride_t, stride_d = t.stride()
        if (rows - 1) * stride_t + (head_dim - 1) * stride_d >= 2**31:
            raise ValueError(f"flash_attention: {name} spans more than 2³¹ elements within one head")


# What _check_inputs read of the calls it passed; each is a set of checked properties, not of tensors.
_CHECKED_INPUTS: set[tuple] = set()
MAX_CHECKED_INPUTS = 256


def _check_inputs_once(q: Tensor, k: Tensor, v: Tensor, causal: bool, dropout_p: float, eager: bool) -> None:
    """_check_inputs, skipped in eager mode (`_plain_eager(q)`) for plain tensors whose shapes, strides, dtypes and
    devices, with the same causal and dropout_p (value and type), passed it before (everything it reads): a model's
    layers repeat one call. Traced code checks every call, so that the compiler neither guards on this cache nor
    specialises."""
    if not (eager and type(k) is torch.Tensor and type(v) is torch.Tensor):
        _check_inputs(q, k, v, causal, dropout_p)
        return
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
           k.device, v.device, type(causal), causal, type(dropout_p), dropout_p, interpreting())  # fmt: skip
    if key not in _CHECKED_INPUTS:
        _check_inputs(q, k, v, causal, dropout_p)
        if len(_CHECKED_INPUTS) >= MAX_CHECKED_INPUTS:
            _CHECKED_INPUTS.clear()
        _CHECKED_INPUTS.add(key)


def _check_masks(
    q: Tensor,
    k: Tensor,
    window_size: int | None,
    document_ids: Tensor | None,
    block_mask: Tensor | None,
    block_size: int,
) -> None:
    """The contract of `flashgpt.attention_masks`: shapes, dtypes and devices of the masks, Tq <= Tk."""
    batch, heads, seq_len_q, _ = q.shape
    validate_masks(
        seq_len_q, k.shape[2], window_size=window_size, document_ids=document_ids, block_mask=block_mask,
        block_size=block_size, batch=batch, heads=heads, device=q.device, caller="flash_attention",
    )  # fmt: skip


def _check_options(softmax_scale: float | None, return_lse: bool) -> None:
    if softmax_scale is not None and (
        not isinstance(softmax_scale, numbers.Real)
        or isinstance(softmax_scale, bool)
        or not math.isfinite(softmax_scale)
    ):
        raise ValueError(
            f"flash_attention: softmax_scale must be a finite number or None (for 1/√D), got {softmax_scale!r}"
        )
    if not isinstance(return_lse, bool):
        raise TypeError(f"flash_attention: return_lse must be a bool, got {return_lse!r}")


def _build_mask(
    seq_len_q: int,
    seq_len_k: int,
    head_dim: int,
    dtype: torch.dtype,
    causal: bool,
    dropout_p: float,
    window_size: int | None,
    document_ids: Tensor | None,
    block_mask: Tensor | None,
    block_size: int,
    backward: bool,
) -> FlashMask:
    """`flash_mask` for validated arguments."""
    window_size, block_size = None if window_size is None else int(window_size), int(block_size)
    passes = PASSES if backward else ("fwd",)
    tiles: tuple[TileKey, ...] = ()
    if document_ids is not None or block_mask is not None:
        device = (document_ids if document_ids is not None else block_mask).device
        # Only Python constants go to launch_tiles, so that torch.compile neither breaks the graph nor guards on
        # more than the T bucket: a branch specialises a dropout_p traced as a symbolic float, operator.index a
        # symbolic block_size.
        dropout = True if dropout_p > 0 else False  # noqa: SIM210
        fit = operator.index(block_size) if block_mask is not None else None
        tiles = launch_tiles(passes, native_head_dim(head_dim), dtype, device.type, device.index, causal, dropout,
                             seq_len_bucket(seq_len_k), fit, document_ids is not None)  # fmt: skip
    return FlashMask.build(seq_len_q, seq_len_k, tiles, window_size=window_size, document_ids=document_ids,
                           block_mask=block_mask, block_size=block_size, passes=passes)  # fmt: skip


def flash_mask(
    seq_len_q: int,
    seq_len_k: int,
    *,
    head_dim: int,
    dtype: torch.dtype,
    causal: bool = True,
    dropout_p: float = 0.0,
    window_size: int | None = None,
    document_ids: Tensor | None = None,
    block_mask: Tensor | None = None,
    block_size: int = 128,
    backward: bool = True,
) -> FlashMask:
    """The masks of `flash_attention` (same arguments and semantics) with their tile schedules, built once for
    every call on queries of seq_len_q rows, head_dim and dtype and keys of seq_len_k rows with these causal and
    dropout_p, e.g. every layer of a model step: `flash_attention(q, k, v, mask=flash_mask(...))`. The tiles depend
    on those arguments, so a call that launches others raises. backward=False builds the forward's schedule only,
    for calls that need no gradient. Like FlexAttention's create_block_mask, this launches a few dozen small tensor
    operations on the masks' device; under torch.compile it is traced into the graph."""
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"flash_mask: dtype {dtype} is not supported; supported: float16, bfloat16 and float32")
    _check_head_dim(head_dim, "flash_mask")
    check_dropout_p(dropout_p)
    validate_masks(
        seq_len_q, seq_len_k, window_size=window_size, document_ids=document_ids, block_mask=block_mask,
        block_size=block_size, caller="flash_mask",
    )  # fmt: skip
    if document_ids is not None and block_mask is not None and document_ids.device != block_mask.device:
        raise ValueError(f"flash_mask: document_ids is on {document_ids.device} but block_mask on {block_mask.device}")
    return _build_mask(seq_len_q, seq_len_k, head_dim, dtype, causal, dropout_p, window_size, document_ids,
                       block_mask, block_size, backward)  # fmt: skip


# The calls (shapes, device, backward) each live mask was found to fit: checked once, not in every layer.
_MASK_FITS: "weakref.WeakKeyDictionary[FlashMask, set]" = weakref.WeakKeyDictionary()


def _check_prebuilt(mask: FlashMask, q: Tensor, k: Tensor, backward: bool, eager: bool) -> None:
    """A mask from flash_mask fits this call's shapes and devices, and has the backward's schedules if needed:
    checked once per mask and call shape in eager mode, on every call when traced (symbolic shapes). The operators
    check that it holds the tiles they launch with (which depend on the dtype, head dim, causal and dropout_p it was
    built for)."""
    if not isinstance(mask, FlashMask):
        raise TypeError(f"flash_attention: mask must be a FlashMask from flash_mask, got {type(mask).__name__}")
    call = (q.shape[:3], k.shape[2], q.device, backward)  # all that the checks below read of the call
    if eager and call in _MASK_FITS.get(mask, ()):  # every layer of a model step passes one mask, one shape
        return
    if (q.shape[2], k.shape[2]) != (mask.seq_len_q, mask.seq_len_k):
        raise ValueError(
            f"flash_attention: mask was built for Tq={mask.seq_len_q}, Tk={mask.seq_len_k}, but q has Tq={q.shape[2]} "
            f"and k Tk={k.shape[2]}"
        )
    _check_masks(q, k, mask.window_size, mask.document_ids, mask.block_mask, mask.block_size)
    mask.check_schedule("flash_attention")
    if backward and mask.schedule is not None and mask.passes != PASSES:
        raise ValueError(
            f"flash_attention: mask was built for the passes {', '.join(mask.passes)} only (flash_mask with "
            "backward=False), but q, k or v requires grad"
        )
    if eager:
        _MASK_FITS.setdefault(mask, set()).add(call)


def _kernel_masks(
    q: Tensor,
    k: Tensor,
    window_size: int | None,
    document_ids: Tensor | None,
    block_mask: Tensor | None,
    block_size: int,
    schedule: Tensor | None,
    schedule_tiles: list[int] | None,
) -> FlashMask:
    """The operators' mask arguments as the launches take them."""
    if window_size is None and document_ids is None and block_mask is None:  # the common case, on every call
        return NO_MASKS
    return FlashMask.from_operator_args(
        q.shape[2], k.shape[2], window_size, document_ids, block_mask, block_size, schedule, schedule_tiles
    )


def _call_signature(q: Tensor, k: Tensor, v: Tensor, params: AttentionParams, masks: FlashMask) -> tuple:
    """What a forward's launches depend on (launch_plans), and a backward's besides o and do: the signatures of q,
    k and v, the dtype, q's device and the current one, the options, the window (a plan table is per tensor mask)
    and the integer widths of the seed and offset."""
    options = (params.causal, params.dropout_p, params.softmax_scale, masks.window_size)
    device = (q.get_device(), torch._C._cuda_getDevice() if q.is_cuda else -1)
    widths = launch_plans.int_widths(params.scalars[1:4])
    return (*launch_plans.signature(q, k, v), q.dtype, *device, *options, *widths)


def _fit(k: Tensor, masks: FlashMask) -> dict:
    """tuned_config's arguments besides the pass: Tk, and the block size that tiles must fit."""
    return {"seq_len_k": k.shape[2], "block_size": masks.block_size if masks.block_mask is not None else None}


def dq_reduce(q: Tensor) -> str:
    """How the fused backward sums dQ: bulk tensor reduce-adds on Hopper, element-wise atomics elsewhere (and in the
    interpreter, which has no tensor-descriptor reductions)."""
    return "tma" if is_hopper(q.device) else "atomic"


def _draw_rng_state() -> Tensor:
    """[seed, offset] of a dropout mask: 2 x 62 random bits from PyTorch's default CPU generator."""
    return torch.randint(0, 2**62, (2,), dtype=torch.int64)


def _params(
    causal: bool, dropout_p: float, softmax_scale: float | None, head_dim: int, rng_state: Tensor | None
) -> AttentionParams:
    if softmax_scale is not None and softmax_scale < 0:
        raise ValueError(f"the kernels take softmax_scale >= 0 (flash_attention negates q), got {softmax_scale}")
    if rng_state is None or dropout_p == 0:
        return _params_without_dropout_draw(causal, dropout_p, softmax_scale, head_dim)
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    seed, offset = rng_state.tolist()
    return AttentionParams(causal, dropout_p, scale, seed, offset)


@functools.lru_cache(maxsize=256)  # the same few per model: one object, its kernel scalars computed once
def _params_without_dropout_draw(
    causal: bool, dropout_p: float, softmax_scale: float | None, head_dim: int
) -> AttentionParams:
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    return AttentionParams(causal, dropout_p, scale)


def _pad_head_dim(t: Tensor, native: int) -> Tensor:
    return torch.nn.functional.pad(t, (0, native - t.shape[-1]))


def _padded_empty(like: Tensor, native: int) -> Tensor:
    """An output for a padded head dim: the first D columns of a contiguous (..., native) buffer."""
    return like.new_empty((*like.shape[:-1], native))[..., : like.shape[-1]]


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rng_state: Tensor | None,
    causal: bool,
    dropout_p: float,
    softmax_scale: float | None,
    window_size: int | None = None,
    document_ids: Tensor | None = None,
    block_mask: Tensor | None = None,
    block_size: int = 128,
    schedule: Tensor | None = None,
    schedule_tiles: list[int] | None = None,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor]:
    """o (B, H, Tq, D) and lse (B, H, Tq) fp32. Inputs are assumed checked (`flash_attention` does that).
    `deterministic` is for the backward (bit-identical gradients from run to run)."""
    masks = _kernel_masks(q, k, window_size, document_ids, block_mask, block_size, schedule, schedule_tiles)
    return _attention_forward(q, k, v, rng_state, causal, dropout_p, softmax_scale, masks)


def _attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rng_state: Tensor | None,
    causal: bool,
    dropout_p: float,
    softmax_scale: float | None,
    masks: FlashMask,
) -> tuple[Tensor, Tensor]:
    """`_forward` with its masks as one FlashMask."""
    params = _params(causal, dropout_p, softmax_scale, q.shape[-1], rng_state)
    o, lse, _ = _forward_launches(q, k, v, params, masks)
    return o, lse


def _forward_launches(
    q: Tensor, k: Tensor, v: Tensor, params: AttentionParams, masks: FlashMask
) -> tuple[Tensor, Tensor, tuple]:
    """o, lse and the call's signature (`_call_signature`), which the backward's plan key starts from."""
    batch, heads, seq_len, head_dim = q.shape
    call = _call_signature(q, k, v, params, masks)
    native = native_head_dim(head_dim)
    if native != head_dim:
        q, k, v = (_pad_head_dim(t, native) for t in (q, k, v))
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, seq_len), device=q.device, dtype=torch.float32)

    def launch() -> list:
        if (hopper := hopper_launch_config("fwd_hopper", q, k, v, o, None, params, masks)) is not None:
            return [launch_forward_hopper(q, k, v, o, lse, params, hopper, masks)]
        return [launch_forward(q, k, v, o, lse, params, tuned_config("fwd", q, params, **_fit(k, masks)), masks)]

    launch_plans.launch_or_replay(masks, ("fwd", call), (q, k, v, o, lse, *params.scalars[1:4]), launch)
    return (o[..., :head_dim] if native != head_dim else o), lse, call


flash_attention_forward = torch.library.custom_op("flashgpt::flash_attention_forward", _forward, mutates_args=())


@flash_attention_forward.register_fake
def _(q, k, v, rng_state, causal, dropout_p, softmax_scale, window_size=None, document_ids=None, block_mask=None,
      block_size=128, schedule=None, schedule_tiles=None, deterministic=False):  # fmt: skip
    native = native_head_dim(q.shape[-1])
    o = torch.empty_like(q) if native == q.shape[-1] else _padded_empty(q, native)
    return o, q.new_empty(q.shape[:3], dtype=torch.float32)


def _backward_kernels(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dlse: Tensor | None,
    rng_state: Tensor | None,
    causal: bool,
    dropout_p: float,
    softmax_scale: float | None,
    window_size: int | None = None,
    document_ids: Tensor | None = None,
    block_mask: Tensor | None = None,
    block_size: int = 128,
    schedule: Tensor | None = None,
    schedule_tiles: list[int] | None = None,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv from the output gradient `do` and, if not None, the log-sum-exp gradient `dlse`."""
    masks = _kernel_masks(q, k, window_size, document_ids, block_mask, block_size, schedule, schedule_tiles)
    return _attention_backward(do, q, k, v, o, lse, dlse, rng_state, causal, dropout_p, softmax_scale, masks,
                               deterministic)  # fmt: skip


def _attention_backward(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dlse: Tensor | None,
    rng_state: Tensor | None,
    causal: bool,
    dropout_p: float,
    softmax_scale: float | None,
    masks: FlashMask,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """`_backward_kernels` with its masks as one FlashMask."""
    params = _params(causal, dropout_p, softmax_scale, q.shape[-1], rng_state)
    call = _call_signature(q, k, v, params, masks)
    return _backward_launches(do, q, k, v, o, lse, dlse, params, masks, deterministic, call)


# Which backward each call signature takes (`_backward_schedule`), decided at its first call.
_BACKWARD_SCHEDULES: dict[tuple, tuple[LaunchConfig | None, bool]] = {}


def _backward_schedule(q, k, v, o, do, params: AttentionParams, masks: FlashMask, deterministic: bool) -> tuple:
    """(the Gluon fused pass's configuration or None, whether the backward is the fused one). The fused backward
    sums dQ in an order that varies between runs: only where determinism is not asked for. Its Gluon pass, where the
    table lists it for the shape (with dropout), comes before the Triton one, with masks too (under masks with
    dropout it ran 1.04-1.16x the split backward through the Gluon passes, fwd+bwd). Masks that the Gluon split
    passes take (a window, documents, a block mask) otherwise take the split backward: with documents at 16K and
    64K, fwd+bwd through the Gluon passes ran 1.14x and 1.15x the Triton forward and fused backward
    (`results/tuning/h200-2026-11-27-gluon-documents/`); with dropout at 16K the split backward through the Gluon
    passes (dQ on 64-key tiles) ran 0.99-1.33x the Triton fused one under every mask
    (`results/tuning/h200-2026-11-27-masked-dropout/`)."""
    if deterministic:
        return None, False
    fused_hopper = hopper_launch_config("bwd_fused_hopper", q, k, v, o, do, params, masks)
    if fused_hopper is not None:
        return fused_hopper, True
    if masks.any and hopper_launch_config("bwd_dkdv_hopper", q, k, v, o, do, params, masks):
        return None, False  # the Gluon passes take these masks: the split backward
    documents = masks.document_ids is not None
    split_or_fused = backward_schedule_for(q.shape[-1], q.dtype, q.device, params.causal, params.dropout, k.shape[2],
                                           documents)  # fmt: skip
    return None, split_or_fused == "fused"


def _backward_launches(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    dlse: Tensor | None,
    params: AttentionParams,
    masks: FlashMask,
    deterministic: bool,
    call: tuple,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv; call: the forward's `_call_signature`."""
    head_dim = q.shape[-1]
    dlse = dlse.contiguous() if dlse is not None else None  # often an expanded (stride 0) tensor of ones
    key = ("bwd", call, *launch_plans.signature(o, do), dlse is None, deterministic)
    native = native_head_dim(head_dim)
    if native != head_dim:
        q, k, v, o, do = (_pad_head_dim(t, native) for t in (q, k, v, o, do))
    # Everything the schedule reads of a call is in its key, masks aside: the kinds of tensor masks join it.
    schedule_key = (key, masks.document_ids is not None, masks.block_mask is not None)
    schedule = _BACKWARD_SCHEDULES.get(schedule_key)
    if schedule is None:
        if len(_BACKWARD_SCHEDULES) >= launch_plans.MAX_PLANS:
            _BACKWARD_SCHEDULES.clear()
        schedule = _BACKWARD_SCHEDULES[schedule_key] = _backward_schedule(q, k, v, o, do, params, masks,
                                                                          deterministic)  # fmt: skip
    fused_hopper, fused = schedule
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32) if fused else None

    def launch() -> list:
        cfg = lambda kernel_pass: tuned_config(kernel_pass, q, params, **_fit(k, masks))
        if fused:  # each launch runs as it is made: δ and the zeroed accumulator, the sums, dQ's cast
            launches = [launch_preprocess(o, do, delta, dlse, dq_acc)]
            if fused_hopper is not None:
                launches.append(launch_fused_hopper(q, k, v, do, lse, delta, dk, dv, dq_acc, params, fused_hopper,
                                                    masks))  # fmt: skip
            else:
                launches.append(launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg("bwd_fused"), masks,
                                            dq_acc=dq_acc, dq_reduce=dq_reduce(q)))  # fmt: skip
            return [*launches, launch_dq_convert(dq_acc, dq, params.softmax_scale)]
        # The dQ kernel runs first: it also computes δ' = rowsum(dO ∘ O) − dlse (dS = P ∘ (dP − δ) + dlse·P) for
        # its rows and stores it for the dK/dV kernel, so no separate δ launch.
        if (hopper := hopper_launch_config("bwd_dq_hopper", q, k, v, o, do, params, masks)) is not None:
            dq_launch = launch_dq_hopper(q, k, v, do, o, lse, dlse, delta, dq, params, hopper, masks)
        else:
            dq_launch = launch_dq(q, k, v, do, lse, delta, dq, params, cfg("bwd_dq"), masks, o=o, dlse=dlse)
        if (hopper := hopper_launch_config("bwd_dkdv_hopper", q, k, v, o, do, params, masks)) is not None:
            dkdv_launch = launch_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, params, hopper, masks)
            return [dq_launch, dkdv_launch]
        return [dq_launch, launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg("bwd_dkdv"), masks)]

    values = (q, k, v, do, o, lse, dlse, delta, dq, dk, dv, dq_acc, *params.scalars[1:4])
    launch_plans.launch_or_replay(masks, key, values, launch)
    if native != head_dim:
        return dq[..., :head_dim], dk[..., :head_dim], dv[..., :head_dim]
    return dq, dk, dv


flash_attention_backward = torch.library.custom_op(
    "flashgpt::flash_attention_backward", _backward_kernels, mutates_args=()
)


@flash_attention_backward.register_fake
def _(do, q, k, v, o, lse, dlse, rng_state, causal, dropout_p, softmax_scale, window_size=None, document_ids=None,
      block_mask=None, block_size=128, schedule=None, schedule_tiles=None, deterministic=False):  # fmt: skip
    native = native_head_dim(q.shape[-1])
    if native == q.shape[-1]:
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    return _padded_empty(q, native), _padded_empty(k, native), _padded_empty(v, native)


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    (q, k, v, rng_state, causal, dropout_p, softmax_scale, window_size, document_ids, block_mask, block_size,
     schedule, schedule_tiles, deterministic) = inputs  # fmt: skip
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, rng_state, document_ids, block_mask, schedule)
    ctx.args = (causal, dropout_p, softmax_scale)
    ctx.window_size, ctx.block_size, ctx.schedule_tiles = window_size, block_size, schedule_tiles
    ctx.deterministic = deterministic
    # An unused lse (the usual case) then arrives as None rather than a tensor of zeros to subtract.
    ctx.set_materialize_grads(False)


def _backward(ctx, do: Tensor | None, dlse: Tensor | None) -> tuple:
    q, k, v, o, lse, rng_state, document_ids, block_mask, schedule = ctx.saved_tensors
    if do is None:  # only the log-sum-exp was used
        do = torch.zeros_like(o)
    # With create_graph the gradients must come from the operator, whose own backward refuses a second derivative.
    run = _backward_kernels if _plain_eager(do) and not torch.is_grad_enabled() else flash_attention_backward
    masks = (ctx.window_size, document_ids, block_mask, ctx.block_size, schedule, ctx.schedule_tiles)
    dq, dk, dv = run(do, q, k, v, o, lse, dlse, rng_state, *ctx.args, *masks, ctx.deterministic)
    return dq, dk, dv, *[None] * (len(ctx.needs_input_grad) - 3)


def _refuse_double_backward(ctx, *grads) -> None:
    raise RuntimeError(
        "flash_attention does not support double backward: its gradients (computed with create_graph=True) "
        "cannot be differentiated again, e.g. for a gradient penalty. Use attention=naive for such a loss."
    )


flash_attention_forward.register_autograd(_backward, setup_context=_setup_context)
flash_attention_backward.register_autograd(_refuse_double_backward)


def _plain_eager(t: Tensor) -> bool:
    """True outside torch.compile/export and tracing: a plain tensor, no tracer or fake mode on the dispatch stack."""
    return type(t) is torch.Tensor and not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0


class _EagerFlashAttention(torch.autograd.Function):
    """The operators' forward and backward bodies called directly, without the dispatcher, with the masks as the
    FlashMask they already are (the operators take them apart and put them together again on every call).

    In eager mode `torch.library`'s per-call machinery (schema defaults, redispatch, the compiler-disable
    wrapper) costs more host time than everything else in a call together: with the kernel launches stubbed
    out, a fwd+bwd took 106 µs through the operators and 49 µs through this class on one CPU core. That shows at
    T = 1K, where the host already bounds the speed. Compiled and traced code always goes through the operators."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, options: tuple):
        # Everything but q, k, v travels as one tuple: autograd's per-input bookkeeping costs host time per argument.
        # options: (rng_state, causal, dropout_p, softmax_scale, masks: FlashMask, deterministic)
        rng_state, causal, dropout_p, softmax_scale, masks, _ = options
        params = _params(causal, dropout_p, softmax_scale, q.shape[-1], rng_state)
        o, lse, call = _forward_launches(q, k, v, params, masks)
        ctx.save_for_backward(q, k, v, o, lse)
        # The backward runs on autograd's device thread, whose every step costs more host time than here (its caches
        # are cold): it starts from the forward's parameters and call signature rather than work them out again.
        ctx.options, ctx.params, ctx.call = options, params, call
        ctx.set_materialize_grads(False)  # an unused lse then arrives as None, not as zeros to subtract
        return o, lse

    @staticmethod
    def backward(ctx, do: Tensor | None, dlse: Tensor | None) -> tuple:
        q, k, v, o, lse = ctx.saved_tensors
        rng_state, causal, dropout_p, softmax_scale, masks, deterministic = ctx.options
        if do is None:  # only the log-sum-exp was used
            do = torch.zeros_like(o)
        if torch.is_grad_enabled() or not _plain_eager(do):
            # With create_graph the gradients come from the operator, whose own backward refuses a second derivative.
            args = (do, q, k, v, o, lse, dlse, rng_state, causal, dropout_p, softmax_scale)
            dq, dk, dv = flash_attention_backward(*args, *masks.operator_args(), deterministic)
        else:
            dq, dk, dv = _backward_launches(do, q, k, v, o, lse, dlse, ctx.params, masks, deterministic, ctx.call)
        return dq, dk, dv, None


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = True,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    return_lse: bool = False,
    window_size: int | None = None,
    document_ids: Tensor | None = None,
    block_mask: Tensor | None = None,
    block_size: int = 128,
    mask: FlashMask | None = None,
    deterministic: bool | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Exact attention softmax(q·kᵀ·scale + masks)·v with dropout on the probabilities, fused in Triton.

    q: (B, H, Tq, D), k, v: (B, H, Tk, D) with Tq <= Tk (the queries are the last Tq positions), any strides, D a
    multiple of 8 from 16 to 256; float16/bfloat16 on CUDA, float32 anywhere (CPU tensors need TRITON_INTERPRET=1).
    Masks, combined by AND (exact semantics: `flashgpt.attention_masks`): `causal` (bottom-right aligned),
    `window_size` W (keys within W − 1 positions before, and without causal also after, the query),
    `document_ids` (B, Tk) integer (a query sees keys of its own document), and `block_mask` (H or 1,
    ceil(Tq / block_size), ceil(Tk / block_size)) bool (block-sparse; a block_size that is a multiple of 16 keeps
    the per-element mask off whole tiles). Tiles the masks remove are never computed. A row that sees no key gives
    o = 0, lse = −inf and zero gradients.
    `mask`: instead of window_size, document_ids, block_mask and block_size, those masks with their tile schedules
    built once by `flash_mask` for every call that uses them (e.g. every layer of a model step). Given as keyword
    arguments, document ids and block masks have their schedules built on every call (a few dozen small launches).
    Returns o (B, H, Tq, D), and with `return_lse` also the float32 log-sum-exp (B, H, Tq) of each row of the
    scaled, masked scores. Differentiable in q, k and v, also through the returned lse. Dropout draws its seed from
    PyTorch's default generator, so `torch.manual_seed` makes it reproducible; its rate is rounded to a multiple
    of 1/256 (`dropout.effective_dropout_p`).
    `deterministic`: True gives bit-identical dq, dk, dv from run to run (a backward whose every sum has one owner);
    False the faster backward for the shape (`tuning.backward_schedule`), which may be the fused one whose dq is
    summed with float atomics and varies in its last bits; None (default) follows
    `torch.are_deterministic_algorithms_enabled()`.
    """
    eager = _plain_eager(q)
    _check_inputs_once(q, k, v, causal, dropout_p, eager)
    _check_options(softmax_scale, return_lse)
    backward = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if mask is not None:
        if window_size is not None or document_ids is not None or block_mask is not None:
            raise ValueError(
                "flash_attention: give the masks either built (mask=) or as window_size / document_ids / block_mask"
            )
        _check_prebuilt(mask, q, k, backward, eager)
    else:
        if window_size is not None or document_ids is not None or block_mask is not None:
            _check_masks(q, k, window_size, document_ids, block_mask, block_size)
        # Plain Python ints from here on (numpy integers pass the checks): the launch path keys on types.
        window_size, block_size = None if window_size is None else int(window_size), int(block_size)
        if document_ids is not None or block_mask is not None:  # built once for the forward and the backward
            mask = _build_mask(q.shape[2], k.shape[2], q.shape[-1], q.dtype, causal, dropout_p, window_size,
                               document_ids, block_mask, block_size, backward)  # fmt: skip
    rng_state = _draw_rng_state() if dropout_p > 0 else None
    scale = None if softmax_scale is None else float(softmax_scale)
    if scale is not None and scale < 0:  # the kernels take a scale ≥ 0: q·kᵀ·scale = (−q)·kᵀ·|scale|
        q, scale = -q, -scale
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    elif not isinstance(deterministic, bool):
        raise TypeError(f"flash_attention: deterministic must be a bool or None, got {deterministic!r}")
    if eager:
        if mask is None:  # no masks or a window: nothing to schedule
            mask = _kernel_masks(q, k, window_size, None, None, block_size, None, None)
        if backward:
            options = (rng_state, causal, float(dropout_p), scale, mask, deterministic)
            o, lse = _EagerFlashAttention.apply(q, k, v, options)
        else:  # nothing to differentiate (inference, sampling): no autograd node to build
            o, lse = _attention_forward(q, k, v, rng_state, causal, float(dropout_p), scale, mask)
    else:
        masks = (
            (window_size, document_ids, block_mask, block_size, None, None) if mask is None else mask.operator_args()
        )
        o, lse = flash_attention_forward(q, k, v, rng_state, causal, float(dropout_p), scale, *masks, deterministic)
    return (o, lse) if return_lse else o
