"""GPT-2 (Radford et al., 2019), readable in one file.

Pre-LayerNorm transformer blocks, GELU(tanh) MLP, learned position embeddings, token embeddings tied to the output
head, GPT-2's initialisation. The inner attention (naive | flash | sdpa) is pluggable: see model/attention.py.
Shapes: B batch, T sequence length, C = d_model, H heads, D = C / H head dim, V vocab.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from flashgpt.model.attention import build_attention


@dataclass
class ModelConfig:
    name: str = "gpt2"
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    # GPT-2's 50257 tokens padded up to a multiple of 64: the embedding and output matmuls then tile evenly on
    # tensor cores (nanoGPT measured ~25% faster). The 47 extra rows are never targets; training pushes their
    # logits down.
    vocab_size: int = 50304
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str) -> None:
        super().__init__()
        if cfg.d_model % cfg.n_head:
            raise ValueError(
                f"d_model={cfg.d_model} is not divisible by n_head={cfg.n_head}; pick n_head so that the head dim "
                "d_model / n_head is a whole number (64 in every GPT-2 size)"
            )
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)  # q, k, v in one matmul
        self.inner = build_attention(attention)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        D = C // self.n_head
        qkv = self.qkv(x).view(B, T, 3, self.n_head, D)  # (B, T, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D): strided views, no copy
        y = self.inner(
            q, k, v, causal=True, dropout_p=self.dropout if self.training else 0.0, scale=1.0 / math.sqrt(D)
        )  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2 used the tanh approximation
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(self.gelu(self.fc(x))))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, block_size: int, attention: str) -> None:
        """block_size: the longest context, which sizes the learned position embeddings (the run's seq_len)."""
        super().__init__()
        self.cfg = cfg
        self.block_size = block_size
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one (V, C) matrix embeds and un-embeds

        self.apply(self._init_weights)
        # GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * n_layer): each block
        # adds two of them, and this keeps the stream's variance from growing with depth.
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        """idx: (B, T) token ids -> logits (B, T, V)."""
        n_tokens = idx.size(1)
        if n_tokens > self.block_size:
            raise ValueError(f"context of {n_tokens} tokens is longer than the model's {self.block_size} (its seq_len)")
        pos = torch.arange(n_tokens, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)

    def num_params(self, exclude_position_embeddings: bool = True) -> int:
        """Parameter count N, by default without the position table (a lookup, no FLOPs). The token table stays:
        tied to the output head, it is also a real matmul per token, as in the GPT-2 and Chinchilla counts."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if exclude_position_embeddings else n

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token at context seq_len: 6N for the weight matmuls plus
        12·L·C·T for q kᵀ and p v, halved because causal attention skips the upper triangle."""
        return 6 * self.num_params() + 6 * self.cfg.n_layer * self.cfg.d_model * seq_len

    def configure_optimizer(
        self, lr: float, weight_decay: float, betas: tuple[float, float], device_type: str
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on the 2D weights (matmuls, embeddings) only, not on biases and LayerNorms."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        # The fused CUDA implementation updates all parameters in a few kernel launches instead of one per tensor.
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=device_type == "cuda")
