"""The project as its users' tools see it: the wheel claims one import name and carries the configs, the core installs
with torch and triton alone, the installed entry point composes the configs, transformers' GPT-2 works next to us."""

import email.parser
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from omegaconf.errors import InterpolationResolutionError

from flashgpt.training.config import grad_accum_steps, register_configs, typed_config, validate
from flashgpt.training.main import main
from flashgpt.training.resolvers import batch_for
from training_runs import TINY, assert_ok, train
from wandb_records import offline_runs, records

REPO = Path(__file__).resolve().parents[1]
# What a build reads: pyproject.toml and the package dirs it maps to flashgpt.* (a build writes build/ and egg-info
# next to its sources, so it runs on a copy).
BUILD_SOURCES = ["pyproject.toml", "flashgpt", "kernels", "model", "data", "training", "configs"]
TRAIN_ONLY = ["hydra", "omegaconf", "yaml", "datasets", "tiktoken", "wandb", "tqdm", "matplotlib", "transformers"]


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without PYTHONPATH: the test runner puts the checkout on sys.path, a user's shell does not."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return {**env, **extra}


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(command, cwd=cwd, env=env or _clean_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in BUILD_SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(path, src / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    [built] = out.glob("flashgpt-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed into a folder of its own (pip install --target): a site-packages holding only us."""
    target = tmp_path_factory.mktemp("site")
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    return target


def test_the_wheel_claims_only_the_flashgpt_import_name_and_carries_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = next(name.split("/")[0] for name in names if ".dist-info/" in name)
    assert {name.split("/")[0] for name in names} == {"flashgpt", dist_info}
    for subpackage in ("kernels", "model", "data", "training", "configs"):
        assert f"flashgpt/{subpackage}/__init__.py" in names
    assert "flashgpt/configs/config.yaml" in names
    assert "flashgpt/configs/experiment/long_context_speed.yaml" in names
    assert "flashgpt/configs/model/gpt2-medium.yaml" in names
    assert "flashgpt/data/assets/gpt2.tiktoken" in names and "flashgpt/kernels/tuned_h100.json" in names
    assert not [name for name in names if name.startswith(("tests/", "scripts/", "results/"))]


def test_the_core_requires_torch_triton_and_numpy_only_and_extras_add_the_rest(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
        entry_points = archive.read(metadata_name.replace("METADATA", "entry_points.txt")).decode()
    requires = metadata.get_all("Requires-Dist")
    core = sorted(r for r in requires if "extra ==" not in r)
    assert core == ["numpy<2.4", "torch>=2.4", "triton>=3.2"]

    def extra(name: str) -> set[str]:
        return {r.split(";")[0].strip() for r in requires if f'extra == "{name}"' in r}

    assert {"hydra-core>=1.3", "omegaconf>=2.3", "wandb>=0.17", "datasets>=2.18", "tiktoken>=0.6"} <= extra("train")
    assert {"transformers>=4.40", "safetensors"} <= extra("hf")
    assert "flashgpt[hf,train]" in extra("test") or "flashgpt[train,hf]" in extra("test")
    assert set(metadata.get_all("Provides-Extra")) == {"train", "hf", "test"}
    assert "flashgpt-train = flashgpt.training.main:main" in entry_points


def test_the_kernel_and_model_work_without_the_training_extras(tmp_path: Path) -> None:
    """The [train] and [hf] packages made unimportable, as if only torch and triton were installed: the kernel and
    GPT-2 (flash through the interpreter) still run, and the HF interop says which extra it needs."""
    code = f"""
        import sys
        sys.modules.update(dict.fromkeys({TRAIN_ONLY!r}))  # None: `import x` fails, find_spec("x") is None
        import torch
        from flashgpt.kernels import flash_attention
        from flashgpt.model.gpt import GPT, ModelConfig
        q = torch.randn(1, 2, 16, 32)
        assert flash_attention(q, q, q, causal=True).shape == (1, 2, 16, 32)
        model = GPT(ModelConfig(n_layer=1, n_head=2, d_model=64, vocab_size=128), 16, "flash")
        assert model(torch.randint(0, 128, (1, 16))).shape == (1, 16, 128)
        from flashgpt.model import hf
        try:
            hf.load_hf_gpt2("gpt2")
        except ImportError as error:
            print(error)
    """
    proc = _python(code, cwd=tmp_path, env=_clean_env(TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'pip install "flashgpt[hf]"' in proc.stdout


def test_the_installed_entry_point_composes_the_packaged_configs(installed: Path, tmp_path: Path) -> None:
    """flashgpt-train from the wheel, run outside any checkout: Hydra finds the configs inside the package and the
    preset's resolver derives the batch from seq_len."""
    env = _clean_env(PYTHONPATH=str(installed))
    proc = _python("import flashgpt.training.main as main; print(main.__file__)", cwd=tmp_path, env=env)
    assert proc.returncode == 0 and proc.stdout.startswith(str(installed)), proc.stdout + proc.stderr
    command = [str(installed / "bin" / "flashgpt-train"), "--cfg", "job", "--resolve"]
    overrides = ["experiment=long_context_speed", "seq_len=4096", "model=gpt2-medium"]
    proc = subprocess.run([*command, *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  batch_size: 8\n" in proc.stdout and "name: gpt2-medium" in proc.stdout
    assert "group: long_context_speed" in proc.stdout


def test_nothing_outside_flashgpt_is_importable_from_the_install(tmp_path: Path) -> None:
    """Outside the checkout the repository's folder names are not import names: `kernels` is Hugging Face's."""
    proc = _python(
        "import importlib.util, flashgpt.kernels; print([importlib.util.find_spec(n) for n in "
        "('kernels', 'model', 'data', 'training', 'configs')])",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[None, None, None, None, None]"


def test_transformers_gpt2_works_next_to_us() -> None:
    """Our packages imported first, then transformers and its GPT-2, run from the checkout: the hardest case, since
    there (as for `python train.py`) the repository root, and so its kernels/ folder, is first on sys.path."""
    code = """
        import torch
        import flashgpt.kernels, flashgpt.model.gpt, flashgpt.training.loop
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=16, vocab_size=100)).eval()
        print(tuple(model(torch.randint(0, 100, (1, 16))).logits.shape))
    """
    proc = _python(code, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "(1, 16, 100)"


# --- Hydra: resolvers, native sweeps, the sweeper's objective ---------------------------------------------------


def test_batch_for_divides_exactly_and_names_the_fix() -> None:
    assert [batch_for(32768, t) for t in (1024, 2048, 4096, 8192, 16384)] == [32, 16, 8, 4, 2]
    with pytest.raises(ValueError, match=r"32768 tokens do not split into whole sequences of seq_len=3000"):
        batch_for(32768, 3000)
    with pytest.raises(ValueError, match="seq_len=0"):
        batch_for(32768, 0)


@pytest.mark.parametrize("preset", ["long_context_speed", "long_context_ppl"])
def test_presets_derive_the_batch_from_seq_len(preset: str) -> None:
    """Every swept length holds the same tokens per micro-step, with one micro-step per optimizer step."""
    register_configs()
    with initialize_config_module(config_module="flashgpt.configs", version_base="1.3"):
        for seq_len in (1024, 2048, 4096, 8192, 16384):
            cfg = typed_config(compose("config", overrides=[f"experiment={preset}", f"seq_len={seq_len}"]))
            validate(cfg)
            assert cfg.train.batch_size * seq_len == cfg.eval.batch_size * seq_len == 32768
            assert grad_accum_steps(cfg.train, seq_len, data_ranks=1) == 1
            assert cfg.wandb.group == preset
        with pytest.raises(InterpolationResolutionError, match="seq_len=3000; choose a seq_len that divides 32768"):
            typed_config(compose("config", overrides=[f"experiment={preset}", "seq_len=3000"]))


def test_a_native_multirun_sweeps_seq_len_with_the_batch_following(tmp_path: Path) -> None:
    """`train.py -m` over seq_len with the speed preset (shrunk to gpt2-tiny on a CPU): one run dir per point, named
    <backend>-<seq_len>, each with the same tokens per step, its resolved config printed and saved."""
    sweep_dir = tmp_path / "sweep"
    overrides = [
        "experiment=long_context_speed", "attention=sdpa", "seq_len=32,64", "model=gpt2-tiny", "data=shakespeare",
        "device=cpu", "train.tokens_per_step=256", "train.max_steps=2", "wandb.mode=disabled",
        f"hydra.sweep.dir={sweep_dir}",
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "train.py", "-m", *overrides], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("config, resolved:") == 2
    for seq_len, batch in ((32, 8), (64, 4)):
        run_dir = sweep_dir / f"sdpa-{seq_len}"
        result = json.loads((run_dir / "result.json").read_text())
        assert (result["status"], result["seq_len"], result["tokens_per_step"]) == ("ok", seq_len, 256)
        resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
        assert resolved["train"]["batch_size"] == resolved["eval"]["batch_size"] == batch
        assert "${batch_for:" in (run_dir / ".hydra" / "config.yaml").read_text()  # as written, for the record

    # The sweep's report, logged to W&B as well: plots, the runs as a table, the report folder as an artifact.
    report = [sys.executable, str(REPO / "scripts" / "report.py"), "--out", str(tmp_path / "report")]
    report += ["--speed", str(sweep_dir), "--wandb", "offline", "--wandb-group", "long_context_speed"]
    env = {**os.environ, "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}
    proc = subprocess.run(report, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [path] = offline_runs(tmp_path)
    log = list(records(path))
    [run] = [r.run for r in log if r.HasField("run")]
    assert (run.job_type, run.run_group, run.display_name) == ("report", "long_context_speed", "report")
    logged = {tuple(item.nested_key): item.value_json for r in log if r.HasField("history") for item in r.history.item}
    assert logged[("plots/throughput", "_type")] == logged[("plots/memory", "_type")] == '"image-file"'
    assert logged[("tables/speed", "_type")] == '"table-file"' and logged[("tables/speed", "nrows")] == "2"
    [report_folder] = [r.artifact for r in log if r.HasField("artifact") and r.artifact.type == "report"]
    assert "report.md" in {entry.path for entry in report_folder.manifest.contents}


def test_main_returns_the_final_validation_loss(tmp_path: Path) -> None:
    """The value a sweeper plugin (Optuna) minimises: main's return, equal to result.json's val/loss."""
    register_configs()
    overrides = [*TINY, "train.max_steps=3", "eval.steps=1", f"hydra.run.dir={tmp_path}"]
    with initialize_config_module(config_module="flashgpt.configs", version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path)
        HydraConfig.instance().set_config(cfg)
        del cfg["hydra"]
    val_loss = main(cfg)  # hydra.main passes a given config straight to the function
    result = json.loads((tmp_path / "result.json").read_text())
    assert isinstance(val_loss, float) and val_loss == result["val/loss"] and 0 < val_loss < 11
    assert yaml.safe_load((tmp_path / "resolved_config.yaml").read_text())["train"]["max_steps"] == 3


# --- Weights & Biases ---------------------------------------------------------------------------------------------


def test_wandb_run_carries_group_tags_job_type_notes_and_plots_against_tokens(tmp_path: Path) -> None:
    """What wandb recorded offline, read back from its transaction logs; with a resume, as metrics.py documents:
    a second offline dir with the same run id whose history continues after the checkpoint."""
    run_dir = tmp_path / "run"
    wandb_args = [
        "wandb.mode=offline", "wandb.group=sweep-a", "wandb.tags=[flash,cpu]", "wandb.job_type=smoke",
        "wandb.notes=first try", "train.max_steps=6", "checkpoint.every=2", "eval.every=3",
    ]  # fmt: skip
    assert_ok(train(run_dir, *wandb_args, "train.stop_at_step=4"))
    assert_ok(train(run_dir, *wandb_args, "resume=auto"))
    first, second = offline_runs(run_dir)
    runs, steps = [], []
    for path in (first, second):
        log = list(records(path))
        [run] = [r.run for r in log if r.HasField("run")]
        runs.append(run)
        steps.append([r.history.step.num for r in log if r.HasField("history")])
        metrics = {r.metric.name or r.metric.glob_name: r.metric.step_metric for r in log if r.HasField("metric")}
        assert metrics == {"train/tokens": "", **{f"{ns}/*": "train/tokens" for ns in ("train", "val", "perf", "mem")}}
    assert runs[0].run_id == runs[1].run_id
    for run in runs:
        assert (run.run_group, list(run.tags), run.job_type, run.notes) == (
            "sweep-a",
            ["flash", "cpu"],
            "smoke",
            "first try",
        )
    assert steps == [[1, 2, 3, 4], [5, 6]]
    assert not [r for path in (first, second) for r in records(path) if r.HasField("artifact")]  # opt-in only


def test_checkpoints_become_model_artifacts_when_asked(tmp_path: Path) -> None:
    run_dir, staging = tmp_path / "run", tmp_path / "wandb-data"
    env = {**os.environ, "WANDB_DATA_DIR": str(staging)}  # where offline wandb keeps artifact copies until a sync
    overrides = ["wandb.mode=offline", "wandb.log_checkpoints=true", "train.max_steps=2", "checkpoint.every=2"]
    assert_ok(train(run_dir, *overrides, "eval.every=0", env=env))
    [path] = offline_runs(run_dir)
    [artifact] = [r.artifact for r in records(path) if r.HasField("artifact")]
    assert (artifact.type, sorted(artifact.aliases), json.loads(artifact.metadata)) == (
        "model",
        ["latest", "step-2"],
        {"step": 2},
    )
    [entry] = artifact.manifest.contents
    checkpoint = run_dir / "checkpoints" / "latest.pt"
    assert entry.path == "latest.pt" and entry.size == checkpoint.stat().st_size
    assert Path(entry.local_path).read_bytes() == checkpoint.read_bytes()  # wandb's own copy
