"""The bar for train.py's step: a minimal GPT-2 training step written the way most users write one (nanoGPT-style).

The loss is computed inside the model, attention is F.scaled_dot_product_attention held to cuDNN's kernel on CUDA,
the optimizer is fused AdamW, the whole model runs under torch.compile with bf16 autocast, and nothing in the step
waits for the GPU (the loss stays on the device). No gradient clipping. Same architecture as model/gpt.py:
pre-LayerNorm blocks, GELU(tanh), learned positions, tied embeddings, dropout on the embeddings, the attention
probabilities and both residual branches. scripts/bench_train.py times it next to train.py's own step.
"""

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclass
class ReferenceConfig:
    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int
    block_size: int
    dropout: float


class SelfAttention(nn.Module):
    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class Block(nn.Module):
    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ReferenceGPT(nn.Module):
    def __init__(self, cfg: ReferenceConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        """idx, targets (B, T) -> the mean cross-entropy, a scalar."""
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V), bf16 under autocast
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def reference_step(
    cfg: ReferenceConfig, device: torch.device, compile_backend: str | None
) -> tuple[ReferenceGPT, Callable[[Callable[[], tuple[Tensor, Tensor]]], Tensor]]:
    """The model and its step: step(next_batch) queues forward, backward and the AdamW update, and returns the
    loss as a device tensor. compile_backend None runs eagerly."""
    model = ReferenceGPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    forward = model if compile_backend is None else torch.compile(model, backend=compile_backend)
    cuda = device.type == "cuda"

    def step(next_batch: Callable[[], tuple[Tensor, Tensor]]) -> Tensor:
        x, y = next_batch()
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if cuda else nullcontext():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = forward(x, y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return model, step
