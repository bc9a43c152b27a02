"""Where one (batch, head) slice of a (B, H, T, D) tensor starts."""

import triton
import triton.language as tl


@triton.jit
def head_start(ptr, b, h, strides):
    """ptr + b·strides[0] + h·strides[1] (strides: the tensor's (B, H, T, D) strides) in int64: B·H·T·D passes 2³¹
    at long context. Offsets inside one head stay int32 (`attention_op.py` checks that they fit)."""
    return ptr + b.to(tl.int64) * strides[0] + h.to(tl.int64) * strides[1]
