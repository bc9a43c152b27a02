"""The typed config tree. Registered in Hydra's ConfigStore as the schema of configs/config.yaml, so every group
file and command-line override is checked against these dataclasses: a misspelt key or a wrong type fails at
start-up, before any work. `validate` adds the checks that span fields."""

import logging
import math
from dataclasses import dataclass, field
from enum import Enum

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from flashgpt.data.config import DataConfig
from flashgpt.data.tokenizer import TOKENIZER_NAME, VOCAB_SIZE
from flashgpt.model.attention import AttentionConfig, check_attention_config
from flashgpt.model.backends import ATTENTION_BACKENDS
from flashgpt.model.gpt import ModelConfig, PositionEmbedding
from flashgpt.model.hf import hf_source
from flashgpt.training.profiling import PROFILED_UNTIL
from flashgpt.training.resolvers import register_resolvers

log = logging.getLogger(__name__)

# A guard against typos such as seq_len=655360: at 64K tokens GPT-2's learned position table alone is 50M
# parameters, and the attention benchmarks stop at 16K. Per rank: parallel.context=N allows N times as many.
MAX_SEQ_LEN = 65536


class Device(str, Enum):
    auto = "auto"  # cuda when available, else cpu
    cpu = "cpu"
    cuda = "cuda"


class PositionInit(str, Enum):
    """How an extension (extend_from) fills a longer learned position table (training/extension.py)."""

    tile = "tile"  # row p = trained row p mod n_old: the first n_old positions stay exactly as trained
    interpolate = "interpolate"  # the trained rows stretched over the new length, linear between neighbours


class WandbMode(str, Enum):
    offline = "offline"  # no account or network needed; upload later with `wandb sync <run dir>/wandb/offline-run-*`
    online = "online"
    disabled = "disabled"


@dataclass
class TrainConfig:
    batch_size: int = 8  # sequences per micro-step per process
    grad_accum: int = 1  # micro-steps per optimizer step
    tokens_per_step: int | None = None  # when set, derives grad_accum = tokens_per_step / (batch_size·seq_len·ranks)
    max_steps: int = 1000  # optimizer steps; the learning-rate schedule spans them
    stop_at_step: int | None = None  # end this job after that step (checkpointed) without changing the schedule
    lr: float = 6e-4
    min_lr: float | None = None  # where the cosine ends; None: lr / 10
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping


@dataclass
class EvalConfig:
    every: int = 250  # steps between evaluations; 0: only after the last step
    steps: int = 20  # batches per evaluation
    batch_size: int = 8  # windows of seq_len tokens per batch
    span_len: int | None = None  # tokens per held-out span, a multiple of seq_len; None: seq_len


@dataclass
class CheckpointConfig:
    every: int = 1000  # steps between checkpoints (and one after the last step); 0: never checkpoint


@dataclass
class LogConfig:
    every: int = 10  # steps between metrics lines (the last step is always logged)


@dataclass
class WandbConfig:
    mode: WandbMode = WandbMode.offline
    project: str = "flashgpt"
    entity: str | None = None
    name: str | None = None
    dir: str | None = None  # None: the run dir
    group: str | None = None  # runs shown together, e.g. one sweep: wandb.group=long_context_speed
    tags: list[str] = field(default_factory=list)  # wandb.tags=[flash,h100]
    job_type: str = "train"
    notes: str | None = None
    log_checkpoints: bool = False  # log every checkpoint as a "model" artifact (a full copy per save: opt in)


@dataclass
class ParallelConfig:
    """How the processes of a torchrun job share the work: world_size = data x context."""

    # Ranks that split each sequence (context parallelism, model/context_parallel.py); the rest is data parallel.
    context: int = 1


@dataclass
class Config:
    model: ModelConfig = MISSING
    attention: AttentionConfig = MISSING
    data: DataConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    seq_len: int = 1024  # training context; also the model's block size (position embeddings)
    device: Device = Device.auto
    seed: int = 0
    resume: str | None = None  # a checkpoint path, or "auto": the run dir's latest checkpoint if there is one
    # A fresh run starts from this checkpoint of the same model at a shorter seq_len, continuing its weights,
    # optimizer and schedule with the position table extended (context extension: training/extension.py).
    extend_from: str | None = None
    extend_positions: PositionInit = PositionInit.tile  # the longer learned table's rows; rope has no table
    overwrite: bool = False  # start afresh in a run dir that holds a run, deleting its metrics and checkpoints
    compile: bool = False  # torch.compile the model
    profile: bool = False  # a torch.profiler trace of a few steady-state steps in <run dir>/profile/


