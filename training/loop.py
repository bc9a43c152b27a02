"""The training loop: build everything from the config, train, evaluate, checkpoint, and write result.json."""

import json
import logging
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from flashgpt.data import load_splits
from flashgpt.data.batches import get_batch
from flashgpt.data.sampler import WindowSampler
from flashgpt.model.attention import describe_masks
from flashgpt.model.backends import check_head_dim, prepare_backend
from flashgpt.model.context_parallel import apply_context_parallel
from flashgpt.model.hf import load_into
from flashgpt.training.checkpoint import (
    LATEST,
    CheckpointError,
    capture_rng_state,
    checkpoint_dir,
    last_good_checkpoint,
    load_training_state,
    resolve_resume,
    restore_rng_state,
    save_checkpoint,
)
from flashgpt.training.config import Config, grad_accum_steps, typed_config, validate
from flashgpt.training.distributed import (
    DistContext,
    all_gather_objects,
    broadcast_object,
    init_distributed,
    parallel_layout,
)
from flashgpt.training.distributed import shutdown as shutdown_distributed
from flashgpt.training.evaluation import Evaluator
from flashgpt.training.extension import extend_from_checkpoint
from flashgpt.training.failures import NonFiniteLossError, oom_request_gib
from flashgpt.training.metrics import RESULT_FILE, MetricsLogger
from flashgpt.training.mfu import device_name, mfu, peak_flops_per_sec
from flashgpt.training.profiling import StepProfiler
from flashgpt.training.resume import apply_optimizer_settings, check_resume_config, optimizer_settings
from flashgpt.training.run_dir import claim_run_dir
from flashgpt.training.step import StepNumbers, TrainStep, build_model_and_optimizer, compile_model

log = logging.getLogger(__name__)

RESOLVED_CONFIG = "resolved_config.yaml"
STEADY_STATE_SKIP = 3  # first steps of a process, slowed by compilation and kernel autotuning


def run(cfg: DictConfig, run_dir: Path) -> str:
    """Train as `cfg` says, in `run_dir`; returns the status written to result.json: "ok", "oom" or "nan"."""
    config = typed_config(cfg)
    validate(config)
    ctx = init_distributed(config.device.value)
    try:
        # Under torchrun every rank composes its own run dir (${now:...} may differ by a second): use rank 0's.
        run_dir = Path(broadcast_object(str(run_dir), ctx))
        claim_run_dir(run_dir, config.resume, config.overwrite, ctx.is_main, config.extend_from)
        if ctx.is_main:  # only once the run dir is this run's: a refused run leaves the earlier run's file
            (run_dir / RESOLVED_CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True))
        resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        return Trainer(config, resolved, run_dir, ctx).train()
    finally:
        shutdown_distributed(ctx)


