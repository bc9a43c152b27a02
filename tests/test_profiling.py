"""profile=true: a Chrome trace of steady-state steps in the run dir, with our ranges and operators named."""

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from flashgpt.training.config import register_configs, typed_config, validate
from flashgpt.training.profiling import PROFILE_DIR, PROFILED_UNTIL
from training_runs import assert_ok, train


def test_profile_writes_a_trace_of_steady_state_steps_with_named_ranges(tmp_path: Path) -> None:
    """attention=flash on a CPU: our kernel runs in the Triton interpreter, and the trace names its calls like any
    PyTorch op's."""
    run_dir = tmp_path / "run"
    overrides = ["profile=true", "attention=flash", "train.max_steps=8", "train.batch_size=2", "eval.steps=1"]
    proc = train(run_dir, *overrides, "eval.batch_size=2")
    assert_ok(proc)
    [trace] = (run_dir / PROFILE_DIR).glob("rank0.*.pt.trace.json")
    assert f"profile: steps 5-7 of this process in {trace}" in proc.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    names = {event.get("name") for event in events}
    assert {"ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"} <= names  # profiler steps count from 0
    assert not {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#7"} & names  # warm-up and the rest left out
    assert {"forward", "backward", "Optimizer.step#AdamW.step"} <= names
    # Our kernel's forward and backward, under the names of its autograd function or torch.library operator.
    flash = {name for name in names if name and "flashattention" in name.lower().replace("_", "")}
    assert any("backward" in name.lower() for name in flash) and any("backward" not in name.lower() for name in flash)
    forwards = [e for e in events if e.get("name") == "forward" and e.get("ph") == "X"]
    assert len(forwards) == 3 and all(e["dur"] > 0 for e in forwards)  # one micro-step in each traced step


def test_profile_needs_enough_steps() -> None:
    register_configs()
    with initialize_config_module(config_module="flashgpt.configs", version_base="1.3"):
        validate(typed_config(compose("config", overrides=["profile=true", f"train.max_steps={PROFILED_UNTIL}"])))
        short = typed_config(
            compose("config", overrides=["profile=true", "train.max_steps=100", "train.stop_at_step=5"])
        )
        with pytest.raises(ValueError, match=r"profile=true traces steps up to 7 .* but the run ends at step 5"):
            validate(short)
