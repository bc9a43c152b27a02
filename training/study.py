"""Run a context study (configs/study/<name>.yaml) in pieces, evaluate its models, and ship its data and results.

    python scripts/study.py pack-data context            # CPU machine: tokenize, write .cache/ship/<shards>.tar.xz
    python scripts/study.py run context --budget-min 9 --export $OUT/context-raw.tar.gz   # GPU; repeat until done
    python scripts/study.py import context-raw.tar.gz     # CPU machine: into results/context/raw/
    python scripts/study.py import rope-raw.tar.gz --merge   # ... keeping raw/'s runs that the tarball lacks
    python scripts/study_report.py results/context        # report.md and plots from raw/, no GPU
    python scripts/study.py eval runs/context/seed0/1024 --study context   # the evaluations alone, on any run

`run` trains every recipe's runs (training/study_plan.py says which), one train.py process per job, into
runs/<study>/<run>, then scores each recipe's final model with `eval` into runs/<study>/evals/. It stops before
--budget-min minutes are up (a training job past the budget is stopped and continues from its last checkpoint next
time; an evaluation is not started unless it fits) and says "study complete" when nothing is left. Everything it
does is decided by the files in runs/<study>, so running the same command again continues. `--recipes` and
`--seeds` restrict it to some models: their shared runs are trained once for all, and every branch point of the
whole study is kept, so that the other recipes can follow later. A job that fails (a crash, out of memory, a NaN)
is recorded in its run dir's study.json and its dependents are skipped; delete the run dir to try again.

The GPU machine has no network: `pack-data` compresses the study's token shards (about 6x for code) into
.cache/ship/, which `run` and `eval` unpack when the shards are missing.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import re
import shutil
import sys
import tarfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from flashgpt.data import DataConfig, load_splits
from flashgpt.data.shards import prepare_shards, read_doc_ids, shard_dir
from flashgpt.training.config import register_configs, typed_config
from flashgpt.training.context_eval import (
    PROBES,
    long_documents,
    passkey_scores,
    passkey_trials,
    position_bins,
    summarize_losses,
    token_losses,
)
from flashgpt.training.distributed import resolve_device
from flashgpt.training.jobs import STOP_GRACE_S, failure_line, run_job
from flashgpt.training.saved_model import model_from_checkpoint
from flashgpt.training.study_plan import (
    STUDY_DIR,
    Node,
    Plan,
    Spec,
    current_plan,
    load_spec,
    reached_step,
    read_json,
)

ROOT = Path(__file__).resolve().parents[1]  # the checkout: a study runs train.py and writes runs/ and results/ there
SHIP_DIR = ROOT / ".cache" / "ship"
STUDY_LOG = "study.log"  # stdout and stderr of every job of a run dir
STUDY_STATE = "study.json"  # every job of a run dir: command, wall time, exit code; or why the run failed
RAW_FILES = {  # in a run dir -> in the exported raw/ folder: small files only
    ".hydra/config.yaml": "config.yaml",
    ".hydra/overrides.yaml": "overrides.yaml",
    "metrics.jsonl": "metrics.jsonl",
    "result.json": "result.json",
    STUDY_STATE: STUDY_STATE,
}
Selection = set[tuple[str, int]]  # (recipe, seed) of the models to train
FIRST_EVAL_ESTIMATE_S = 120.0  # an evaluation starts only if this (later: the longest one so far) is left


# --- the state of a study's runs -----------------------------------------------------------------------------


def branch_path(runs_dir: Path, node: Node, step: int) -> Path:
    """The copy of a run's checkpoint at a step where another run branches off."""
    return runs_dir / node.name / "checkpoints" / f"branch-{step}.pt"


def failure(runs_dir: Path, node: Node) -> str | None:
    """Why the run failed, if it did: its own failure, or its parent's."""
    if node.parent is not None and (parent := failure(runs_dir, node.parent)):
        return f"parent {node.parent.name} failed: {parent}"
    return read_json(runs_dir / node.name / STUDY_STATE).get("failed")


def eval_path(runs_dir: Path, node: Node) -> Path:
    return runs_dir / "evals" / f"{node.name}.json"


# --- jobs ----------------------------------------------------------------------------------------------------


