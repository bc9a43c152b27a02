"""Validation loss on a fixed set of held-out tokens, the same at every evaluation.

Held-out spans of eval.span_len tokens (whole validation documents, data.eval_spans) are cut into
non-overlapping windows of seq_len tokens; the first eval.steps · eval.batch_size windows are scored. With the
same span_len and the same number of tokens (steps · batch_size · seq_len), models at different context lengths
are scored on exactly the same tokens. Loss is also reported per position bucket inside the window:
[0, 128), [128, 256), [256, 512), ... , which shows how much a longer context helps later positions.
"""

import itertools
import math

import numpy as np
import torch
from torch import nn

from flashgpt.data.documents import document_ids
from flashgpt.data.eval_spans import held_out_spans
from flashgpt.model.context_parallel import shard_batch
from flashgpt.training.config import EvalConfig
from flashgpt.training.distributed import DistContext, ParallelLayout, all_reduce_sum
from flashgpt.training.precision import autocast

FIRST_BUCKET_END = 128


def position_buckets(seq_len: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of positions: [0, 128), then doubling, until seq_len is covered."""
    bounds = [0, FIRST_BUCKET_END]
    while bounds[-1] < seq_len:
        bounds.append(2 * bounds[-1])
    return list(itertools.pairwise(bounds))


class Evaluator:
    def __init__(
        self,
        val_tokens: np.ndarray,
        val_doc_starts: np.ndarray,
        seq_len: int,
        cfg: EvalConfig,
        ctx: DistContext,
        document_mask: bool = False,
        layout: ParallelLayout | None = None,
    ) -> None:
        """Cut this rank's share of the fixed held-out windows (see the module docstring); document_mask: score
        with attention kept within documents, as in training with data.document_mask=true; layout: the job's data x
        context ranks (None: every rank a data rank), the context ranks of a data rank scoring its windows together."""
        self.layout = layout or ParallelLayout(ctx.rank, ctx.world_size, None)
        span_len = cfg.span_len or seq_len
        windows_per_span = span_len // seq_len
        n_windows = cfg.steps * cfg.batch_size
        spans = held_out_spans(val_tokens, val_doc_starts, span_len, math.ceil(n_windows / windows_per_span))
        windows = np.stack(
            [span[i * seq_len : (i + 1) * seq_len + 1] for span in spans for i in range(windows_per_span)]
        )[:n_windows]  # (n_windows, seq_len + 1): inputs and their next-token targets
        windows = torch.from_numpy(windows.astype(np.int64))
        self.windows = windows[self.layout.data_rank :: self.layout.data_size]  # this data rank's share
        self.seq_len = seq_len
        self.batch_size = cfg.batch_size
        self.ctx = ctx
        self.document_mask = document_mask

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float | dict[str, float]]:
        """val/loss, val/ppl and val/loss_by_position, averaged over every window of every rank."""
        was_training = model.training
        model.eval()
        device = self.ctx.device
        loss_sum = torch.zeros(self.seq_len, dtype=torch.float64, device=device)  # per position in the window
        # The context ranks of a data rank share its windows: one of them counts them.
        counted = self.layout.context is None or self.layout.context.rank == 0
        n_windows = torch.tensor(float(len(self.windows) * counted), dtype=torch.float64, device=device)
        for batch in self.windows.split(self.batch_size):
            batch = batch.to(device)
            x, y = batch[:, :-1], batch[:, 1:]  # (b, T) each
            with autocast(device):
                ids = document_ids(x) if self.document_mask else None
                x, y, ids, positions = shard_batch(self.layout.context, x, y, ids)  # this rank's tokens
                loss = model(x, y, reduction="none", document_ids=ids, positions=positions)  # (b, t) fp32
            if positions is None:
                loss_sum += loss.sum(dim=0, dtype=torch.float64)
            else:  # each position is scored on one context rank
                loss_sum.index_add_(0, positions, loss.sum(dim=0, dtype=torch.float64))
        model.train(was_training)
        totals = all_reduce_sum(torch.cat([loss_sum, n_windows.view(1)]), self.ctx)
        loss_by_position = (totals[:-1] / totals[-1]).tolist()
        loss = sum(loss_by_position) / self.seq_len
        buckets = {
            f"{lo}-{hi - 1}": sum(loss_by_position[lo : min(hi, self.seq_len)]) / (min(hi, self.seq_len) - lo)
            for lo, hi in position_buckets(self.seq_len)
        }
        return {"val/loss": loss, "val/ppl": math.exp(min(loss, 700.0)), "val/loss_by_position": buckets}
