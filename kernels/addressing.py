"""Where one (batch, head) slice of a (B, H, T, D) tensor starts."""

import triton
import triton.language as tl


@triton.jit
def head_start(ptr, b, h, stride_b, stride_h):
    """ptr + b·stride_b + h·stride_h in int64: B·H·T·D passes 2³¹ at long context. Offsets inside one head stay
    int32 (`attention_op.py` checks that they fit)."""
    return ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
