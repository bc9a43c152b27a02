"""GPT-2 (Radford et al., 2019), readable in one file.

Pre-LayerNorm transformer blocks, GELU(tanh) MLP, learned position embeddings, token embeddings tied to the output
head, GPT-2's initialisation. The inner attention (naive | flash | sdpa) is pluggable: see model/attention.py.
model.position_embedding=rope replaces the position table with rotary embeddings (RoPE, Su et al. 2021): q and k
are rotated by their positions before the inner attention, so every backend and mask sees them.
Shapes: B batch, T sequence length, C = d_model, H heads, D = C / H head dim, V vocab.
"""

import math
from dataclasses import dataclass
from enum import Enum

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from flashgpt.attention_masks import num_blocks
from flashgpt.model.attention import AttentionConfig, AttentionMask
from flashgpt.model.backends import build_attention
from flashgpt.model.kv_cache import KVCache
from flashgpt.model.loss import linear_cross_entropy, per_token_cross_entropy
from flashgpt.model.rotary import rotary_qkv, rotary_tables
from flashgpt.model.sparsity import block_mask_for, build_block_mask, visible_fraction


class PositionEmbedding(str, Enum):
    learned = "learned"  # GPT-2's table: one trained vector per position, added to the token embeddings
    rope = "rope"  # rotary: q and k turned by angles proportional to their position; no table, nothing to train


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
    # Keep only each block's input in the forward and recompute the block in the backward: activation memory
    # falls from n_layer blocks' worth to one block's, for about a third more compute.
    activation_checkpointing: bool = False
    init_from: str | None = None  # hf:<directory or Hub name>: start from GPT-2's weights (model/hf.py)
    position_embedding: PositionEmbedding = PositionEmbedding.learned
    # RoPE's base: pair i of a head turns by position · rope_base^(-2i / D). A larger base turns slower, so far
    # positions stay distinguishable; raising it when the context grows is "adjusted base frequency" (ABF).
    rope_base: float = 10000.0


