"""attention=flash: the project's fused Triton kernel (`flashgpt.kernels`)."""

import os
import sys
from dataclasses import replace

import torch
from torch import Tensor

from flashgpt.model.attention import AttentionMask, InnerAttention


class FlashAttention(InnerAttention):
    """The project's fused Triton kernel (kernels/): tiled online softmax, O(T) memory, dropout in-kernel; the
    masks skip the tiles they remove."""

    def __init__(self) -> None:
        super().__init__()
        # Imported here rather than at the top so that prepare_device can switch the Triton interpreter on (for
        # CPU runs) before the kernels are defined.
        from flashgpt.kernels import flash_attention, flash_mask

        self.flash_attention, self.flash_mask = flash_attention, flash_mask

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: AttentionMask, dropout_p: float, scale: float
    ) -> Tensor:
        masks = mask.extra_masks if mask.kernel_mask is None else {"mask": mask.kernel_mask}
        return self.flash_attention(q, k, v, causal=mask.causal, dropout_p=dropout_p, softmax_scale=scale, **masks)

    def prepare(
        self,
        mask: AttentionMask,
        *,
        seq_len_q: int,
        seq_len_k: int,
        head_dim: int,
        dtype: torch.dtype,
        dropout_p: float,
    ) -> AttentionMask:
        """The tile schedules of document ids and block masks (causal and windows need none), built once for every
        layer's forward and backward instead of twice in each layer."""
        if mask.document_ids is None and mask.block_mask is None:
            return mask
        kernel_mask = self.flash_mask(
            seq_len_q, seq_len_k, head_dim=head_dim, dtype=dtype, causal=mask.causal, dropout_p=dropout_p,
            backward=torch.is_grad_enabled(), **mask.extra_masks,
        )  # fmt: skip
        return replace(mask, kernel_mask=kernel_mask)

    @classmethod
    def prepare_device(cls, device: torch.device) -> bool:
        """On a CPU the kernels run through Triton's interpreter: TRITON_INTERPRET=1 must be set before
        `flashgpt.kernels` is first imported (Triton reads it when a kernel is defined), which is this, the one
        place that decides it. Returns True when the (slow) interpreter will run."""
        if device.type == "cuda":
            return False
        if "flashgpt.kernels" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                "`flashgpt.kernels` was imported before TRITON_INTERPRET=1 was set; flash cannot run on CPU"
            )
        os.environ["TRITON_INTERPRET"] = "1"
        return True

    @classmethod
    def check_head_dim(cls, head_dim: int) -> None:
        """Imports the kernel: call it after prepare_device."""
        from flashgpt.kernels.attention_op import HEAD_DIM_MULTIPLE, MAX_HEAD_DIM, NATIVE_HEAD_DIMS

        if head_dim % HEAD_DIM_MULTIPLE or not NATIVE_HEAD_DIMS[0] <= head_dim <= MAX_HEAD_DIM:
            raise ValueError(
                f"attention=flash runs head dims (model.d_model / model.n_head) that are multiples of "
                f"{HEAD_DIM_MULTIPLE} from {NATIVE_HEAD_DIMS[0]} to {MAX_HEAD_DIM}; this model's is {head_dim}. "
                "Change model.n_head or model.d_model, or use attention=sdpa"
            )