def shown(path: Path) -> str:
    """A path as commands show it: relative to the repository root (where they run) when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def train_command(spec: Spec, runs_dir: Path, node: Node, stop_step: int) -> list[str]:
    command = [
        "python",
        "train.py",
        f"experiment={spec.preset}",
        f"seq_len={node.seq_len}",
        f"seed={node.seed}",
        f"train.max_steps={node.max_steps}",
        f"train.stop_at_step={stop_step}",
        f"checkpoint.every={spec.checkpoint_every}",
        "resume=auto",
    ]
    if node.parent is not None:
        command.append(f"extend_from={shown(branch_path(runs_dir, node.parent, node.branch_step))}")
    return [*command, *spec.overrides, *node.overrides, f"hydra.run.dir={shown(runs_dir / node.name)}"]


def eval_command(spec: Spec, runs_dir: Path, node: Node) -> list[str]:
    run_dir, out = shown(runs_dir / node.name), shown(eval_path(runs_dir, node))
    return ["python", "scripts/study.py", "eval", run_dir, "--study", spec.name, "--out", out]


def record_job(run_dir: Path, command: list[str], returncode: int, stopped: bool, wall_s: float, **extra: Any) -> None:
    state = read_json(run_dir / STUDY_STATE) or {"jobs": []}
    state["jobs"].append(
        {
            "command": command,
            "returncode": returncode,
            "stopped_for_budget": stopped,
            "wall_s": round(wall_s, 1),
            "finished": datetime.datetime.now().isoformat(timespec="seconds"),
            **extra,
        }
    )
    (run_dir / STUDY_STATE).write_text(json.dumps(state, indent=1) + "\n")


def mark_failed(run_dir: Path, why: str, key: str = "failed") -> None:
    """Record why the run's training ("failed": its dependents are skipped) or evaluation ("eval_failed") failed."""
    state = read_json(run_dir / STUDY_STATE) or {"jobs": []}
    state[key] = why
    (run_dir / STUDY_STATE).write_text(json.dumps(state, indent=1) + "\n")


def wanted(plan: Plan, selection: Selection) -> tuple[list[Node], list[Node]]:
    """The final runs of the selected models, and every run they need (theirs and their ancestors), in plan order."""
    finals = list(dict.fromkeys(node for key, node in plan.finals.items() if key in selection))
    needed = set()
    for node in finals:
        while node is not None:
            needed.add(node.name)
            node = node.parent
    return finals, [node for node in plan.nodes.values() if node.name in needed]


def stop_steps(finals: list[Node], needed: list[Node]) -> dict[str, int]:
    """How far each needed run must train: a selected model to its last step, an ancestor only to the furthest
    step a needed run branches off it (a later selection continues it from there)."""
    stops = {node.name: node.max_steps or 0 for node in finals}
    for node in needed:
        if node.parent is not None:
            name = node.parent.name
            stops[name] = max(stops.get(name, 0), node.branch_step)
    return stops


def next_job(plan: Plan, runs_dir: Path, selection: Selection) -> tuple[str, Node, int] | None:
    """("eval", run, step) for a finished selected model not evaluated yet, else ("train", run, stop step) for the
    next job whose inputs exist, else None. A needed run trains only as far as `stop_steps` says. Copies a run's
    checkpoint at a branch step when it stands there: every branch step of the whole study up to that stop,
    selected or not, so that a recipe run later finds its branch point."""
    finals, needed = wanted(plan, selection)
    stops = stop_steps(finals, needed)
    for node in finals:
        trained = node.max_steps and reached_step(runs_dir, node) >= node.max_steps
        eval_failed = read_json(runs_dir / node.name / STUDY_STATE).get("eval_failed")
        if trained and not eval_failed and not eval_path(runs_dir, node).is_file():
            return "eval", node, node.max_steps
    for node in needed:
        if node.max_steps is None or failure(runs_dir, node):
            continue
        if node.parent is not None and not branch_path(runs_dir, node.parent, node.branch_step).is_file():
            continue  # the parent has not reached the branch point yet
        step = reached_step(runs_dir, node)
        for target in node.segments():
            if target > stops[node.name]:
                break
            if step < target:
                return "train", node, target
            if target < node.max_steps and not branch_path(runs_dir, node, target).is_file():
                if step > target:
                    raise RuntimeError(
                        f"{runs_dir / node.name} went past step {target} without keeping its checkpoint there, "
                        f"where another run branches off; delete {runs_dir / node.name} to train it again"
                    )
                shutil.copyfile(runs_dir / node.name / "checkpoints" / "latest.pt", branch_path(runs_dir, node, target))
    return None