class Trainer:
    def __init__(self, cfg: Config, resolved_cfg: dict[str, Any], run_dir: Path, ctx: DistContext) -> None:
        """Build data, model, optimizer and logger from `cfg` (resolved_cfg: the same, as saved in checkpoints)."""
        self.cfg, self.resolved_cfg, self.run_dir, self.ctx = cfg, resolved_cfg, run_dir, ctx
        device = ctx.device
        # The checkpoint is verified and its config compared with this run's before any data or model is built.
        resume_from = resolve_resume(cfg.resume, run_dir)
        saved = load_training_state(resume_from) if resume_from else None
        if saved:
            check_resume_config(saved["config"], resolved_cfg, resume_from)
        self.layout = layout = parallel_layout(ctx, cfg.parallel.context)
        # Context ranks split the data rank's sequences: only data ranks add tokens.
        self.grad_accum = grad_accum_steps(cfg.train, cfg.seq_len, layout.data_size)
        self.tokens_per_step = cfg.train.batch_size * cfg.seq_len * self.grad_accum * layout.data_size
        if prepare_backend(cfg.attention.name, device):
            log.warning("attention=flash without CUDA runs through the Triton interpreter: slow but exact")
        check_head_dim(cfg.attention.name, cfg.model.d_model // cfg.model.n_head)
        _seed_everything(cfg.seed + ctx.rank)  # distinct dropout per rank; DDP broadcasts rank 0's initial weights

        splits = load_splits(cfg.data, prepare_if_missing=True)
        self.train_tokens = splits.train
        # Each context rank reads its data rank's whole batch and keeps its share (TrainStep): document ids count
        # from a sequence's start, and a batch of token ids is a few MB against the activations' GBs.
        self.sampler = WindowSampler(
            len(splits.train),
            cfg.seq_len,
            cfg.train.batch_size,
            cfg.seed,
            rank=layout.data_rank,
            world_size=layout.data_size,
        )
        document_mask = cfg.data.document_mask
        self.evaluator = Evaluator(
            splits.val, splits.val_docs, cfg.seq_len, cfg.eval, ctx, document_mask=document_mask, layout=layout
        )

        self.raw_model, self.optimizer, self.scheduler = build_model_and_optimizer(cfg, device)
        if layout.context is not None:
            apply_context_parallel(self.raw_model, layout.context)
        self.flops_per_token = self.raw_model.flops_per_token(cfg.seq_len)
        self.peak_flops = peak_flops_per_sec(device_name(device))
        if self.peak_flops is None:
            log.info(f"MFU: unknown peak FLOP/s for {device_name(device)}; perf/mfu is reported as null")

        self.step = 0
        self.last_checkpoint: Path | None = None
        wandb_id = self._resume(resume_from, saved)
        if cfg.extend_from is not None and self.step == 0:  # fresh: a resumed run continues its own checkpoint
            trained = (self.raw_model, self.optimizer, self.scheduler)
            self.step = extend_from_checkpoint(Path(cfg.extend_from), *trained, resolved_cfg, self.tokens_per_step)
        if cfg.model.init_from is not None and self.step == 0:  # fresh: a resumed run continues its own checkpoint
            load_into(self.raw_model, cfg.model.init_from)
            log.info(f"model weights from {cfg.model.init_from}")

        model = compile_model(self.raw_model) if cfg.compile else self.raw_model
        if ctx.is_distributed:
            # The model's buffers (block layout, rope's cos/sin tables) are constants built alike on every rank:
            # broadcasting them from rank 0 before every forward, DDP's default, would copy megabytes for nothing.
            devices = [ctx.local_rank] if device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=devices, broadcast_buffers=False)
        self.train_step = TrainStep(
            model,
            self.optimizer,
            self.scheduler,
            grad_accum=self.grad_accum,
            grad_clip=cfg.train.grad_clip,
            ctx=ctx,
            document_mask=document_mask,
            context=layout.context,
        )
        # Steps queued on the device whose numbers the host has not read yet: (step, lr, numbers).
        self.in_flight: list[tuple[int, float, StepNumbers]] = []
        self.clock = 0.0  # when the last read step finished or the device last sat idle (perf_counter)
        self.metrics = (
            MetricsLogger(run_dir, cfg.wandb, resolved_cfg, resume_step=self.step, wandb_id=wandb_id)
            if ctx.is_main
            else None
        )
        self.step_times: list[float] = []
        self.last_val: dict[str, Any] = {}
        log.info(
            f"model {cfg.model.name}: {self.raw_model.num_params() / 1e6:.2f}M parameters, attention="
            f"{cfg.attention.name}, seq_len={cfg.seq_len}, {self.tokens_per_step} tokens/step "
            f"(batch {cfg.train.batch_size} x grad_accum {self.grad_accum} x {layout.data_size} data ranks; "
            f"parallel.context={cfg.parallel.context}), "
            f"device {device_name(device)}"
        )
        documents = ", documents (data.document_mask)" if document_mask else ""
        self.masks = describe_masks(cfg.attention, self.raw_model.block_layout) + documents
        log.info(f"attention masks: {self.masks}")

    def _resume(self, path: Path | None, state: dict[str, Any] | None) -> str | None:
        """Restore the full training state loaded from `path`; returns the wandb run id to continue."""
        if path is None:
            if self.cfg.resume == "auto":
                log.info(f"resume=auto: no checkpoint in {checkpoint_dir(self.run_dir)}, starting fresh")
            return None
        rank_states = state["rank_states"]
        if len(rank_states) != self.ctx.world_size:
            raise ValueError(
                f"{path} was written by {len(rank_states)} processes; resume it with the same number (now "
                f"{self.ctx.world_size}) so every data shard and RNG stream continues where it stopped"
            )
        settings = optimizer_settings(self.optimizer)  # this run's hyperparameters, which the load overwrites
        try:
            self.raw_model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError) as error:
            raise CheckpointError(f"checkpoint {path} does not fit the model of this run: {error}") from error
        self.scheduler.load_state_dict(state["scheduler"])
        apply_optimizer_settings(self.optimizer, self.scheduler, settings)
        self.sampler.load_state_dict(rank_states[self.ctx.rank]["sampler"])
        restore_rng_state(rank_states[self.ctx.rank]["rng"])
        self.step = state["step"]
        self.last_checkpoint = path
        log.info(f"resumed from {path} at step {self.step}")
        return state["wandb_run_id"]

    def train(self) -> str:
        """Train to the last step (or stop_at_step), evaluating, logging and checkpointing on schedule; returns the
        status written to result.json: "ok", or "nan" / "oom" when the run ended early."""
        cfg = self.cfg
        last_step = cfg.train.stop_at_step or cfg.train.max_steps  # validate: stop_at_step <= max_steps
        progress = tqdm(
            total=last_step, initial=self.step, disable=not self.ctx.is_main, desc="train", dynamic_ncols=True
        )
        try:
            with logging_redirect_tqdm(), StepProfiler(cfg.profile, self.run_dir, self.ctx.rank) as profiler:
                self.clock = time.perf_counter()
                while self.step < last_step:
                    self.step += 1
                    self._queue_step()
                    profiler.step()
                    evaluate = _due(self.step, cfg.eval.every, last_step)
                    checkpoint = cfg.checkpoint.every and _due(self.step, cfg.checkpoint.every, last_step)
                    # The host reads the previous step's numbers while the device runs this one. An evaluation, a
                    # checkpoint or the end first reads every step: a checkpoint must follow finite steps only.
                    records = self._read_steps(keep=0 if evaluate or checkpoint or self.step == last_step else 1)
                    if evaluate:
                        self.last_val = self.evaluator.evaluate(self.raw_model)
                        records[-1][1].update(self.last_val)  # this step's record: keep=0 read it
                    for step, record in records:
                        if _due(step, cfg.log.every, last_step) or "val/loss" in record:
                            self._log(record, step)
                        progress.set_postfix(_postfix(record), refresh=False)
                    progress.update()
                    if checkpoint:
                        self._save_checkpoint()
                    if evaluate or checkpoint:
                        self.clock = time.perf_counter()  # the device sat idle meanwhile: no step's time
            if not self.last_val:  # resumed a run that had already reached its last step
                self.last_val = self.evaluator.evaluate(self.raw_model)
            return self._finish("ok")
        except NonFiniteLossError as error:
            last_good = last_good_checkpoint(self.last_checkpoint)
            log.error(f"{error}; last good checkpoint: {last_good or 'none (no checkpoint was written yet)'}")
            return self._finish("nan", message=str(error), last_checkpoint=last_good)
        except torch.cuda.OutOfMemoryError as error:
            requested = oom_request_gib(str(error))
            asked = "an unknown amount" if requested is None else f"{requested:.2f} GiB"
            log.error(
                f"out of memory at step {self.step} (result, not crash): tried to allocate {asked} with "
                f"{_peak_memory_gib(self.ctx.device):.2f} GiB already allocated at peak; see result.json"
            )
            return self._finish("oom", message=str(error).splitlines()[0], **{"oom/requested_gib": requested})
        finally:
            progress.close()

    def _queue_step(self) -> None:
        """Queue this step's work on the device; the host reads its numbers later (_read_steps)."""
        lr = self.optimizer.param_groups[0]["lr"]
        stats = self.train_step(self._next_batch)
        self.in_flight.append((self.step, lr, StepNumbers(stats)))

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return get_batch(self.train_tokens, self.sampler.next_starts(), self.cfg.seq_len, self.ctx.device)

    def _read_steps(self, keep: int) -> list[tuple[int, dict[str, Any]]]:
        """Read every queued step but the newest `keep`, in order, waiting for the device where it has not finished
        them; returns their train/, perf/ and mem/ metrics. Raises NonFiniteLossError at the first step whose loss
        or gradient norm is not finite: the device skipped its update and every later one (TrainStep), so the
        weights are still those of the step before."""
        records = []
        while len(self.in_flight) > keep:
            step, lr, numbers = self.in_flight.pop(0)
            loss, norm = numbers.values()
            for what, value in (("loss", loss), ("gradient norm", norm)):
                if not math.isfinite(value):
                    self.step = step  # the run ends at the step that went bad
                    raise NonFiniteLossError(what, value, step)
            # Successive steps finish back to back on a busy device: the time between their ends is a step's time.
            step_time = numbers.done_at - self.clock
            self.clock = numbers.done_at
            self.step_times.append(step_time)
            tokens_per_sec = self.tokens_per_step / step_time
            record = {
                "train/loss": loss,
                "train/lr": lr,
                "train/grad_norm": norm,
                "train/tokens": step * self.tokens_per_step,
                "perf/step_time_s": step_time,
                "perf/tokens_per_sec": tokens_per_sec,
                "perf/mfu": mfu(self.flops_per_token, tokens_per_sec, self.peak_flops, self.ctx.world_size),
                "mem/peak_gib": _peak_memory_gib(self.ctx.device),
            }
            records.append((step, record))
        return records

    def _log(self, record: dict[str, Any], step: int | None = None) -> None:
        """Write `record` as the metrics of `step` (default: the current step)."""
        if self.metrics:
            self.metrics.log(self.step if step is None else step, record)

    def _save_checkpoint(self) -> None:
        # Every rank has its own data shard position and RNG streams: gather them so rank 0 saves them all.
        rank_states = all_gather_objects({"sampler": self.sampler.state_dict(), "rng": capture_rng_state()}, self.ctx)
        path = checkpoint_dir(self.run_dir) / LATEST
        if self.ctx.is_main:
            state = {
                "model": self.raw_model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "step": self.step,
                "rank_states": rank_states,
                "config": self.resolved_cfg,
                "wandb_run_id": self.metrics.wandb_id,
            }
            save_checkpoint(state, path)
            self.metrics.checkpoint_saved(path, self.step)
        self.last_checkpoint = path

    def _finish(self, status: str, **details: Any) -> str:
        """Write result.json (rank 0) and close the metrics; returns `status`."""
        steady = self.step_times[STEADY_STATE_SKIP:] or self.step_times
        tokens_per_sec = self.tokens_per_step / statistics.median(steady) if steady else None  # no step ran here
        result = {
            "status": status,
            "backend": self.cfg.attention.name,
            "seq_len": self.cfg.seq_len,
            "model": self.cfg.model.name,
            "step": self.step,
            "max_steps": self.cfg.train.max_steps,
            "tokens_per_step": self.tokens_per_step,
            "device": device_name(self.ctx.device),
            "world_size": self.ctx.world_size,
            "parallel_context": self.cfg.parallel.context,
            "compile": self.cfg.compile,
            "attention_masks": self.masks,
            "position_embedding": self.cfg.model.position_embedding.value,
            # The base this run's rotations used (after an extension that raised it, the raised one); learned: null.
            "rope_base": self.cfg.model.rope_base if self.raw_model.wpe is None else None,
            "val/loss": self.last_val.get("val/loss"),
            "val/ppl": self.last_val.get("val/ppl"),
            "perf/tokens_per_sec": tokens_per_sec,
            "perf/mfu": mfu(self.flops_per_token, tokens_per_sec, self.peak_flops, self.ctx.world_size),
            "mem/peak_gib": _peak_memory_gib(self.ctx.device),
            **details,
        }
        if not self.step_times:  # resumed at its last step, nothing trained: keep the speed the earlier job measured
            result.update(self._earlier_speed())
        if self.metrics:
            if status != "ok":
                self._log({"status": status, **details})
            self.metrics.finish(result)
        return status

    def _earlier_speed(self) -> dict[str, Any]:
        """perf/ and mem/ numbers of the run dir's result.json when it describes this same step, else none."""
        path = self.run_dir / RESULT_FILE
        earlier = json.loads(path.read_text()) if path.is_file() else {}
        if earlier.get("step") != self.step:
            return {}
        return {key: earlier[key] for key in ("perf/tokens_per_sec", "perf/mfu", "mem/peak_gib") if key in earlier}


def _due(step: int, every: int, last_step: int) -> bool:
    """Periodic events fire every `every` steps (never when 0) and always at the last step."""
    return step == last_step or (every > 0 and step % every == 0)


def _postfix(record: dict[str, Any]) -> dict[str, str]:
    mfu_value = record["perf/mfu"]
    return {
        "loss": f"{record['train/loss']:.3f}",
        "tok/s": f"{record['perf/tokens_per_sec']:,.0f}",
        "mfu": "n/a" if mfu_value is None else f"{mfu_value:.1%}",
    }


def _peak_memory_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
