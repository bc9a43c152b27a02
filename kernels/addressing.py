"""Where one (batch, head) slice of a (B, H, T, D) tensor starts, and how its rows and columns are strided."""

import triton
import triton.language as tl


@triton.jit
def head_rows(ptr, b, h, strides):
    """(start, stride_t, stride_d) of head (b, h) of a tensor at ptr with (B, H, T, D) strides: where the head starts,
    ptr + b·strides[0] + h·strides[1] in int64 (B·H·T·D passes 2³¹ at long context), and the strides of its rows and
    columns. Offsets inside one head stay int32 (`attention_op.py` checks that they fit)."""
    return ptr + b.to(tl.int64) * strides[0] + h.to(tl.int64) * strides[1], strides[2], strides[3]