def select(spec: Spec, recipes: list[str] | None, seeds: list[int] | None) -> Selection:
    """The (recipe, seed) models to train and evaluate: these recipes (default all) with the recipes their
    equal-time runs are measured against, for these seeds (default all)."""
    recipes, seeds = recipes or list(spec.recipes), seeds or list(spec.seeds)
    if unknown := [r for r in recipes if r not in spec.recipes]:
        raise ValueError(f"--recipes {unknown}: not recipes of {spec.name} ({', '.join(spec.recipes)})")
    if unknown := [s for s in seeds if s not in spec.seeds]:
        raise ValueError(f"--seeds {unknown}: not seeds of {spec.name} {list(spec.seeds)}")
    recipes = set(recipes) | {spec.recipes[r].equal_time_to for r in recipes} - {None}
    return {(recipe, seed) for recipe in recipes for seed in seeds}


def run_study(spec: Spec, runs_dir: Path, budget_s: float | None, selection: Selection) -> int:
    """Run the selected models' jobs until none is left (returns 0; 1 if some failed) or the budget would be
    passed (returns 2)."""
    clock = time.monotonic()
    deadline = clock + budget_s if budget_s else float("inf")
    ensure_data(spec)
    longest_eval = max((read_json(p).get("wall_s", 0.0) for p in runs_dir.glob("evals/**/*.json")), default=0.0)
    while job := next_job(current_plan(spec, runs_dir), runs_dir, selection):
        kind, node, step = job
        run_dir = runs_dir / node.name
        left = deadline - time.monotonic()
        if kind == "eval":
            if left < (longest_eval or FIRST_EVAL_ESTIMATE_S):
                print(f"budget: {left:.0f} s left, too little to evaluate {node.name}; run the same command again")
                return 2
            command = eval_command(spec, runs_dir, node)
            returncode, stopped, wall_s = run_job(command, run_dir / STUDY_LOG, ROOT, deadline)
            longest_eval = max(longest_eval, wall_s)
            if returncode == 0:
                print(f"{node.name}: evaluated in {wall_s:.0f} s -> {shown(eval_path(runs_dir, node))}")
            elif not stopped:
                mark_failed(run_dir, f"exit {returncode}: {failure_line(run_dir / STUDY_LOG)}", key="eval_failed")
                print(f"{node.name}: evaluation FAILED ({returncode}), see {run_dir / STUDY_LOG}")
        else:
            if left < STOP_GRACE_S * 3:
                print(f"budget: {left:.0f} s left; run the same command again")
                return 2
            command = train_command(spec, runs_dir, node, step)
            returncode, stopped, wall_s = run_job(command, run_dir / STUDY_LOG, ROOT, deadline)
            reached = reached_step(runs_dir, node)
            record_job(run_dir, command, returncode, stopped, wall_s, reached_step=reached)
            result = read_json(run_dir / "result.json")
            if not stopped and (returncode != 0 or result.get("status") != "ok"):
                why = (
                    result.get("message")
                    if result.get("status") not in (None, "ok")
                    else failure_line(run_dir / STUDY_LOG)
                )
                mark_failed(run_dir, f"{result.get('status', 'crashed')} (exit {returncode}): {why}")
                print(f"{node.name}: FAILED to reach step {step}: {why}")
            else:
                print(
                    f"{node.name}: step {reached} of {node.max_steps} after {wall_s:.0f} s"
                    + (" (stopped for the budget)" if stopped else ""),
                    flush=True,
                )
        if stopped:
            print("budget: stopped a job; run the same command again")
            return 2
    finals, needed = wanted(current_plan(spec, runs_dir), selection)
    failed = [node.name for node in needed if failure(runs_dir, node)]
    failed += [node.name for node in finals if read_json(runs_dir / node.name / STUDY_STATE).get("eval_failed")]
    failed += [f"{node.name} (its reference recipe did not train)" for node in finals if node.max_steps is None]
    if failed:
        print(f"study finished with failures in {', '.join(failed)} (see their study.json); delete a run dir to retry")
        return 1
    print(f"study complete: {spec.name} in {shown(runs_dir)}")
    return 0


def print_status(spec: Spec, runs_dir: Path) -> None:
    plan = current_plan(spec, runs_dir)
    for node in plan.nodes.values():
        steps = "?" if node.max_steps is None else node.max_steps
        why = failure(runs_dir, node)
        state = f"FAILED: {why}" if why else f"step {reached_step(runs_dir, node)} of {steps}"
        print(f"  {node.name:40s} seq_len {node.seq_len:>6}  {state}")
    for (recipe, seed), node in plan.finals.items():
        done = "evaluated" if eval_path(runs_dir, node).is_file() else "not evaluated"
        print(f"  recipe {recipe} seed {seed}: {node.name}, {done}")


