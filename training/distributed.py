"""One process per device under torchrun (env RANK, WORLD_SIZE, LOCAL_RANK), or a single plain process.

NCCL on CUDA, gloo on CPU. Rank 0 alone logs, writes metrics and checkpoints; the others train silently.
"""

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from flashgpt.model.context_parallel import ContextShard


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(requested: str, local_rank: int = 0) -> torch.device:
    """The device for "auto" (CUDA when available, else the CPU), "cuda" or "cpu"; one GPU per process, chosen by
    LOCAL_RANK. The one place that resolves a device setting: train.py, sample.py and the study's evaluator."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device cuda was asked for but no CUDA device is available (use cpu or auto)")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(requested)


def init_distributed(requested_device: str) -> DistContext:
    """This process's rank and device, joining the process group when torchrun started several."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(requested_device, local_rank)
    if world_size > 1:
        if device.type == "cuda":
            dist.init_process_group(backend="nccl", device_id=device)
        else:
            dist.init_process_group(backend="gloo")
    if rank != 0:
        logging.getLogger().setLevel(logging.ERROR)  # one copy of every message, from rank 0
    return DistContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


@dataclass(frozen=True)
class ParallelLayout:
    """This rank's place on the (data, context) grid of the job: data ranks read distinct batches; the context
    ranks of one data rank split its sequences (context None: they are not split)."""

    data_rank: int
    data_size: int
    context: ContextShard | None


def parallel_layout(ctx: DistContext, context: int) -> ParallelLayout:
    """The 2-D DeviceMesh (data x context) of parallel.context=`context`; a context group holds consecutive ranks
    (one host's GPUs, where the per-layer all-gathers are fastest)."""
    if ctx.world_size % context:
        raise ValueError(
            f"parallel.context={context} does not divide the {ctx.world_size} processes: the job runs data x "
            f"context ranks; start a multiple of {context} processes or change parallel.context"
        )
    if context == 1:
        return ParallelLayout(ctx.rank, ctx.world_size, None)
    mesh = init_device_mesh(
        ctx.device.type, (ctx.world_size // context, context), mesh_dim_names=("data", "context")
    )  # fmt: skip
    shard = ContextShard(mesh.get_local_rank("context"), context, mesh.get_group("context"))
    return ParallelLayout(mesh.get_local_rank("data"), mesh.size(0), shard)


def shutdown(ctx: DistContext) -> None:
    if ctx.is_distributed:
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.is_distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's `obj`, in rank order (a one-element list in a single process)."""
    if not ctx.is_distributed:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's `obj` on every rank."""
    if not ctx.is_distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
