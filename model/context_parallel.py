"""Context parallelism: one sequence split across the ranks of a process group, attention exact.

The sequence of T tokens is cut into 2N chunks of T / 2N; rank r of N holds chunks r and 2N − 1 − r, in that
order (load-balanced causal attention: every rank gets one early and one late chunk, so the same share of the
causal triangle). Everything outside attention is per token and runs on the local T / N tokens as it is.

Attention follows Llama 3: every layer all-gathers K and V (one collective for both), and each local chunk's
queries attend to the global keys up to the chunk's end through the unchanged inner attention, Tq < Tk with the
causal mask aligned bottom-right. Windows, document ids and block-sparse layouts are rebuilt per chunk by the
model's own `attention_mask` over global positions, so every backend computes what one process computes. The
all-gather is torch.distributed's differentiable functional collective: its backward reduce-scatters, summing the
K/V gradients of every rank's queries into the rank that holds those keys. (torch.distributed.nn.functional's
all_gather, deprecated in torch 2.13, does not do: on gloo its backward scatters with global ranks and fails in any
group smaller than the world, such as the context groups of a data x context mesh.)

Not exact: attention dropout draws its masks per call from each rank's RNG, so they cannot equal a one-process
run's (the model is still trained with dropout at the configured rate).
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from flashgpt.model.attention import AttentionMask, InnerAttention
from flashgpt.model.gpt import GPT

# torch 2.13 renamed it (the old name warns there); earlier releases have only the old name.
_all_gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd


@dataclass(frozen=True)
class ContextShard:
    """This rank's place in a context-parallel group of `size` ranks (group None: the default group)."""

    rank: int
    size: int
    group: dist.ProcessGroup | None = None

    def check_seq_len(self, seq_len: int, block_size: int | None = None) -> None:
        """Raise ValueError unless seq_len splits into 2·size chunks (whole blocks of block_size when given)."""
        chunks = 2 * self.size
        if seq_len % chunks:
            raise ValueError(
                f"parallel.context={self.size} cuts each sequence into {chunks} chunks; seq_len={seq_len} is not a "
                f"multiple of {chunks}"
            )
        if block_size is not None and (seq_len // chunks) % block_size:
            raise ValueError(
                f"parallel.context={self.size} with a block-sparse pattern needs chunks of whole blocks: seq_len / "
                f"{chunks} = {seq_len // chunks} is not a multiple of attention.block_size={block_size}"
            )

    def chunks(self, seq_len: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """Global [start, end) of this rank's two chunks of a seq_len sequence."""
        n = seq_len // (2 * self.size)
        late = 2 * self.size - 1 - self.rank
        return (self.rank * n, (self.rank + 1) * n), (late * n, (late + 1) * n)

    def positions(self, seq_len: int, device: torch.device) -> Tensor:
        """Global positions of the local tokens: (seq_len / N,) int64."""
        return torch.cat([torch.arange(start, end, device=device) for start, end in self.chunks(seq_len)])

    def shard(self, x: Tensor, dim: int = 1) -> Tensor:
        """This rank's tokens of a full sequence x (..., T, ...) along dim: (..., T / N, ...)."""
        return torch.cat([x.narrow(dim, start, end - start) for start, end in self.chunks(x.size(dim))], dim=dim)

    def gather(self, x: Tensor) -> Tensor:
        """Every rank's shard of x (T / N, ...), sequence first, put back in global order: (T, ...).
        Differentiable: the gradient of each shard is summed over the ranks that used it. Sequence first, the
        collective gathers along dim 0 with no rearranging copy of its own."""
        group = self.group if self.group is not None else dist.group.WORLD
        return self.unshard(_all_gather(x.contiguous(), 0, group))

    def unshard(self, shards: Tensor) -> Tensor:
        """Every rank's shard (T / N, ...), sequence first, concatenated in rank order -> global order (T, ...)."""
        pieces = shards.chunk(2 * self.size)  # rank r's: chunks r, 2N - 1 - r
        return torch.cat([*pieces[0::2], *reversed(pieces[1::2])])


@dataclass(frozen=True, eq=False)
class ShardedMask(AttentionMask):
    """The masks of this rank's two query chunks against the global keys, prepared by the inner backend."""

    chunks: tuple[AttentionMask, ...] = ()


class ContextParallelAttention(InnerAttention):
    """Wraps a layer's inner attention: q, k, v are the local tokens (B, H, T / N, D); see the module docstring."""

    def __init__(self, inner: InnerAttention, shard: ContextShard, model: GPT) -> None:
        super().__init__()
        self.inner, self.shard = inner, shard
        self.attention_mask = model.attention_mask  # the model's own mask builder: window, block layout

    def prepare(
        self,
        mask: AttentionMask,
        *,
        seq_len_q: int,
        seq_len_k: int,
        head_dim: int,
        dtype: torch.dtype,
        dropout_p: float,
    ) -> ShardedMask:
        """Each local chunk's mask over global positions, built once per forward for every layer."""
        if seq_len_q != seq_len_k:
            raise ValueError("context parallelism runs whole sequences: no KV cache, no queries after cached keys")
        if seq_len_q % 2:
            raise ValueError(f"a context-parallel shard holds two equal chunks; got {seq_len_q} tokens")
        seq_len = seq_len_q * self.shard.size
        ids = None if mask.document_ids is None else self.shard.gather(mask.document_ids.t()).t()  # (B, T)
        chunks = []
        for start, end in self.shard.chunks(seq_len):
            chunk = self.attention_mask(end - start, end, None if ids is None else ids[:, :end].contiguous())
            chunks.append(
                self.inner.prepare(
                    chunk, seq_len_q=end - start, seq_len_k=end, head_dim=head_dim, dtype=dtype, dropout_p=dropout_p
                )
            )
        return ShardedMask(chunks=tuple(chunks))

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, *, mask: AttentionMask, dropout_p: float, scale: float
    ) -> Tensor:
        if not isinstance(mask, ShardedMask):
            raise TypeError("ContextParallelAttention needs the mask its prepare() built (GPT.forward does this)")
        kv = torch.stack([k.permute(2, 0, 1, 3), v.permute(2, 0, 1, 3)], dim=1)  # (T / N, 2, B, H, D), one copy
        kv = self.shard.gather(kv).permute(1, 2, 3, 0, 4)  # (2, B, H, T, D) view: one collective for both
        seq_len = kv.size(3)
        outputs = [
            self.inner(q_chunk, kv[0, :, :, :end], kv[1, :, :, :end], mask=chunk, dropout_p=dropout_p, scale=scale)
            for q_chunk, (_, end), chunk in zip(q.chunk(2, dim=2), self.shard.chunks(seq_len), mask.chunks, strict=True)
        ]  # 2 x (B, H, T / 2N, D)
        return torch.cat(outputs, dim=2)  # (B, H, T / N, D)


def apply_context_parallel(model: GPT, shard: ContextShard) -> GPT:
    """Make `model` run on shards of its sequences: every layer's inner attention gathers the keys and values of
    the group. Call GPT.forward with the shard's tokens, targets and document ids (ContextShard.shard) and
    positions=ContextShard.positions(T). In place; returns the model."""
    block_size = model.attention.block_size if model.block_layout is not None else None
    shard.check_seq_len(model.block_size, block_size)
    for block in model.blocks:
        block.attn.inner = ContextParallelAttention(block.attn.inner, shard, model)
    return model


def shard_batch(
    shard: ContextShard | None, x: Tensor, y: Tensor, ids: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """This rank's part of a batch of whole sequences, x and y (B, T) and document ids (B, T) or None, and the
    global positions of its tokens (T / N,); unchanged, with positions None, without context parallelism."""
    if shard is None:
        return x, y, ids, None
    positions = shard.positions(x.size(1), x.device)
    return shard.shard(x), shard.shard(y), None if ids is None else shard.shard(ids), positions
