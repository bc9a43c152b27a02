"""The run report (scripts/report.py) on run dirs in the trainer's formats; bench_attention.py and sweep.py on the
CPU."""

import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import bench_attention  # the scripts, on pytest's pythonpath
import matplotlib.image
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir

from flashgpt.attention_reference import reference_attention
from flashgpt.benchmark_tables import ANCHORS, HOST_BOUND_NOTE, markdown_tables
from flashgpt.gpu_timing import host_ms_per_call
from flashgpt.training import run_report as report
from flashgpt.training import study, study_report, sweep
from flashgpt.training.config import grad_accum_steps, register_configs, typed_config, validate

ROOT = Path(__file__).resolve().parents[1]

TOKENS_PER_STEP = 32768
STEPS = 10
# (backend, seq_len) -> tokens/s of every step after the warm-up; a step-1 outlier tests that warm-up is skipped.
SPEED = {("flash", 1024): 300_000.0, ("flash", 2048): 280_000.0, ("sdpa", 1024): 330_000.0, ("sdpa", 2048): 290_000.0}


def _write_run(run_dir: Path, backend: str, seq_len: int, records: list[dict], result: dict | None) -> None:
    """A Hydra run dir as train.py leaves it, plus the heavy things report.py must not copy."""
    (run_dir / ".hydra").mkdir(parents=True)
    config = {
        "model": {"name": "gpt2", "n_layer": 12, "n_head": 12, "d_model": 768},
        "attention": {"name": backend},
        "data": {"name": "long_prose"},
        "train": {"batch_size": TOKENS_PER_STEP // seq_len, "tokens_per_step": TOKENS_PER_STEP, "max_steps": STEPS},
        "seq_len": seq_len,
        "seed": 0,
    }
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    overrides = ["experiment=long_context_speed", f"attention={backend}", f"seq_len={seq_len}"]
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if result is not None:
        (run_dir / "result.json").write_text(json.dumps({"backend": backend, "seq_len": seq_len, **result}))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest.pt").write_bytes(b"weights")
    (run_dir / "wandb").mkdir()


def _train_records(tokens_per_sec: float, seq_len: int) -> list[dict]:
    records = []
    for step in range(1, STEPS + 1):
        speed = tokens_per_sec / 10 if step == 1 else tokens_per_sec + (step % 3 - 1) * 1000  # median = speed
        records.append(
            {
                "step": step,
                "train/loss": 10.0 - step * 0.3,
                "train/lr": 6e-4,
                "train/grad_norm": 1.0,
                "train/tokens": step * TOKENS_PER_STEP,
                "perf/step_time_s": TOKENS_PER_STEP / speed,
                "perf/tokens_per_sec": speed,
                "perf/mfu": speed / 1e6,
                "mem/peak_gib": 10.0 + seq_len / 1024,
            }
        )
    buckets = {f"{lo}-{2 * lo - 1}" if lo else "0-127": 6.0 - i * 0.1 for i, lo in enumerate([0, 128, 256, 512])}
    buckets |= {"1024-2047": 5.5} if seq_len == 2048 else {}
    loss = 5.0 if seq_len == 1024 else 4.8
    records[-1] |= {"val/loss": loss, "val/ppl": math.exp(loss), "val/loss_by_position": buckets}
    return records


def _ok_result(tokens_per_sec: float, seq_len: int) -> dict:
    """As the trainer writes it; the peak includes the final evaluation, above every step's."""
    return {"status": "ok", "device": "NVIDIA H100 80GB HBM3", "step": STEPS, "tokens_per_step": TOKENS_PER_STEP,
            "perf/tokens_per_sec": tokens_per_sec, "mem/peak_gib": 10.5 + seq_len / 1024}  # fmt: skip


@pytest.fixture
def sweeps(tmp_path: Path) -> dict[str, Path]:
    """runs/speed: flash and sdpa at 1K and 2K, naive OK at 1K, out of memory at 2K, killed before a result at 4K.
    runs/ppl: flash at 1K and 2K. And a kernel benchmark JSON."""
    speed, ppl = tmp_path / "runs" / "speed", tmp_path / "runs" / "ppl"
    for (backend, seq_len), tps in SPEED.items():
        _write_run(
            speed / f"{backend}-{seq_len}", backend, seq_len, _train_records(tps, seq_len), _ok_result(tps, seq_len)
        )
        if backend == "flash":
            _write_run(
                ppl / f"{backend}-{seq_len}", backend, seq_len, _train_records(tps, seq_len), _ok_result(tps, seq_len)
            )
    _write_run(speed / "naive-1024", "naive", 1024, _train_records(119_000.0, 1024), _ok_result(119_000.0, 1024))
    oom = {"status": "oom", "device": "NVIDIA H100 80GB HBM3", "mem/peak_gib": 70.5, "oom/requested_gib": 6.0}
    _write_run(speed / "naive-2048", "naive", 2048, [{"step": 1, **oom}], oom)
    _write_run(speed / "naive-4096", "naive", 4096, [], None)
    sweep = {"command": ["python", "train.py", "attention=flash", "seq_len=1024"], "started": "2026-11-22T10:00:00"}
    (speed / "flash-1024" / "sweep.json").write_text(json.dumps(sweep))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_bench_json()))
    return {"speed": speed, "ppl": ppl, "bench": bench, "out": tmp_path / "results" / "long_context"}