# --- evaluation ----------------------------------------------------------------------------------------------


def evaluate(run_dir: Path, spec: Spec, attention: str | None, device_name: str) -> dict[str, Any]:
    """Every evaluation of training/context_eval.py on the run's latest checkpoint, as one JSON-able dict."""
    started = time.monotonic()
    device = resolve_device(device_name)
    model, config, step = model_from_checkpoint(run_dir / "checkpoints" / "latest.pt", device, attention or None)
    splits = load_splits(config.data, prepare_if_missing=False)
    doc_ids = read_doc_ids(Path(splits.meta["shard_dir"]))["val"]
    settings = spec.eval
    docs = long_documents(splits.val, splits.val_docs, doc_ids, settings.length, settings.max_docs)
    bins = position_bins(settings.length, settings.first_bin)
    full = min(config.seq_len, settings.length)
    contexts = sorted({c for c in settings.contexts if c <= full} | {full})
    by_context = {}
    for context in contexts:
        clock = time.monotonic()
        stride = max(1, context // settings.stride_divisor)
        losses = token_losses(model, docs, context, stride, device, settings.batch_tokens)
        by_context[str(context)] = {
            **summarize_losses(losses, bins),
            "stride": stride,
            "seconds": round(time.monotonic() - clock, 2),
        }
    # Read as a fixed-context model reads a long document at no extra cost: consecutive windows of its own context,
    # each target seeing 0 to full - 1 tokens of history (sliding windows above give every target >= 3/4 of it).
    # A context as long as the documents reads each in one window, as the sliding reading at `full` already did.
    if full == settings.length:
        consecutive_summary = {key: by_context[str(full)][key] for key in ("loss", "bins", "per_doc", "per_doc_bins")}
    else:
        clock = time.monotonic()
        consecutive = token_losses(model, docs, full, full, device, settings.batch_tokens)
        consecutive_summary = {**summarize_losses(consecutive, bins), "seconds": round(time.monotonic() - clock, 2)}
    passkey = {}
    for name, probe in PROBES.items():
        trials = passkey_trials(
            docs, list(settings.passkey_distances), settings.passkey_trials, settings.passkey_seed, probe
        )
        scores = passkey_scores(model, trials, config.seq_len, device, settings.batch_tokens)
        passkey[name] = {str(distance): score for distance, score in scores.items()}
    return {
        "run": shown(run_dir),
        "step": step,
        "seq_len": config.seq_len,
        "model": config.model.name,
        "attention": config.attention.name,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "eval": asdict(settings),
        "doc_ids": docs.doc_ids,
        "full_context": full,
        "contexts": by_context,
        "consecutive": consecutive_summary,
        "passkey": passkey["prose"],
        **{f"passkey_{name}": scores for name, scores in passkey.items() if name != "prose"},
        "wall_s": round(time.monotonic() - started, 1),
    }


# --- data and results shipping -------------------------------------------------------------------------------


def study_data(spec: Spec) -> DataConfig:
    """The data config of the study's runs, composed as train.py composes it."""
    register_configs()
    overrides = [f"experiment={spec.preset}", *(o for o in spec.overrides if o.startswith("data"))]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return typed_config(compose(config_name="config", overrides=overrides)).data


def ensure_data(spec: Spec) -> None:
    """Unpack the study's shards from .cache/ship/ when they are missing and a pack is there."""
    directory = ROOT / shard_dir(study_data(spec))
    pack = SHIP_DIR / f"{directory.name}.tar.xz"
    if not (directory / "meta.json").is_file() and pack.is_file():
        directory.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(pack) as archive:
            archive.extractall(directory.parent, filter="data")
        print(f"unpacked {shown(pack)} into {shown(directory)}")


def pack_data(spec: Spec) -> Path:
    """Tokenize the study's corpus if needed and write its shard folder to .cache/ship/<folder>.tar.xz."""
    directory = ROOT / prepare_shards(study_data(spec))
    SHIP_DIR.mkdir(parents=True, exist_ok=True)
    pack = SHIP_DIR / f"{directory.name}.tar.xz"
    partial = pack.with_name(pack.name + ".partial")
    with tarfile.open(partial, "w:xz") as archive:
        archive.add(directory, arcname=directory.name)
    partial.replace(pack)
    return pack


def export_results(spec: Spec, runs_dir: Path, dest: Path) -> int:
    """A .tar.gz of the study's small raw files: the spec, the plan, each run's config/metrics/result/jobs, and
    the evaluations. Returns the number of run dirs in it."""
    plan = current_plan(spec, runs_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    n_runs = 0
    with tarfile.open(partial, "w:gz") as archive:
        archive.add(STUDY_DIR / f"{spec.name}.yaml", arcname="spec.yaml")
        plan_json = json.dumps(plan_summary(plan, runs_dir), indent=1).encode()
        _add_bytes(archive, "plan.json", plan_json)
        for node in plan.nodes.values():
            for source, name in RAW_FILES.items():
                path = runs_dir / node.name / source
                if path.is_file():
                    archive.add(path, arcname=f"runs/{node.name}/{name}")
            n_runs += (runs_dir / node.name).is_dir()
        for path in sorted(runs_dir.glob("evals/**/*.json")):
            archive.add(path, arcname=str(path.relative_to(runs_dir)))
    partial.replace(dest)
    return n_runs


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    archive.addfile(info, io.BytesIO(data))


def plan_summary(plan: Plan, runs_dir: Path) -> dict[str, Any]:
    """What the report needs to know about the runs besides their files: each run's place in the recipes."""
    return {
        "study": plan.spec.name,
        "nodes": {
            node.name: {
                "seed": node.seed,
                "seq_len": node.seq_len,
                "max_steps": node.max_steps,
                "parent": node.parent.name if node.parent else None,
                "branch_step": node.branch_step,
                "overrides": list(node.overrides),
                "segments": node.segments(),
                "reached_step": reached_step(runs_dir, node),
                "failed": failure(runs_dir, node),
            }
            for node in plan.nodes.values()
        },
        "finals": [{"recipe": r, "seed": s, "node": n.name} for (r, s), n in plan.finals.items()],
    }


# A study's name becomes a path (results/<study>): a plain file name, never a path or "..".
STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def exported_study(tarball: Path) -> str:
    """The study named in an exported tarball's plan.json, checked to be a plain name."""
    try:
        with tarfile.open(tarball) as archive:
            plan = json.load(archive.extractfile("plan.json"))
    except (OSError, EOFError, tarfile.TarError, KeyError, json.JSONDecodeError) as error:
        raise SystemExit(f"{tarball} is not a `study.py export` tarball with a readable plan.json ({error})") from error
    study = plan.get("study") if isinstance(plan, dict) else None
    if not isinstance(study, str) or not STUDY_NAME.fullmatch(study):
        raise SystemExit(
            f"{tarball}: its plan.json names the study {study!r}, which is not a study name (letters, digits, _ . - "
            "as in configs/study/<name>.yaml); pass --results DIR to choose where it goes"
        )
    return study


def import_results(tarball: Path, results_dir: Path, merge: bool = False) -> Path:
    """Unpack an exported tarball into results_dir/raw, replacing it only once the whole archive is unpacked.
    merge: keep the runs and evaluations of the present raw/ that the tarball lacks (another arm's, or a run
    exported from another machine), with their plan.json entries; the tarball's spec.yaml and runs win."""
    raw = results_dir / "raw"
    staging = results_dir / ".raw.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with tarfile.open(tarball) as archive:
            archive.extractall(staging, filter="data")
    except (OSError, EOFError, tarfile.TarError) as error:
        shutil.rmtree(staging)
        raise SystemExit(f"{tarball} cannot be unpacked ({error}); {raw} is unchanged") from error
    if merge and (raw / "plan.json").is_file():
        try:
            merge_raw(raw, staging)
        except SystemExit:
            shutil.rmtree(staging)
            raise
    shutil.rmtree(raw, ignore_errors=True)
    staging.rename(raw)
    return raw


def merge_raw(old: Path, new: Path) -> list[str]:
    """Copy into `new` (an unpacked export) the run dirs and evaluations of `old` (a raw/ folder of the same study)
    that `new` lacks or that ran further in `old`; returns the run names taken from `old`."""
    old_plan, new_plan = json.loads((old / "plan.json").read_text()), json.loads((new / "plan.json").read_text())
    if old_plan.get("study") != new_plan.get("study"):
        raise SystemExit(f"cannot merge study {new_plan.get('study')!r} into {old} of study {old_plan.get('study')!r}")
    kept = []
    for name, entry in old_plan["nodes"].items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise SystemExit(f"{old / 'plan.json'} names the run {name!r}, a path outside its runs/")
        mine, theirs = new / "runs" / name, old / "runs" / name
        ahead = entry.get("reached_step", 0) > new_plan["nodes"].get(name, {}).get("reached_step", 0)
        if (theirs / STUDY_STATE).is_file() and (ahead or not (mine / STUDY_STATE).is_file()):
            shutil.rmtree(mine, ignore_errors=True)
            shutil.copytree(theirs, mine)
            new_plan["nodes"][name] = entry
            evaluation, stale = old / "evals" / f"{name}.json", new / "evals" / f"{name}.json"
            if evaluation.is_file():
                stale.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(evaluation, stale)
            else:  # the export's evaluation is of the other, shorter run
                stale.unlink(missing_ok=True)
            kept.append(name)
    finals = {(f["recipe"], f["seed"]) for f in new_plan["finals"]}
    new_plan["finals"] += [f for f in old_plan["finals"] if (f["recipe"], f["seed"]) not in finals]
    (new / "plan.json").write_text(json.dumps(new_plan, indent=1) + "\n")
    return kept


# --- command line --------------------------------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train and evaluate what is left, within a budget")
    run.add_argument("study", help="configs/study/<study>.yaml")
    run.add_argument("--budget-min", type=float, help="stop before this many minutes are up")
    run.add_argument("--recipes", type=_names, help="only these recipes (comma-separated)")
    run.add_argument(
        "--seeds", type=lambda text: [int(seed) for seed in _names(text)], help="only these seeds (comma-separated)"
    )
    run.add_argument("--export", type=Path, help="write the raw results here (.tar.gz) when done or stopped")
    status = commands.add_parser("status", help="print each run's progress")
    status.add_argument("study")
    evaluate_cmd = commands.add_parser("eval", help="the context evaluations of one run dir's latest checkpoint")
    evaluate_cmd.add_argument("run_dir", type=Path)
    evaluate_cmd.add_argument("--study", required=True, help="whose eval settings to use")
    evaluate_cmd.add_argument("--out", type=Path, help="JSON file (default <run_dir>/context_eval.json)")
    evaluate_cmd.add_argument("--attention", help="another attention backend than the run's")
    evaluate_cmd.add_argument("--device", default="auto")
    pack = commands.add_parser("pack-data", help="compress the study's token shards into .cache/ship/")
    pack.add_argument("study")
    export = commands.add_parser("export", help="the raw results as a .tar.gz")
    export.add_argument("study")
    export.add_argument("dest", type=Path)
    for command in (run, status, export):
        command.add_argument("--runs-dir", type=Path, help="where the study's run dirs are (default runs/<study>)")
    import_cmd = commands.add_parser("import", help="unpack exported raw results into results/<study>/raw")
    import_cmd.add_argument("tarball", type=Path)
    import_cmd.add_argument("--results", type=Path, help="default results/<study in the tarball>")
    import_cmd.add_argument(
        "--merge", action="store_true", help="keep the runs of raw/ that the tarball lacks (e.g. another arm's)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show up as they happen in a captured log
    if args.command == "import":
        results = args.results or ROOT / "results" / exported_study(args.tarball)
        raw = import_results(args.tarball, results, merge=args.merge)
        print(
            f"{raw}: {len(list(raw.glob('runs/**/result.json')))} runs, {len(list(raw.glob('evals/**/*.json')))} "
            f"evaluations; now: python scripts/study_report.py {raw.parent}"
        )
        return 0
    spec = load_spec(args.study)
    runs_dir = (getattr(args, "runs_dir", None) or ROOT / "runs" / spec.name).resolve()
    if args.command == "run":
        selection = select(spec, args.recipes, args.seeds)
        code = run_study(spec, runs_dir, 60 * args.budget_min if args.budget_min else None, selection)
        if args.export:
            n_runs = export_results(spec, runs_dir, args.export)
            print(f"exported {n_runs} runs and their evaluations to {args.export}")
        return code
    if args.command == "status":
        print_status(spec, runs_dir)
    elif args.command == "eval":
        ensure_data(spec)
        result = evaluate(args.run_dir.resolve(), spec, args.attention, args.device)
        out = args.out or args.run_dir / "context_eval.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        full = result["contexts"][str(result["full_context"])]
        print(f"{args.run_dir}: loss {full['loss']:.4f} at context {result['full_context']} -> {out}")
    elif args.command == "pack-data":
        pack = pack_data(spec)
        print(f"{shown(pack)}: {pack.stat().st_size / 2**20:.1f} MiB; carry .cache/ship to the GPU machine")
    elif args.command == "export":
        print(f"exported {export_results(spec, runs_dir, args.dest)} runs to {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
