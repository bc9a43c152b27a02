"""Context parallelism, model level: `torchrun --nproc_per_node=2 tests/context_parallel_worker.py OUT` runs every
case of CASES as CP=2 on gloo and rank 0 saves the losses and gradients to OUT; test_context_parallel.py compares
them with one process running `build(case)` whole."""

import faulthandler
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined: flash runs on the CPU

import torch
import torch.distributed as dist
from torch import Tensor

from flashgpt.model.attention import AttentionConfig
from flashgpt.model.context_parallel import ContextShard, apply_context_parallel, shard_batch
from flashgpt.model.gpt import GPT, ModelConfig
from flashgpt.model.sparsity import BlockSparseConfig

SEQ_LEN, BATCH, VOCAB = 64, 1, 512
# name: (backend, masks and positions)
CASES: dict[str, tuple[str, dict]] = {
    **{f"{name}-causal": (name, {}) for name in ("naive", "sdpa", "flash")},
    **{f"{name}-window-rope": (name, {"window_size": 20, "rope": True}) for name in ("naive", "sdpa", "flash")},
    **{f"{name}-documents": (name, {"documents": True}) for name in ("naive", "sdpa", "flash")},
    **{f"{name}-block-sparse": (name, {"block_sparse": True}) for name in ("naive", "sdpa", "flash")},
    "sdpa-activation-checkpointing": ("sdpa", {"activation_checkpointing": True}),  # the all-gather runs again
    **{f"{name}-dropout": (name, {"dropout": 0.1}) for name in ("naive", "sdpa", "flash")},
}


def build(case: str) -> tuple[GPT, Tensor, Tensor, Tensor | None]:
    """gpt2-tiny's shape with a small vocabulary, and a batch: model, x (B, T), y (B, T), document ids (B, T)."""
    backend, opts = CASES[case]
    torch.manual_seed(0)
    block_sparse = BlockSparseConfig("local_global", local_blocks=1) if opts.get("block_sparse") else None
    attention = AttentionConfig(
        backend, window_size=opts.get("window_size"), block_size=16, block_sparse=block_sparse or BlockSparseConfig()
    )
    position = "rope" if opts.get("rope") else "learned"
    cfg = ModelConfig(
        n_layer=2, n_head=2, d_model=128, vocab_size=VOCAB, dropout=opts.get("dropout", 0.0),
        position_embedding=position, activation_checkpointing=opts.get("activation_checkpointing", False),
    )  # fmt: skip
    model = GPT(cfg, SEQ_LEN, attention)
    x, y = torch.randint(0, VOCAB, (2, BATCH, SEQ_LEN)).unbind(0)
    ids = None
    if opts.get("documents"):  # starts in three of the four chunks; one document spans the middle two
        starts = torch.zeros(BATCH, SEQ_LEN, dtype=torch.int32)
        starts[:, [5, 21, 40, 43]] = 1
        ids = starts.cumsum(dim=1, dtype=torch.int32)
    return model, x, y, ids


def run_case(case: str, shard: ContextShard) -> dict[str, object]:
    """CP forward + backward of `case`: the mean loss over every token and the gradients of that mean."""
    model, x, y, ids = build(case)
    apply_context_parallel(model, shard)
    x, y, ids, positions = shard_batch(shard, x, y, ids)
    loss = model(x, y, document_ids=ids, positions=positions)
    loss.backward()  # the gradients of this rank's tokens' mean loss, K and V's from every rank's queries
    # Every rank holds as many tokens, so the mean over all of them is the mean of the ranks' means.
    flat = torch.cat([loss.detach().view(1)] + [p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat)
    flat /= shard.size
    grads, offset = {}, 1
    for name, param in model.named_parameters():
        grads[name] = flat[offset : offset + param.numel()].view_as(param)
        offset += param.numel()
    return {"loss": flat[0], "grads": grads}


def main(out: str) -> None:
    faulthandler.enable(all_threads=True)  # an abort prints every thread's Python stack: where it happened
    dist.init_process_group("gloo")
    shard = ContextShard(dist.get_rank(), dist.get_world_size())
    torch.manual_seed(dist.get_rank())  # dropout draws differ by rank, as in training
    results = {case: run_case(case, shard) for case in CASES}
    if shard.rank == 0:
        torch.save(results, out)
    dist.barrier()  # rank 0's results are on disk
    # Rank 1 has aborted at the end of this worker in a few full CI runs ("terminate called without an active
    # exception", from C++, with no Python error), never in dozens of runs outside them; a barrier before
    # destroy_process_group did not stop it. What the test checks is on disk, so both ranks leave without gloo's
    # teardown or the interpreter's exit; if the abort comes from anywhere else, faulthandler shows where.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