def register_configs() -> None:
    register_resolvers()  # the configs' ${batch_for:...} etc. resolve when composed
    ConfigStore.instance().store(name="config_schema", node=Config)


def typed_config(cfg: DictConfig) -> Config:
    """The composed config as dataclasses. Hydra lets `+key=value` add keys even to a schema node; merging into
    a fresh schema rejects those too, so every key of a run is one the code reads."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.to_container(cfg)))


def validate(cfg: Config) -> None:
    """Checks across fields, run before any data is loaded or model built; raises ValueError."""
    longest = MAX_SEQ_LEN * max(cfg.parallel.context, 1)
    if not 0 < cfg.seq_len <= longest:
        raise ValueError(f"seq_len={cfg.seq_len} is out of range: it must be in [1, {longest}]")
    if cfg.attention.name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention.name={cfg.attention.name!r}; choose one of: {', '.join(ATTENTION_BACKENDS)}")
    check_attention_config(cfg.attention)
    for key in ("n_layer", "n_head", "d_model"):
        if getattr(cfg.model, key) < 1:
            raise ValueError(f"model.{key}={getattr(cfg.model, key)} must be at least 1")
    if cfg.model.vocab_size < VOCAB_SIZE:
        raise ValueError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's {VOCAB_SIZE} tokens "
            f"({TOKENIZER_NAME}); every token id needs a row (GPT-2 pads it to 50304)"
        )
    if cfg.model.d_model % cfg.model.n_head:
        raise ValueError(f"model.d_model={cfg.model.d_model} is not divisible by model.n_head={cfg.model.n_head}")
    _check_positions(cfg)
    _check_parallel(cfg)
    floats = {
        "train.lr": cfg.train.lr,
        "train.min_lr": cfg.train.min_lr,
        "train.weight_decay": cfg.train.weight_decay,
        "train.beta1": cfg.train.beta1,
        "train.beta2": cfg.train.beta2,
        "train.grad_clip": cfg.train.grad_clip,
        "model.dropout": cfg.model.dropout,
    }
    for key, value in floats.items():
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{key}={value} must be a finite number")
    if not 0.0 <= cfg.model.dropout < 1.0:
        raise ValueError(f"model.dropout={cfg.model.dropout} must be in [0, 1)")
    for key in ("beta1", "beta2"):
        if not 0.0 <= getattr(cfg.train, key) < 1.0:
            raise ValueError(f"train.{key}={getattr(cfg.train, key)} must be in [0, 1)")
    span_len = cfg.eval.span_len
    if span_len is not None and (span_len < cfg.seq_len or span_len % cfg.seq_len):
        raise ValueError(
            f"eval.span_len={span_len} must be a multiple of seq_len={cfg.seq_len} (at least seq_len): each span "
            "is cut into whole seq_len windows"
        )
    if cfg.train.stop_at_step is not None and not 1 <= cfg.train.stop_at_step <= cfg.train.max_steps:
        raise ValueError(
            f"train.stop_at_step={cfg.train.stop_at_step} must be in [1, train.max_steps={cfg.train.max_steps}]"
        )
    positive = {
        "train.lr": cfg.train.lr,
        "train.batch_size": cfg.train.batch_size,
        "train.grad_accum": cfg.train.grad_accum,
        "train.max_steps": cfg.train.max_steps,
        "eval.steps": cfg.eval.steps,
        "eval.batch_size": cfg.eval.batch_size,
        "log.every": cfg.log.every,
    }
    if cfg.train.tokens_per_step is not None:
        positive["train.tokens_per_step"] = cfg.train.tokens_per_step
    for key, value in positive.items():
        if value <= 0:
            raise ValueError(f"{key}={value} must be positive")
    non_negative = {
        "train.warmup_steps": cfg.train.warmup_steps,
        "train.weight_decay": cfg.train.weight_decay,
        "train.grad_clip": cfg.train.grad_clip,  # a negative norm would flip the gradients, not bound them
        "eval.every": cfg.eval.every,
        "checkpoint.every": cfg.checkpoint.every,
    }
    for key, value in non_negative.items():
        if value < 0:
            raise ValueError(f"{key}={value} must be >= 0")
    if cfg.train.min_lr is not None and not 0 <= cfg.train.min_lr <= cfg.train.lr:
        raise ValueError(f"train.min_lr={cfg.train.min_lr} must be in [0, train.lr={cfg.train.lr}] (null: lr / 10)")
    if cfg.train.warmup_steps > cfg.train.max_steps:
        # Legitimate in a smoke test, a mistake in a real run: warn rather than refuse.
        log.warning(
            f"train.warmup_steps={cfg.train.warmup_steps} is longer than the run (train.max_steps="
            f"{cfg.train.max_steps}): the learning rate only climbs to "
            f"{cfg.train.max_steps / cfg.train.warmup_steps:.0%} of train.lr={cfg.train.lr} and never decays; "
            "lower train.warmup_steps"
        )
    if cfg.model.init_from is not None:
        hf_source(cfg.model.init_from)  # hf:<directory or Hub name>, else a ValueError naming model.init_from
        if cfg.extend_from is not None:
            raise ValueError("model.init_from and extend_from both give the starting weights: set one of them")
    last_step = cfg.train.stop_at_step or cfg.train.max_steps
    if cfg.profile and last_step < PROFILED_UNTIL:
        raise ValueError(
            f"profile=true traces steps up to {PROFILED_UNTIL} (after warm-up, training/profiling.py), but the run "
            f"ends at step {last_step}: raise train.max_steps (and train.stop_at_step)"
        )


def _check_positions(cfg: Config) -> None:
    rope = cfg.model.position_embedding == PositionEmbedding.rope
    if not (math.isfinite(cfg.model.rope_base) and cfg.model.rope_base > 1):
        raise ValueError(
            f"model.rope_base={cfg.model.rope_base} must be a finite number > 1 (rotation speeds base^(-2i/D) fall "
            "from 1 with i); 10000 is RoPE's default"
        )
    if rope and (cfg.model.d_model // cfg.model.n_head) % 2:
        raise ValueError(
            f"model.position_embedding=rope rotates pairs of head dims; the head dim model.d_model / model.n_head = "
            f"{cfg.model.d_model // cfg.model.n_head} is odd"
        )
    if rope and cfg.model.init_from is not None:
        raise ValueError(
            "model.init_from loads GPT-2, whose positions are a learned table: use model.position_embedding=learned "
            "with it"
        )
    if rope and cfg.extend_positions != PositionInit.tile:
        raise ValueError(
            f"extend_positions={cfg.extend_positions.value} fills a learned position table, and "
            "model.position_embedding=rope has none: leave extend_positions=tile, and change model.rope_base to "
            "adjust rope to a longer context"
        )


def _check_parallel(cfg: Config) -> None:
    """What parallel.context needs of the run; the world size is checked when the processes start."""
    context = cfg.parallel.context
    if context < 1:
        raise ValueError(f"parallel.context={context} must be >= 1 (1: no context parallelism)")
    if context == 1:
        return
    chunk, block_sparse = cfg.seq_len // (2 * context), cfg.attention.block_sparse.pattern is not None
    if cfg.seq_len % (2 * context) or (block_sparse and chunk % cfg.attention.block_size):
        blocks = f" of whole blocks (attention.block_size={cfg.attention.block_size})" if block_sparse else ""
        raise ValueError(
            f"parallel.context={context} cuts each sequence into {2 * context} equal chunks{blocks}: seq_len="
            f"{cfg.seq_len} does not split so"
        )
    if cfg.compile:
        raise ValueError("compile=true with parallel.context > 1 is not supported yet (neither traced nor tested)")


def grad_accum_steps(train: TrainConfig, seq_len: int, data_ranks: int) -> int:
    """Micro-steps per optimizer step: train.grad_accum, or derived from train.tokens_per_step when that is set.
    data_ranks: the ranks that read distinct batches (world_size / parallel.context)."""
    if train.tokens_per_step is None:
        return train.grad_accum
    tokens_per_micro_step = train.batch_size * seq_len * data_ranks
    if train.tokens_per_step % tokens_per_micro_step:
        raise ValueError(
            f"train.tokens_per_step={train.tokens_per_step} is not divisible by batch_size·seq_len·data ranks = "
            f"{train.batch_size}·{seq_len}·{data_ranks} = {tokens_per_micro_step}"
        )
    return train.tokens_per_step // tokens_per_micro_step