def position_embedding(cfg: ModelConfig) -> PositionEmbedding:
    """cfg.position_embedding as the enum: a config read back from a checkpoint holds the plain string."""
    try:
        return PositionEmbedding(cfg.position_embedding)
    except ValueError:
        choices = ", ".join(p.value for p in PositionEmbedding)
        raise ValueError(f"model.position_embedding={cfg.position_embedding!r}; choose one of: {choices}") from None


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

    def forward(
        self,
        x: Tensor,
        mask: AttentionMask,
        cache: KVCache | None = None,
        layer: int = 0,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """x (B, T, C); with a cache, x continues the cached tokens and attends to them too (keys Tk = past + T).
        rotary: cos, sin (T, D) of x's positions (rope; `rotary_tables`), or None (learned positions, already in
        x)."""
        B, T, C = x.shape
        D = C // self.n_head
        qkv = self.qkv(x).view(B, T, 3, self.n_head, D)  # (B, T, 3, H, D)
        if rotary is None:
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, H, T, D): strided views, no copy
        else:
            # q · k then depends on the positions only through their difference. The cache keeps rotated keys:
            # each was turned once, at its own absolute position. q and k are turned token-major, as the
            # projection lays them out, so the attention output (laid out like q) and the gradients of q and k
            # stay token-major too, and neither the output's reshape nor the qkv gradient needs a transposing copy.
            q, k, v = (t.transpose(1, 2) for t in rotary_qkv(qkv, *rotary))  # 3 x (B, H, T, D)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, H, Tk, D)
        y = self.inner(
            q, k, v, mask=mask, dropout_p=self.dropout if self.training else 0.0, scale=1.0 / math.sqrt(D)
        )  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.resid_dropout(self.proj(y))

    def prepare_mask(self, mask: AttentionMask, seq_len_q: int, seq_len_k: int, device: torch.device) -> AttentionMask:
        """`mask` with what the backend precomputes for this layer's attention (the flash kernel's tile schedules).
        Every layer's attention is alike, so the model calls this once per forward, for all of them."""
        # q's dtype: the qkv projection's output, in autocast's dtype when autocast is on.
        dtype = (
            torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else self.qkv.weight.dtype
        )
        return self.inner.prepare(
            mask, seq_len_q=seq_len_q, seq_len_k=seq_len_k, head_dim=self.qkv.out_features // (3 * self.n_head),
            dtype=dtype, dropout_p=self.dropout if self.training else 0.0,
        )  # fmt: skip


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

    def forward(
        self,
        x: Tensor,
        mask: AttentionMask,
        cache: KVCache | None = None,
        layer: int = 0,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        x = x + self.attn(self.ln_1(x), mask, cache, layer, rotary)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, block_size: int, attention: str | AttentionConfig) -> None:
        """block_size: the longest context, which sizes the position embeddings (the run's seq_len).
        attention: the backend's name, or the whole attention config (backend and masks: window, block-sparse)."""
        super().__init__()
        self.cfg = cfg
        self.block_size = block_size
        self.attention = AttentionConfig(attention) if isinstance(attention, str) else attention
        # The block-sparse pattern over the longest context, (1, n, n) blocks (None: dense); each call takes the
        # part it needs.
        layout = build_block_mask(self.attention.block_sparse, num_blocks(block_size, self.attention.block_size))
        self.register_buffer("block_layout", layout, persistent=False)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe: nn.Embedding | None = None
        if position_embedding(cfg) == PositionEmbedding.learned:
            self.wpe = nn.Embedding(block_size, cfg.d_model)
        else:
            head_dim = cfg.d_model // cfg.n_head
            if head_dim % 2:
                raise ValueError(
                    f"model.position_embedding=rope rotates pairs of head dims; head dim {head_dim} "
                    f"(d_model={cfg.d_model} / n_head={cfg.n_head}) is odd"
                )
            # Not saved with the weights (persistent=False): rebuilt from model.rope_base, which may change when
            # a run extends its context. They move with the model's device; apply_rotary adapts their dtype.
            cos, sin = rotary_tables(block_size, head_dim, cfg.rope_base)  # 2 x (block_size, D)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, self.attention.name) for _ in range(cfg.n_layer))
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

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        reduction: str = "mean",
        document_ids: Tensor | None = None,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """idx: (B, T) token ids -> logits (B, T, V); with targets (B, T), the cross-entropy instead:
        reduction="mean" a scalar (training), "none" one loss per token (B, T) (evaluation by position).
        The loss is computed chunk by chunk from the hidden states (model/loss.py): the (B·T, V) logits of a
        training step are never materialised.
        document_ids (B, T), or (B, past + T) with a cache: a token attends only within its document.
        cache: idx continues the tokens it holds (their positions follow on); their keys and values are appended.
        positions: (T,) int64, the global positions of idx's tokens when idx is a shard of longer sequences (context
        parallelism, model/context_parallel.py); default past..past + T - 1."""
        n_tokens = idx.size(1)
        past = 0 if cache is None else cache.length
        if positions is not None and cache is not None:
            raise ValueError("positions and a KV cache both place the tokens: pass one of them")
        if positions is None:
            positions = torch.arange(past, past + n_tokens, device=idx.device)
        if past + n_tokens > self.block_size:
            raise ValueError(
                f"context of {past + n_tokens} tokens is longer than the model's {self.block_size} (its seq_len)"
            )
        mask = self.attention_mask(n_tokens, past + n_tokens, document_ids)
        mask = self.blocks[0].attn.prepare_mask(mask, n_tokens, past + n_tokens, idx.device)  # once for every layer
        x = self.wte(idx)  # (B, T, C)
        rotary = None
        if self.wpe is not None:
            x = x + self.wpe(positions)  # + (T, C)
        else:  # rotated by the tokens' absolute positions
            rotary = (self.rope_cos[positions], self.rope_sin[positions])  # 2 x (T, D)
        x = self.drop(x)
        for layer, block in enumerate(self.blocks):
            if self.cfg.activation_checkpointing and self.training:
                # The recompute restores the RNG state first (CPU and CUDA), so dropout, in our kernel too, draws
                # the same masks in both runs of the block.
                x = checkpoint(block, x, mask, cache, layer, rotary, use_reentrant=False)
            else:
                x = block(x, mask, cache, layer, rotary)
        if cache is not None:
            cache.advance(n_tokens)
        x = self.ln_f(x)
        if targets is None:
            return self.lm_head(x)  # (B, T, V)
        if targets.shape != idx.shape:
            raise ValueError(f"targets of shape {tuple(targets.shape)} do not match idx {tuple(idx.shape)}")
        if reduction == "mean":
            return linear_cross_entropy(x.flatten(0, 1), self.lm_head.weight, targets.flatten())
        if reduction == "none":
            return per_token_cross_entropy(x.flatten(0, 1), self.lm_head.weight, targets.flatten()).view_as(targets)
        raise ValueError(f'reduction={reduction!r}; choose "mean" or "none"')

    def attention_mask(self, seq_len_q: int, seq_len_k: int, document_ids: Tensor | None = None) -> AttentionMask:
        """What the queries, the last seq_len_q of seq_len_k positions, may see: causal, and the configured window
        and block-sparse pattern; document_ids (B, seq_len_k) adds document masking."""
        att = self.attention
        block_mask = None
        if self.block_layout is not None:
            block_mask = block_mask_for(self.block_layout, seq_len_q, seq_len_k, att.block_size)
        # A window of seq_len_k or more hides no causal key: dropping it keeps sdpa on its is_causal fast path.
        window = att.window_size if att.window_size is not None and att.window_size < seq_len_k else None
        return AttentionMask(
            causal=True,
            window_size=window,
            document_ids=document_ids,
            block_mask=block_mask,
            block_size=att.block_size,
        )

    def num_params(self, exclude_position_embeddings: bool = True) -> int:
        """Parameter count N, by default without the position table (a lookup, no FLOPs; rope has none). The token
        table stays: tied to the output head, it is also a real matmul per token, as in the GPT-2 and Chinchilla
        counts."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if exclude_position_embeddings and self.wpe is not None else n

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs (forward + backward) per token at context seq_len: 6N for the weight matmuls plus
        12·L·C·T for q kᵀ and p v, halved because causal attention skips the upper triangle, and scaled by the
        share of it a window or block-sparse pattern leaves (document masking, which varies by batch, is not)."""
        att, layout = self.attention, self.block_layout
        kept = visible_fraction(seq_len, window_size=att.window_size, layout=layout, block_size=att.block_size)
        return 6 * self.num_params() + round(6 * self.cfg.n_layer * self.cfg.d_model * seq_len * kept)

    def configure_optimizer(
        self, lr: float, weight_decay: float, betas: tuple[float, float], device_type: str
    ) -> torch.optim.AdamW:
        """AdamW with weight decay on the 2D weights (matmuls, embeddings) only, not on biases and LayerNorms."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        # The fused implementation (CUDA and CPU) updates all parameters in a few kernel launches instead of one per
        # tensor, and can skip an update on the device when a step's loss or gradients are not finite
        # (training/step.py), with no host sync.
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=device_type in ("cuda", "cpu"))
