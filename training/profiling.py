"""profile=true: a torch.profiler trace of a few steady-state training steps, written to <run dir>/profile/.

The first SKIP_STEPS steps of the process are left out (compilation, Triton autotuning, allocator growth), one more
warms the profiler up, and the next ACTIVE_STEPS are recorded: a run needs at least PROFILED_UNTIL steps. The trace is
a Chrome trace, `rank<r>.<time>.pt.trace.json`: open it in Perfetto (https://ui.perfetto.dev) or chrome://tracing, or
point TensorBoard's profiler plugin at the folder (`tensorboard --logdir <run dir>/profile`). The ranges "forward",
"backward" and "optimizer" (training/step.py) mark each micro-step's phases; on a GPU, kernels appear under their own
names (ours: flash_fwd_kernel, flash_bwd_dkdv_kernel, ...; PyTorch's: its cuBLAS/cuDNN kernels) beneath them.
"""

import logging
from pathlib import Path
from types import TracebackType

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

log = logging.getLogger(__name__)

PROFILE_DIR = "profile"
SKIP_STEPS = 3
WARMUP_STEPS = 1
ACTIVE_STEPS = 3
PROFILED_UNTIL = SKIP_STEPS + WARMUP_STEPS + ACTIVE_STEPS  # the last traced step of the process


class StepProfiler:
    """Context manager around the training loop; call step() after each optimizer step. Disabled, it does nothing."""

    def __init__(self, enabled: bool, run_dir: Path, rank: int) -> None:
        self.out_dir = run_dir / PROFILE_DIR
        self.steps = 0
        self.profiler: profile | None = None
        if enabled:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self.profiler = profile(
                activities=activities,
                schedule=schedule(skip_first=SKIP_STEPS, wait=0, warmup=WARMUP_STEPS, active=ACTIVE_STEPS, repeat=1),
                on_trace_ready=tensorboard_trace_handler(str(self.out_dir), worker_name=f"rank{rank}"),
                record_shapes=True,  # the (B, T, ...) of every op: which call a kernel belongs to
            )

    def __enter__(self) -> "StepProfiler":
        if self.profiler:
            self.profiler.__enter__()
        return self

    def step(self) -> None:
        self.steps += 1
        if self.profiler:
            self.profiler.step()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if not self.profiler:
            return
        self.profiler.__exit__(kind, error, traceback)
        traces = sorted(self.out_dir.glob("*.pt.trace.json"))
        if traces:
            log.info(f"profile: steps {SKIP_STEPS + WARMUP_STEPS + 1}-{PROFILED_UNTIL} of this process in {traces[-1]}")
        else:
            log.warning(
                f"profile=true wrote no trace: this process ran {self.steps} steps and the trace covers steps "
                f"{SKIP_STEPS + WARMUP_STEPS + 1}-{PROFILED_UNTIL}"
            )
