"""What the Gluon passes for Hopper (`flash_fwd_hopper.py`, `flash_bwd_dq_hopper.py`, `flash_bwd_dkdv_hopper.py`)
share: the layout of a warpgroup product's accumulator and of a shared-memory tile, and tensor descriptors of one
head's matrix, made on the host and read in the kernel."""

import functools

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import constexpr_function

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@constexpr_function
def mma_layout(num_warps, n):
    """The accumulator layout of a warpgroup product with n columns: warps split its rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@constexpr_function
def tile_layout(rows, head_dim, dtype):
    """The shared-memory layout of a (rows, head_dim) tile that TMA fills and warpgroup products read."""
    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], dtype)


@gluon.jit
def load_head_tile(desc, b, h, row, bar, dst):
    """TMA of rows [row, row + BLOCK) of head (b, h) from a (B, H, T, D) descriptor made by `head_descriptor` into
    the (BLOCK, D) buffer dst, completing on bar (whose expected bytes the caller sets); rows past T read as
    zeros."""
    tma.async_copy_global_to_shared(desc, [b, h, row, 0], bar, dst.reshape(desc.block_type.shape))


@functools.cache
def _tile_layout(dtype: torch.dtype, rows: int, head_dim: int) -> gl.NVMMASharedLayout:
    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, head_dim], element)


def head_descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """A host-made tensor descriptor of t (B, H, T, D) in tiles of (1, 1, rows, D): one head's rows, those past T
    read as zeros. Made on the host, it reaches the kernel as a launch parameter: a descriptor made in the kernel
    costs every program a global-memory round trip before its first load, which at 1K-4K tokens cost the forward
    10-30% (`results/tuning/h200-2026-11-27-gluon-fwd/`)."""
    layout = _tile_layout(t.dtype, rows, t.shape[-1])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, t.shape[-1]], layout)