def _bench_row(provider: str, seq_len: int, dropout: float, fwd_bwd: float | None) -> dict:
    row = bench_attention.Row(provider, seq_len, 64, 12, 16384 // seq_len, dropout)
    if fwd_bwd is None:
        row.status, row.reason = "oom", "CUDA out of memory. Tried to allocate 48.00 GiB"
    else:
        row.tflops, row.peak_extra_gib = {"fwd": fwd_bwd, "bwd": fwd_bwd, "fwd_bwd": fwd_bwd}, 0.2
    return vars(row)


def _bench_json() -> dict:
    rows = [
        _bench_row(provider, t, p, value * t / 1024 if value else None)
        for p in (0.0, 0.1)
        for t in (1024, 2048)
        for provider, value in (("flash", 200.0), ("sdpa_flash", 100.0), ("sdpa_cudnn", 400.0), ("naive", None))
    ]
    check = {
        "passed": True,
        "dtype": "torch.bfloat16",
        "results": [{"name": "c", "passed": True, "rel_err": {"o": 3e-3}}],
    }
    return {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-11-22",
            "command": "python scripts/bench_attention.py", "dtype": "torch.bfloat16", "tokens_per_call": 16384,
            "check": check, "rows": rows}  # fmt: skip


def _build(sweeps: dict[str, Path]) -> str:
    argv = ["--out", str(sweeps["out"]), "--speed", str(sweeps["speed"]), "--ppl", str(sweeps["ppl"])]
    assert report.main([*argv, "--bench", str(sweeps["bench"])]) == 0
    return (sweeps["out"] / "report.md").read_text()


def _table_row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_report_tables_hold_the_runs_numbers(sweeps: dict[str, Path]) -> None:
    text = _build(sweeps)
    # warm-up step 1 (a tenth of the speed) is skipped: the median is the steady-state speed
    assert _table_row(text, "| flash | 1024 | ok |") == (
        "| flash | 1024 | ok | 300,000 | 30.0% | 11.50 | 327,680 | 5.000 | 148.41 |"
    )
    assert "| flash | 300K tok/s, MFU 30.0%, 11.5 GiB | 280K tok/s, MFU 28.0%, 12.5 GiB |" in text
    assert _table_row(text, "| naive | 2048 |").startswith("| naive | 2048 | OOM, asked +6.00 GiB | – | – | 70.50 |")
    assert _table_row(text, "| naive | 4096 |").startswith("| naive | 4096 | incomplete |")
    assert "- flash vs sdpa, training tokens/s: 0.91× at T=1024, 0.97× at T=2048." in text
    assert "- naive: out of memory at T=2048." in text
    assert "- naive: no result at T=4096 (incomplete)." in text
    assert "| flash | 2048 | 6.000 | 5.900 | 5.800 | 5.700 | 5.500 |" in text  # loss by position
    assert "- flash vs sdpa_flash fwd+bwd TFLOP/s, D=64, dropout 0.0: 2.00× at T=1024, 2.00× at T=2048." in text
    assert "- flash vs sdpa_cudnn fwd+bwd TFLOP/s, D=64, dropout 0.1: 0.50× at T=1024, 0.50× at T=2048." in text
    # the benchmark ran on an H100: a column vs the anchors (geometric mean over T of fwd+bwd ratios)
    fa2, cudnn = math.sqrt(200 / 151 * 400 / 194), math.sqrt(200 / 181 * 400 / 311)
    assert (
        f"| 200 / 200 / 200 (0.20 GiB) | 400 / 400 / 400 (0.20 GiB) | {fa2:.2f}× sdpa_flash, {cudnn:.2f}× sdpa_cudnn |"
        in text
    )
    assert "| naive | OOM | OOM |  |" in text
    assert "- training runs: NVIDIA H100 80GB HBM3, 2026-11-22" in text
    assert "python train.py attention=flash seq_len=1024" in text  # from sweep.json
    assert "python train.py experiment=long_context_speed attention=sdpa seq_len=2048" in text  # from overrides


def test_report_writes_valid_pngs(sweeps: dict[str, Path]) -> None:
    _build(sweeps)
    names = ["throughput", "memory", "perplexity", "loss_by_position", "kernels_d64"]
    for name in names:
        png = sweeps["out"] / f"{name}.png"
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n"), name
        assert matplotlib.image.imread(png).shape[0] > 100, name


def test_raw_copy_is_small_and_rebuilds_the_same_report(sweeps: dict[str, Path]) -> None:
    first = _build(sweeps)
    raw = sweeps["out"] / "raw"
    copied = {p.relative_to(raw).as_posix() for p in raw.rglob("*") if p.is_file()}
    assert "speed/flash-1024/sweep.json" in copied and "speed/naive-2048/result.json" in copied
    assert "ppl/flash-2048/metrics.jsonl" in copied and "bench/bench.json" in copied
    assert not any("checkpoints" in p or "wandb" in p for p in copied)
    shutil.rmtree(sweeps["speed"].parent)  # the run dirs are gone: only raw/ is left
    for png in sweeps["out"].glob("*.png"):
        png.unlink()
    (sweeps["out"] / "report.md").unlink()
    assert report.main(["--from-raw", str(sweeps["out"])]) == 0
    assert (sweeps["out"] / "report.md").read_text() == first
    assert (sweeps["out"] / "memory.png").exists()


def _raw_files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (["--speed", "{tmp}/runs/sped"], "--speed {tmp}/runs/sped: no such directory"),
        (["--speed", "{tmp}/empty"], "--speed {tmp}/empty holds no train.py run dir"),
        (["--ppl", "{tmp}/runs/ppl", "--bench", "{tmp}/missing.json"], "{tmp}/missing.json: no such benchmark file"),
        (["--bench", "{tmp}/truncated.json"], "{tmp}/truncated.json is not valid JSON"),
        (["--bench", "{tmp}/runs/speed/flash-1024/result.json"], "is not a scripts/bench_attention.py JSON: it has no"),
    ],
)
def test_a_bad_source_changes_nothing_in_the_report(sweeps: dict[str, Path], source: list, message: str) -> None:
    """Every source is read and checked before raw/ is touched: a typo or a foreign file leaves the report as it was."""
    _build(sweeps)
    tmp = sweeps["speed"].parents[1]
    (tmp / "empty").mkdir()
    (tmp / "truncated.json").write_text('{"device": "NVIDIA H1')
    before = _raw_files(sweeps["out"])
    argv = ["--out", str(sweeps["out"]), *(arg.format(tmp=tmp) for arg in source)]
    with pytest.raises(SystemExit, match=re.escape(message.format(tmp=tmp))):
        report.main(argv)
    assert _raw_files(sweeps["out"]) == before


