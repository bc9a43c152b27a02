"""The training step as the device sees it: built from the config, queued with no host sync, read back late.

A step is forward + backward over grad_accum micro-batches (the model returns its own loss, model/loss.py),
gradient clipping and a fused AdamW update. Nothing in it waits for the device: the loss and the gradient norm
stay on the device, and a non-finite value is caught there. It sets a flag that AdamW's fused kernel reads as
`found_inf` (the protocol torch.amp.GradScaler uses to skip steps without a sync) and that stays set, so that
step's update and every later one are skipped: the weights remain those of the last finite step until the host
notices and stops the run. The host reads each step's numbers one step late (StepNumbers), while the device
already runs the next step, and before anything that must only see finite steps (a checkpoint).

The trainer (training/loop.py) and the benchmark (scripts/bench_train.py) build and run the step through these
same functions.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR
from torch.profiler import record_function

from flashgpt.data.documents import document_ids
from flashgpt.model.attention import AttentionMask
from flashgpt.model.context_parallel import ContextShard, shard_batch
from flashgpt.model.gpt import GPT
from flashgpt.training.distributed import DistContext, all_reduce_sum
from flashgpt.training.precision import autocast
from flashgpt.training.schedule import build_scheduler

if TYPE_CHECKING:
    from flashgpt.training.config import Config

log = logging.getLogger(__name__)

Batch = tuple[Tensor, Tensor]  # inputs and targets, (B, T) int64 each, on the device


def build_model_and_optimizer(cfg: Config, device: torch.device) -> tuple[GPT, torch.optim.AdamW, LambdaLR]:
    """The GPT of cfg.model at context cfg.seq_len on `device`, its AdamW and the learning-rate schedule."""
    model = GPT(cfg.model, cfg.seq_len, cfg.attention).to(device)
    train = cfg.train
    optimizer = model.configure_optimizer(train.lr, train.weight_decay, (train.beta1, train.beta2), device.type)
    return model, optimizer, build_scheduler(optimizer, train)


def compile_model(model: GPT, backend: str = "inductor") -> nn.Module:
    """torch.compile the whole model, forward, loss and backward, as one graph (fullgraph=True) when its attention
    can be traced; otherwise with a graph break around every attention call, and a warning saying so.

    Shapes are static (dynamic=False): a training run calls the compiled model with one (B, T) only, and a
    dynamic-shape recompile would be slower. Evaluation runs the model uncompiled.
    """
    fullgraph = attention_traces_in_one_graph(model)
    if not fullgraph:
        log.warning(
            f"torch.compile cannot trace attention={model.attention.name} in one graph (it is not a PyTorch "
            "operator in this build): compiling with a graph break at every attention call, which costs speed"
        )
    return torch.compile(model, fullgraph=fullgraph, dynamic=False, backend=backend)


def attention_traces_in_one_graph(model: GPT) -> bool:
    """Whether dynamo captures a call of the model's inner attention without a graph break (probed on a tiny
    input, with the model's dropout)."""
    inner, dropout_p = model.blocks[0].attn.inner, model.cfg.dropout
    device = next(model.parameters()).device

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return inner(q, k, v, mask=AttentionMask(), dropout_p=dropout_p, scale=0.125)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the run's RNG streams stay put
        q, k, v = torch.randn(3, 1, 1, 16, 64, device=device, requires_grad=True)
        try:
            torch.compile(attend, fullgraph=True, backend="eager")(q, k, v)
        except torch._dynamo.exc.TorchDynamoException:
            return False
    return True


class TrainStep:
    """One optimizer step, queued on the device without waiting for it (see the module docstring)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: LambdaLR,
        *,
        grad_accum: int,
        grad_clip: float,
        ctx: DistContext,
        document_mask: bool = False,
        context: ContextShard | None = None,
    ) -> None:
        """model: the module to call (compiled and/or DDP-wrapped); grad_clip: max global norm, 0 for none;
        document_mask: each batch's document ids, from its <|endoftext|> tokens, keep attention within documents;
        context: this rank's share of every sequence (the model's attention was made context parallel)."""
        if not optimizer.defaults.get("fused"):
            raise ValueError(
                f"TrainStep needs a fused AdamW (on CUDA or CPU) to skip non-finite updates on the device; got "
                f"{type(optimizer).__name__} with fused={optimizer.defaults.get('fused')}"
            )
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.grad_accum, self.ctx, self.document_mask, self.context = grad_accum, ctx, document_mask, context
        self.max_norm = grad_clip or math.inf  # an infinite bound measures the norm and scales by 1
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        # 1.0 once any step was non-finite; AdamW's fused kernel skips its update while it is set.
        self.nonfinite = torch.zeros((), dtype=torch.float32, device=ctx.device)
        optimizer.found_inf = self.nonfinite

    def __call__(self, next_batch: Callable[[], Batch]) -> Tensor:
        """Queue one step over grad_accum batches from `next_batch`; returns [mean loss, gradient norm] (2,) fp32,
        averaged over ranks (every rank holds as many tokens: the mean over every token), on the device."""
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        for micro_step in range(self.grad_accum):
            x, y = next_batch()  # whole sequences (B, T): every context rank reads the same batch
            ids = document_ids(x) if self.document_mask else None  # (B, T): counted from the sequence's start
            x, y, ids, positions = shard_batch(self.context, x, y, ids)  # this rank's tokens
            # DDP all-reduces gradients in backward; only the last micro-step's reduction is needed.
            last_micro_step = micro_step == self.grad_accum - 1
            no_sync = self.model.no_sync() if self.ctx.is_distributed and not last_micro_step else nullcontext()
            with no_sync:
                # Named ranges in a profile=true trace (training/profiling.py); AdamW's step names its own.
                with autocast(self.ctx.device), record_function("forward"):
                    loss = self.model(x, y, document_ids=ids, positions=positions)  # scalar fp32, in the model
                with record_function("backward"):
                    (loss / self.grad_accum).backward()
            loss_sum += loss.detach()
        # Returns the norm before clipping as a device tensor; nothing here reads it. With context parallelism DDP
        # averages over data x context ranks: each context rank's gradients hold its own tokens' mean loss (with
        # K and V's from the other ranks' queries), so their average is that of the sequences' mean loss.
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        stats = all_reduce_sum(torch.stack([loss_sum / self.grad_accum, grad_norm]), self.ctx) / self.ctx.world_size
        # Every rank holds the same reduced numbers, so every rank skips the same updates.
        torch.maximum(self.nonfinite, stats.isfinite().all().logical_not().float(), out=self.nonfinite)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats


class StepNumbers:
    """A step's device numbers on their way to the host. On CUDA they are copied into pinned memory behind the
    step's own work, so reading them waits for that step only, not for the steps queued after it."""

    def __init__(self, stats: Tensor) -> None:
        self._ready: torch.cuda.Event | None = None
        self.done_at: float | None = None  # time.perf_counter() when the host saw the step finished
        if stats.device.type == "cuda":
            self._host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
            self._host.copy_(stats, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:  # the step ran synchronously: it is done now
            self._host = stats
            self.done_at = time.perf_counter()

    def values(self) -> list[float]:
        """The numbers as floats, waiting for the step to finish on the device if it has not."""
        if self._ready is not None and self.done_at is None:
            self._ready.synchronize()
            self.done_at = time.perf_counter()
        return self._host.tolist()
