"""What the Gluon passes for Hopper (`flash_bwd_dq_hopper.py`, `flash_bwd_dkdv_hopper.py`) share: the layout of a
warpgroup product's accumulator and a tensor descriptor of one head's matrix."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma
from triton.runtime.jit import constexpr_function

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@constexpr_function
def mma_layout(num_warps, n):
    """The accumulator layout of a warpgroup product with n columns: warps split its rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def head_desc(base, b, h, stride_b, stride_h, stride_t, rows, HEAD_DIM: gl.constexpr, BLOCK: gl.constexpr):
    """A tensor descriptor of one head's (rows, HEAD_DIM) matrix, in tiles of (BLOCK, HEAD_DIM)."""
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK, HEAD_DIM], base.dtype.element_ty)
    start = base + b.to(gl.int64) * stride_b + h.to(gl.int64) * stride_h
    return tma.make_tensor_descriptor(start, [rows, HEAD_DIM], [stride_t, 1], [BLOCK, HEAD_DIM], layout)