@pytest.mark.parametrize("contents", ["nothing", "a foreign result.json"])
def test_report_on_a_dir_without_runs_says_what_it_needs(tmp_path: Path, contents: str) -> None:
    if contents == "nothing":
        message = f"{tmp_path / 'raw'} holds no runs (speed/, ppl/) and no benchmark (bench/)"
    else:
        (tmp_path / "raw" / "speed" / "run").mkdir(parents=True)
        (tmp_path / "raw" / "speed" / "run" / "result.json").write_text('{"status": "ok"}')
        message = f"{tmp_path / 'raw' / 'speed' / 'run'}: not a train.py run"
    with pytest.raises(SystemExit, match=re.escape(message)):
        report.main(["--from-raw", str(tmp_path)])


def test_readme_table(sweeps: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    _build(sweeps)
    capsys.readouterr()
    assert report.main(["--from-raw", str(sweeps["out"]), "--readme-table"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("| attention | T=1024 | T=2048 | T=4096 |")
    assert "| naive | 119K tok/s, MFU 11.9%, 11.5 GiB | OOM, asked +6.00 GiB | incomplete |" in printed
    assert "**head dim 64, causal, dropout 0.0**" in printed


def test_anchor_column_is_the_geometric_mean_ratio() -> None:
    anchors = json.loads(ANCHORS.read_text())["kernels"]
    rows = [_bench_row("sdpa_flash", t, 0.0, 2 * anchors["d64_p0.0"]["sdpa_flash"][str(t)][2]) for t in (1024, 4096)]
    rows.append(_bench_row("flash", 1024, 0.0, anchors["d64_p0.0"]["sdpa_cudnn"]["1024"][2]))
    table = markdown_tables(rows, anchors)
    assert table.splitlines()[2].endswith("| fwd+bwd vs H100 anchors |")
    assert _table_row(table, "| sdpa_flash |").endswith("| 2.00× sdpa_flash |")
    assert _table_row(table, "| flash |").endswith(f"| {181 / 151:.2f}× sdpa_flash, 1.00× sdpa_cudnn |")


def _fake_kernel(scale_dropout: bool):
    """An exact attention with torch's dropout; `scale_dropout=False` forgets the 1/(1-p) rescaling."""

    def kernel(q, k, v, *, causal=True, dropout_p=0.0, return_lse=False, deterministic=False):
        o, lse = reference_attention(q, k, v, causal=causal, dtype=torch.float32)
        if dropout_p > 0:
            keep = torch.rand(*q.shape[:-1], q.shape[-2]) >= dropout_p
            scale = 1 / (1 - dropout_p) if scale_dropout else 1.0
            o, _ = reference_attention(q, k, v, causal=causal, keep=keep, keep_scale=scale, dtype=torch.float32)
        return (o, lse) if return_lse else o

    return kernel


@pytest.mark.parametrize("scale_dropout", [True, False])
def test_check_catches_a_wrong_dropout(monkeypatch: pytest.MonkeyPatch, scale_dropout: bool) -> None:
    monkeypatch.setattr(bench_attention, "_flash_kernel", lambda: _fake_kernel(scale_dropout))
    profile = bench_attention.cpu_profile()
    result = bench_attention.run_checks(profile)
    assert result["passed"] is scale_dropout
    assert all(r["passed"] for r in result["results"] if not r["name"].startswith("dropout"))


def _run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/bench_attention.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_bench_records_unsupported_providers_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = _run_bench("--no-check", "--provider", "naive,sdpa_cudnn", "--seq-lens", "64", "--head-dims", "64",
                      "--dropout", "0.1", "--backward-thread", "caller", "--out", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["command"].startswith("python scripts/bench_attention.py --no-check") and data["complete"]
    assert data["backward_thread"] == "caller"
    naive, cudnn = data["rows"]
    assert naive["status"] == "ok" and naive["tflops"]["fwd_bwd"] > 0 and naive["batch"] == 4
    assert naive["host_ms"] > 0  # on the CPU every call is host-bound: the smoke path only exercises it
    assert cudnn["status"] == "skipped" and cudnn["reason"] and cudnn["host_ms"] is None
    assert "| naive |" in done.stdout and "| sdpa_cudnn | unsupported |" in done.stdout


def test_bench_check_only_cpu_smoke(tmp_path: Path) -> None:
    """The real kernel through Triton's interpreter at tiny fp32 shapes: accuracy, dropout and determinism checks
    pass."""
    out = tmp_path / "check.json"
    done = _run_bench("--check-only", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    check = json.loads(out.read_text())["check"]
    assert check["passed"] and check["dtype"] == "torch.float32"
    assert len(check["results"]) == 8
    assert any(r["name"] == "causal B=1 H=2 T=96 Tq=40 D=64" for r in check["results"])  # queries fewer than keys
    repeats = [r for r in check["results"] if r["name"].startswith("deterministic")]
    assert [r["name"] for r in repeats] == [
        f"deterministic, dropout {p}, causal B=1 H=2 T=80 D=64: repeated"
        for p in (0.0, bench_attention.CHECK_DROPOUT_P)
    ]
    assert all(r["repeat_equal"] and r["torch_flag_equal"] for r in repeats)
    for result in check["results"]:  # fp32 in the interpreter is exact up to rounding (and 16-bit dropout thresholds)
        assert all(err < 1e-4 for err in result.get("rel_err", {}).values()), result


@pytest.mark.parametrize("reproducible", [True, False])
def test_determinism_check_compares_repeated_gradients(monkeypatch: pytest.MonkeyPatch, reproducible: bool) -> None:
    """Two calls with deterministic=True and one with deterministic=None under torch's deterministic mode, which is
    switched back off afterwards; a backward whose gradients change from call to call fails the check."""
    seen = []

    def attend(q, k, v, causal, dropout_p, deterministic):
        seen.append((deterministic, torch.are_deterministic_algorithms_enabled()))
        scale = 1.0 if reproducible else 1.0 + len(seen) / 8  # each call's gradients differ
        return q * scale + k + v

    monkeypatch.setattr(bench_attention, "_flash_kernel", lambda: attend)
    case = bench_attention.CheckCase(1, 2, 16, 16, causal=True)
    result = bench_attention.check_deterministic_repeats(case, bench_attention.cpu_profile(), 0.0)
    assert seen == [(True, False), (True, False), (None, True)]
    assert not torch.are_deterministic_algorithms_enabled()
    assert result == {"repeat_equal": reproducible, "torch_flag_equal": reproducible, "passed": reproducible}


def _sweep(out: Path, *options: str) -> subprocess.CompletedProcess:
    grid = ["--attention", "sdpa,bogus", "--seq-lens", "64", "--out", str(out)]
    tiny = ["model=gpt2-tiny", "data=shakespeare", "device=cpu", "train.tokens_per_step=256", "train.max_steps=2"]
    command = [sys.executable, "scripts/sweep.py", "long_context_speed", *grid, *options, *tiny, "wandb.mode=disabled"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_sweep_refuses_an_unknown_preset_before_any_run(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        sweep.parse_args(["long_context_sped"])
    assert (
        "preset 'long_context_sped': no configs/experiment/long_context_sped.yaml; choose one of"
        in capsys.readouterr().err
    )


def test_sweep_resumes_records_crashes_and_feeds_the_report(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    first = _sweep(out, "--budget-min", "0.001")  # the budget ends after the first run
    assert first.returncode == 2 and "stopping with 1 runs to go" in first.stdout, first.stdout + first.stderr
    ok = json.loads((out / "sdpa-64" / "result.json").read_text())
    assert ok["status"] == "ok" and ok["step"] == 2 and ok["tokens_per_step"] == 256
    assert "train.tokens_per_step=256" in json.loads((out / "sdpa-64" / "sweep.json").read_text())["command"]
    second = _sweep(out)
    assert second.returncode == 0 and "1 of 2 runs done" in second.stdout, second.stdout + second.stderr
    crashed = json.loads((out / "bogus-64" / "result.json").read_text())
    assert crashed["status"] == "crashed" and crashed["returncode"] == 1
    assert "Could not find 'attention/bogus'" in crashed["message"]
    assert "2 of 2 runs done, 0 to go" in _sweep(out).stdout
    assert report.main(["--out", str(tmp_path / "report"), "--speed", str(out)]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| sdpa | 64 | ok |" in text and "| bogus | 64 | crashed |" in text
    assert "- sweep: `python scripts/sweep.py long_context_speed --attention sdpa,bogus" in text


@pytest.mark.parametrize(
    ("preset", "eval_windows_tokens"), [("long_context_speed", 2 * 32768), ("long_context_ppl", 8 * 32768)]
)
def test_presets_compose_at_every_swept_length(preset: str, eval_windows_tokens: int) -> None:
    """What scripts/sweep.py passes composes and validates at every length: one micro-step per optimizer step,
    GPT-2 124M on long_prose, and every model scored on the same number of held-out tokens."""
    args = sweep.parse_args([preset])
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        for seq_len in args.seq_lens:
            overrides = sweep.train_command(args, "flash", seq_len, Path("unused"))[2:-1]  # no program, no run dir
            config = typed_config(compose("config", overrides=overrides))
            validate(config)
            assert (config.model.name, config.data.name, config.seq_len) == ("gpt2", "long_prose", seq_len)
            assert grad_accum_steps(config.train, seq_len, data_ranks=1) == 1
            assert config.eval.steps * config.eval.batch_size * seq_len == eval_windows_tokens
            assert config.eval.span_len == 16384 and config.checkpoint.every == 0


def _tarball(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("tarball", ["a study named by a path", "a truncated tarball", "no plan.json"])
def test_study_import_touches_nothing_but_results_of_a_sound_export(tmp_path: Path, tarball: str) -> None:
    victim = tmp_path / "victim"
    (victim / "raw").mkdir(parents=True)
    (victim / "raw" / "keep.txt").write_text("the user's file")
    escape = os.path.relpath(victim, ROOT / "results")  # results/<study> would be the victim
    plan = json.dumps({"study": escape, "nodes": {}}).encode()
    path = tmp_path / "t.tar.gz"
    if tarball == "a study named by a path":
        message = "which is not a study name"
        _tarball(path, {"plan.json": plan})
    elif tarball == "a truncated tarball":
        message = "is not a `study.py export` tarball"
        path.write_bytes(_tarball(tmp_path / "whole.tar.gz", {"plan.json": plan}).read_bytes()[:40])
    else:
        message = "with a readable plan.json"
        _tarball(path, {"spec.yaml": b"name: x"})
    with pytest.raises(SystemExit, match=re.escape(message)):
        study.main(["import", str(path)])
    if tarball == "a truncated tarball":  # --results names the place: the archive is still read before replacing
        with pytest.raises(SystemExit, match=re.escape(f"{path} cannot be unpacked")):
            study.main(["import", str(path), "--results", str(victim)])
    assert (victim / "raw" / "keep.txt").read_text() == "the user's file"


@pytest.mark.parametrize(
    ("plan", "message"),
    [('{"study": "cont', "plan.json is not valid JSON"), ('{"study": "context"}', "plan.json has no nodes")],
)
def test_study_report_names_a_truncated_or_foreign_plan(tmp_path: Path, plan: str, message: str) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "plan.json").write_text(plan)
    with pytest.raises(SystemExit, match=re.escape(f"study_report.py: {tmp_path / 'raw'}/{message}")):
        study_report.main([str(tmp_path)])


@pytest.mark.parametrize("masks", ["documents", "blocks", "window"])
def test_ab_kernels_schedules_each_version_s_masks_as_its_flash_mask_does(tmp_path, masks):
    """scripts/ab_kernels.py --masks builds, for the baseline copy of kernels/ and for the working tree alike, the
    FlashMask that version's flash_mask would build (its own class, tilings and schedule), so that an A/B under masks
    times what flash_attention launches."""
    import ab_kernels

    from flashgpt.kernel_copies import load_launch
    from flashgpt.kernels import flash_mask

    seq_len = 256
    blocks = torch.rand(1, 4, 4, generator=torch.Generator().manual_seed(0)) < 0.5
    kwargs = {
        "documents": {"document_ids": torch.arange(seq_len).repeat(2, 1) * 5 // seq_len},
        "blocks": {"block_mask": blocks, "block_size": 64},
        "window": {"window_size": 100},
    }[masks]
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    baseline = load_launch(tmp_path / "kernels", "ab_test_baseline")
    q = torch.randn(2, 12, seq_len, 64)
    expected = flash_mask(seq_len, seq_len, head_dim=64, dtype=q.dtype, **kwargs)
    for launch, package in ((baseline, "ab_test_baseline"), (ab_kernels.current_launch, "flashgpt.kernels")):
        mask = ab_kernels.build_masks(launch, kwargs, q, launch.AttentionParams(True, 0.0, 0.125))
        assert type(mask).__module__ == f"{package}.tile_schedule"
        assert mask.tiles == expected.tiles and mask.window_size == expected.window_size
        assert (mask.schedule is None) == (expected.schedule is None)
        if expected.schedule is not None:
            assert torch.equal(mask.schedule, expected.schedule)
    assert ab_kernels.build_masks(baseline, {}, q, baseline.AttentionParams(True, 0.0, 0.125)) is baseline.NO_MASKS


def test_tables_mark_the_rows_that_measured_the_host() -> None:
    """A row whose fwd+bwd took the CPU ≥ 90% of its kernels' GPU time to issue is marked †, however long the timed
    call read, with the note under its table; rows without both times (JSON from before they were recorded) and
    failed rows never are."""
    seq_lens = (1024, 2048, 4096, 8192, 16384)
    rows = [_bench_row("flash", t, 0.0, 300.0) for t in seq_lens] + [_bench_row("naive", 1024, 0.0, None)]
    times = ((0.95, 1.0), (0.5, 1.0), (None, 1.0), (0.95, None), (0.6, 0.65), (2.0, 1.0))  # host, GPU
    for row, (host_ms, gpu_ms) in zip(rows, times, strict=True):
        row["fwd_bwd_ms"], row["host_ms"], row["gpu_ms"] = 1.0, host_ms, gpu_ms
    table = markdown_tables(rows)
    cells = _table_row(table, "| flash |").strip("| ").split(" | ")[1:]
    assert [cell.endswith(" †") for cell in cells] == [True, False, False, False, True]
    assert _table_row(table, "| naive |") == "| naive | OOM |  |  |  |  |"
    assert table.count(HOST_BOUND_NOTE) == 1
    assert HOST_BOUND_NOTE not in markdown_tables([rows[1], rows[2], rows[3], rows[5]])


def test_mask_table_marks_the_host_and_gives_the_kernels_ratio() -> None:
    """bench_masks' table: x dense reads "measured (from the GPU times)", and a time whose host needed ≥ 90% of its
    GPU time is marked †, with the note under the table."""
    import bench_masks  # imported here, after the kernels (as tests/test_kernel_masks.py does)

    def row(mask: str, provider: str, dropout: float, density: float, ms: float, host: float, gpu: float):
        pairs = round(density * 1_000_000)
        r = bench_masks.Row(mask, provider, 4096, 4, dropout, density, pairs, fwd_ms=ms / 3, fwd_bwd_ms=ms)
        r.host_ms, r.gpu_ms = host, gpu
        r.tflops = {"fwd": 1.0, "fwd_bwd": pairs / ms}
        return r

    rows = [
        row("dense", "flash", 0.0, 1.0, 1.0, 0.4, 1.0),
        row("dense", "flex", 0.0, 1.0, 1.5, 0.6, 1.5),
        row("dense", "flash", 0.1, 1.0, 1.2, 0.4, 1.2),
        row("documents", "flash", 0.0, 0.2, 0.5, 0.45, 0.25),  # host-bound: 0.45 ≥ 0.9 × 0.25
        row("documents", "flex", 0.0, 0.2, 0.75, 0.5, 0.7),
        row("documents", "flash", 0.1, 0.2, 0.4, 0.2, 0.4),
    ]
    bench_masks.add_ratios(rows)
    documents = rows[3]
    assert documents.x_flex == pytest.approx(1.5) and documents.x_dense == pytest.approx(0.4)
    assert documents.x_dense_gpu == pytest.approx(0.8)  # 0.2 of the pairs in 0.25 of the dense kernels' GPU time
    table = bench_masks.markdown_table([vars(r) for r in rows])
    lines = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| 4096 |")}
    assert lines["dense"] == (
        "| 4096 | dense | 1.000 | 1.00 | 0.40 / 1.00 | 1.50 | 1000000 | 666667 | 1.50 | 1.00 (1.00) | 1.20 | 833333 "
        "| 1.00 (1.00) |"
    )
    assert lines["documents"] == (
        "| 4096 | documents | 0.200 | 0.50 † | 0.45 / 0.25 | 0.75 | 400000 | 266667 | 1.50 | 0.40 (0.80) | 0.40 "
        "| 500000 | 0.60 (0.60) |"
    )
    assert table.endswith("\n\n" + HOST_BOUND_NOTE)
    assert HOST_BOUND_NOTE not in bench_masks.markdown_table([vars(r) for r in rows[:3]])


def test_host_time_per_call_runs_the_step_warmup_and_calls_times() -> None:
    calls = []
    ms = host_ms_per_call(lambda: calls.append(1), calls=5, warmup=1)
    assert len(calls) == 6 and ms >= 0


@pytest.mark.parametrize("thread", ["device", "caller"])
def test_bench_times_the_backward_on_the_thread_asked_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, thread: str
) -> None:
    seen = []

    def naive(q, k, v, p):
        seen.append(torch.autograd.is_multithreading_enabled())
        return bench_attention.naive(q, k, v, p)

    monkeypatch.setitem(bench_attention.PROVIDERS, "naive", naive)
    argv = ["--no-check", "--provider", "naive", "--seq-lens", "64", "--head-dims", "64", "--dropout", "0",
            "--host-calls", "0", "--backward-thread", thread, "--out", str(tmp_path / "bench.json")]  # fmt: skip
    assert bench_attention.main(argv) == 0
    assert seen and set(seen) == {thread == "device"}
    assert torch.autograd.is_multithreading_enabled()  # restored


@pytest.mark.parametrize("mask", ["dense", "window_1k", "documents", "butterfly"])
def test_mask_walks_are_the_kept_tiles_of_each_query_and_key_block(mask: str) -> None:
    """bench_mask_walks' walks: a tile is kept where any pair in it is visible (from `dense_mask` in full), and a
    query (key) block's walk is its row (column) of kept tiles, over every (b, h)."""
    import bench_mask_walks
    import bench_masks

    from flashgpt.attention_masks import dense_mask

    profile = bench_masks.Profile("cpu", torch.float32, block_size=32, check_seq_len=160, dropout_check_seq_len=96)
    seq_len, batch, heads, block = 256, 2, bench_masks.HEADS, 32
    case = bench_masks.build_case(mask, seq_len, batch, profile)
    occupancy = bench_mask_walks.block_occupancy(case, seq_len, block, "cpu")
    visible = dense_mask(seq_len, seq_len, causal=True, **case.flash_kwargs)
    want = visible.unflatten(-2, (-1, block)).unflatten(-1, (-1, block)).any(-1).any(-2)
    assert torch.equal(occupancy, want)
    query, key = bench_mask_walks.walk_lengths(occupancy, batch, heads)
    full = occupancy.expand(batch, heads, -1, -1)
    assert sorted(query.tolist()) == sorted(n for n in full.sum(-1).flatten().tolist() if n)
    assert sorted(key.tolist()) == sorted(n for n in full.sum(-2).flatten().tolist() if n)
    assert query.sum() == key.sum() == full.sum()  # both count every kept tile once
    if mask == "dense":  # causal: walks of 1 … 8 tiles, one of each per (b, h)
        assert sorted(query.tolist()) == sorted(list(range(1, 9)) * batch * heads)


def test_mask_walk_ceiling_prices_each_walk_at_its_length() -> None:
    """Per-tile cost: the measured value at a measured length, a power law between two (linear in log-log), flat
    past either end; a pass's ceiling sums n · cost(n) over its walks (the forward's query walks, the backward's key
    walks)."""
    import bench_mask_walks

    measured = {1: 8.0, 4: 2.0, 16: 1.0}
    cost = bench_mask_walks.per_tile_cost(torch.tensor([1, 2, 4, 8, 16, 64]), measured)
    assert cost.tolist() == pytest.approx([8.0, 4.0, 2.0, 2**0.5, 1.0, 1.0])
    assert bench_mask_walks.ceiling_ms(torch.tensor([1, 4]), measured) == pytest.approx(1 * 8 + 4 * 2)
    assert bench_mask_walks.ceiling_ms(torch.tensor([16, 16]), {1: 3.0, 16: 0.5}) == pytest.approx(2 * 16 * 0.5)
