"""A context study's spec (configs/study/<name>.yaml) and the runs it takes: recipes as chains of stages, with
shared prefixes trained once.

A recipe is a list of stages, (seq_len, end): train at seq_len until step round(end · max_steps), then continue
the same schedule at the next stage's longer seq_len (training/extension.py). Every recipe ends at max_steps, so
all of them see the same tokens. Recipes that agree on their first stages share those runs: the fixed-1K baseline
trained to 75% of the steps *is* the first stage of a 1K -> 16K extension at 75% (same seed, data order and
schedule), so one run dir trains it, keeps a copy of its checkpoint at step 0.75·max_steps (the branch point) and
goes on to max_steps, while the extension starts from that copy in a run dir of its own.

A recipe with `equal_time_to: <recipe>` is a fixed-context run whose step count is set, once that recipe has
trained, so that it gets the same training GPU time (from the median step times measured in both).

A recipe may belong to an `arm`, a named list of train.py overrides from the spec's `arms` that every stage gets
(e.g. rope: [model.position_embedding=rope]); an arm's runs live under seed<k>/<arm>/ and are shared only within it.
A stage may carry overrides of its own as a third item, {key: value}, e.g. [16384, 1.0, {model.rope_base: 500000}]
raises the rotary base when the context grows (ABF); they name its run (16384+rope_base500000), so only stages with
the same overrides are shared.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flashgpt import configs

STUDY_DIR = Path(configs.__file__).parent / "study"  # configs/study/ in a checkout, also in an installed wheel


# Arm names and stage-override keys and values become parts of run-dir names and of hydra.run.dir.
SAFE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Recipe:
    name: str
    stages: tuple[tuple[int, float], ...]  # (seq_len, end as a fraction of max_steps), seq_len increasing, last 1.0
    equal_time_to: str | None = None
    arm: str | None = None  # a key of Spec.arms: train.py overrides for every stage
    # Per stage (empty, or one entry per stage): train.py overrides of that stage alone, e.g. model.rope_base=500000.
    stage_overrides: tuple[tuple[str, ...], ...] = ()

    def overrides_of(self, stage: int) -> tuple[str, ...]:
        return self.stage_overrides[stage] if self.stage_overrides else ()

    def stage_name(self, stage: int) -> str:
        """The stage's part of a run-dir name: '16384', or '16384+rope_base500000' with model.rope_base=500000."""
        tags = [
            f"{key.rsplit('.', 1)[-1]}{value}" for key, value in (o.split("=", 1) for o in self.overrides_of(stage))
        ]
        return "+".join([str(self.stages[stage][0]), *tags])

    def describe(self) -> str:
        """'1024' or '1024 -> 16384 at 75%' or '1024 (GPU time of ext-16k)', with the arm and any stage's own
        overrides: 'rope: 1024 -> 16384 at 90% with model.rope_base=500000'."""
        parts = []
        for i, (seq_len, _) in enumerate(self.stages):
            text = str(seq_len) if i == 0 else f"{seq_len} at {self.stages[i - 1][1]:.0%}"
            parts.append(" ".join([text, "with", ", ".join(self.overrides_of(i))]) if self.overrides_of(i) else text)
        text = " -> ".join(parts)
        text = f"{self.arm}: {text}" if self.arm else text
        return f"{text} (GPU time of {self.equal_time_to})" if self.equal_time_to else text


@dataclass(frozen=True)
class EvalSpec:
    length: int = 16384  # targets of each long held-out document
    first_bin: int = 1024  # position bins [0, first_bin), then doubling
    contexts: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384)  # each model at every one up to its block size
    stride_divisor: int = 4  # sliding-window stride = context / stride_divisor
    max_docs: int | None = None  # long held-out documents scored (None: all)
    passkey_distances: tuple[int, ...] = (128, 512, 896, 1792, 3584, 7168, 14336)
    passkey_trials: int = 40
    passkey_seed: int = 0
    batch_tokens: int = 16384  # tokens of one evaluation forward pass


@dataclass(frozen=True)
class Spec:
    name: str
    preset: str  # configs/experiment/<preset>.yaml, for every run
    max_steps: int
    recipes: dict[str, Recipe]
    baseline: str  # the recipe the others are compared with
    seeds: tuple[int, ...] = (0,)
    overrides: tuple[str, ...] = ()  # more train.py overrides for every run
    checkpoint_every: int = 250  # steps; a stopped run loses at most this much
    eval: EvalSpec = field(default_factory=EvalSpec)
    arms: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> train.py overrides of its recipes


def load_spec(name_or_path: str) -> Spec:
    """configs/study/<name>.yaml, or a path to a spec file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = STUDY_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in STUDY_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"no study spec {path}; the studies in {STUDY_DIR} are: {known}")
    return parse_spec(path.stem, yaml.safe_load(path.read_text()), where=str(path))


def parse_spec(name: str, raw: dict[str, Any], where: str) -> Spec:
    """The spec from its YAML mapping; raises ValueError naming the file and the key on any mistake."""

    def fail(message: str) -> ValueError:
        return ValueError(f"{where}: {message}")

    known = {f for f in Spec.__dataclass_fields__ if f != "name"}
    if unknown := set(raw) - known:
        raise fail(f"unknown keys {sorted(unknown)}; the keys are {sorted(known)}")
    if missing := {"preset", "max_steps", "recipes", "baseline"} - set(raw):
        raise fail(f"missing keys {sorted(missing)}")
    eval_raw = raw.get("eval") or {}
    if unknown := set(eval_raw) - set(EvalSpec.__dataclass_fields__):
        raise fail(f"unknown eval keys {sorted(unknown)}; the keys are {sorted(EvalSpec.__dataclass_fields__)}")
    tuples = {"contexts", "passkey_distances"}
    eval_spec = EvalSpec(**{k: tuple(v) if k in tuples else v for k, v in eval_raw.items()})
    recipes = {}
    for recipe_name, body in (raw.get("recipes") or {}).items():
        try:
            stages = tuple((int(stage[0]), float(stage[1])) for stage in body["stages"])
            extras = [stage[2] if len(stage) == 3 else {} for stage in body["stages"]]
            if any(
                len(stage) not in (2, 3) or not isinstance(extra, dict)
                for stage, extra in zip(body["stages"], extras, strict=True)
            ):
                raise ValueError("a stage is [seq_len, end] or [seq_len, end, {override key: value}]")
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise fail(
                f"recipe {recipe_name}: `stages` must be a list of [seq_len, end] pairs, each optionally with a "
                "mapping of train.py overrides for that stage, e.g. [16384, 1.0, {model.rope_base: 500000}] "
                f"({error!r})"
            ) from error
        stage_overrides = tuple(tuple(f"{key}={value}" for key, value in extra.items()) for extra in extras)
        if unknown := set(body) - {"stages", "equal_time_to", "arm"}:
            raise fail(f"recipe {recipe_name}: unknown keys {sorted(unknown)}; the keys are arm, equal_time_to, stages")
        recipes[recipe_name] = Recipe(
            recipe_name,
            stages,
            body.get("equal_time_to"),
            body.get("arm"),
            stage_overrides if any(stage_overrides) else (),
        )
    arms = raw.get("arms") or {}
    if not isinstance(arms, dict) or not all(isinstance(o, list) for o in arms.values()):
        raise fail(
            "`arms` must map each arm's name to a list of train.py overrides, e.g. "
            "rope: [model.position_embedding=rope]"
        )
    spec = Spec(
        name=name,
        preset=raw["preset"],
        max_steps=int(raw["max_steps"]),
        recipes=recipes,
        baseline=raw["baseline"],
        seeds=tuple(raw.get("seeds", (0,))),
        overrides=tuple(raw.get("overrides", ())),
        checkpoint_every=int(raw.get("checkpoint_every", 250)),
        eval=eval_spec,
        arms={name: tuple(overrides) for name, overrides in arms.items()},
    )
    for problem in spec_problems(spec):
        raise fail(problem)
    try:
        build_plan(spec)  # two recipes' stages that would share a run dir with different overrides
    except ValueError as error:
        raise fail(str(error)) from error
    return spec


def spec_problems(spec: Spec) -> list[str]:
    problems = []
    if not spec.recipes:
        problems.append("no recipes")
    if spec.baseline not in spec.recipes:
        problems.append(f"baseline {spec.baseline!r} is not a recipe ({', '.join(spec.recipes)})")
    fixed_starts = {(r.arm, r.stage_name(0)) for r in spec.recipes.values() if r.stages and r.equal_time_to is None}
    for name in spec.arms:
        if not SAFE_NAME.fullmatch(name):
            problems.append(f"arm {name!r}: its name names run dirs; use letters, digits, '_', '.', '-'")
    for recipe in spec.recipes.values():
        seq_lens = [s for s, _ in recipe.stages]
        ends = [e for _, e in recipe.stages]
        if not recipe.stages:
            problems.append(f"recipe {recipe.name}: no stages")
            continue
        if recipe.arm is not None and recipe.arm not in spec.arms:
            problems.append(
                f"recipe {recipe.name}: arm {recipe.arm!r} is not one of the spec's arms {sorted(spec.arms)}"
            )
        for override in itertools.chain(*recipe.stage_overrides):
            if not all(SAFE_NAME.fullmatch(part) for part in override.split("=", 1)):
                problems.append(
                    f"recipe {recipe.name}: stage override {override!r} names its run dir; keys and values may hold "
                    "letters, digits, '_', '.', '-'"
                )
        if ends[-1] != 1.0:
            problems.append(f"recipe {recipe.name}: the last stage must end at 1.0 (max_steps), got {ends}")
        if any(b <= a for a, b in itertools.pairwise(seq_lens)):
            problems.append(f"recipe {recipe.name}: each stage needs a longer seq_len than the one before: {seq_lens}")
        steps = [stage_end_step(spec, e) for e in ends]
        if any(not 0 < a < b for a, b in itertools.pairwise(steps)) or steps[0] <= 0:
            problems.append(f"recipe {recipe.name}: stage ends {ends} give steps {steps}, not increasing from 1")
        if recipe.equal_time_to is not None:
            if len(recipe.stages) != 1 or (recipe.arm, recipe.stage_name(0)) not in fixed_starts:
                problems.append(
                    f"recipe {recipe.name}: equal_time_to needs a single stage at a seq_len (and arm and overrides) "
                    "another recipe starts with (its step time is measured there)"
                )
            target = spec.recipes.get(recipe.equal_time_to)
            if target is None or target.equal_time_to is not None:
                problems.append(
                    f"recipe {recipe.name}: equal_time_to={recipe.equal_time_to!r} must name a recipe of "
                    "its own step count"
                )
    if not spec.seeds:
        problems.append("no seeds")
    if spec.max_steps < 1 or spec.checkpoint_every < 1:
        problems.append("max_steps and checkpoint_every must be positive")
    if spec.eval.length < 2 * spec.eval.first_bin or any(c > spec.eval.length for c in spec.eval.contexts):
        problems.append(f"eval.length={spec.eval.length} must be at least 2·first_bin and every context")
    return problems


def stage_end_step(spec: Spec, end: float) -> int:
    return round(end * spec.max_steps)


# --- the runs -----------------------------------------------------------------------------------------------


@dataclass(eq=False)  # a run is itself: hashed and compared by identity
class Node:
    """One run dir: training at one seq_len, from scratch or from its parent's checkpoint at `branch_step`."""

    name: str  # run dir relative to the study's runs dir, e.g. seed0/1024x1500_16384 or seed0/rope/1024
    seed: int
    seq_len: int
    max_steps: int | None  # the schedule's length; None until an equal-time recipe's is measured
    parent: Node | None = None
    branch_step: int | None = None  # the parent's step this run starts from
    targets: set[int] = field(default_factory=set)  # steps where a stage ends or a child branches off
    overrides: tuple[str, ...] = ()  # train.py overrides of its arm and its stage

    def segments(self) -> list[int]:
        """The stop steps of its train.py jobs, in order: each branch point, then its last step."""
        return sorted(self.targets)


@dataclass
class Plan:
    spec: Spec
    nodes: dict[str, Node]  # in an order where every parent comes before its children
    finals: dict[tuple[str, int], Node]  # (recipe, seed) -> the node whose last step is the recipe's model


def build_plan(spec: Spec, measured_steps: dict[tuple[str, int], int] | None = None) -> Plan:
    """The runs of every recipe and seed. measured_steps: the max_steps of equal-time recipes, (recipe, seed) ->
    steps (equal_time_steps); recipes missing from it get a run with max_steps None (not runnable yet)."""
    measured_steps = measured_steps or {}
    nodes: dict[str, Node] = {}
    finals = {}
    for seed in spec.seeds:
        for recipe in spec.recipes.values():
            parent, prefix = None, seed_dir(seed, recipe)
            for i, (seq_len, end) in enumerate(recipe.stages):
                if recipe.equal_time_to is None:
                    name = f"{prefix}{recipe.stage_name(i)}"
                    max_steps, end_step = spec.max_steps, stage_end_step(spec, end)
                else:  # a single stage (spec_problems)
                    name = f"{prefix}{recipe.stage_name(i)}_equal_time_{recipe.equal_time_to}"
                    max_steps = end_step = measured_steps.get((recipe.name, seed))
                branch_step = stage_end_step(spec, recipe.stages[i - 1][1]) if i else None
                overrides = (*spec.arms.get(recipe.arm, ()), *recipe.overrides_of(i))
                node = nodes.setdefault(
                    name, Node(name, seed, seq_len, max_steps, parent, branch_step, overrides=overrides)
                )
                if node.overrides != overrides:
                    raise ValueError(
                        f"recipe {recipe.name}: run {name} would train with {list(overrides)}, but another recipe's "
                        f"run of that name with {list(node.overrides)}: give the stage overrides distinct values"
                    )
                if end_step is not None:
                    node.targets.add(end_step)
                parent, prefix = node, f"{name}x{end_step}_"
            finals[(recipe.name, seed)] = parent
    return Plan(spec, nodes, finals)


def seed_dir(seed: int, recipe: Recipe) -> str:
    """Where a recipe's runs live: seed<k>/, or seed<k>/<arm>/ for a recipe of an arm."""
    return f"seed{seed}/{recipe.arm}/" if recipe.arm else f"seed{seed}/"


# --- what the runs have done (their files in a study's runs dir) ------------------------------------------------


def read_json(path: Path) -> dict[str, Any]:
    """The file's JSON object, {} when there is no file; a damaged one (a truncated copy) is an error naming it."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from error


def reached_step(runs_dir: Path, node: Node) -> int:
    """The last step a job of this run finished at (result.json); a stopped job's later checkpoint does not count."""
    result = read_json(runs_dir / node.name / "result.json")
    return result.get("step", 0) if result.get("status") == "ok" else 0


def step_times(runs_dir: Path, node: Node, first: int, last: int) -> list[float]:
    """The logged step times of steps first..last of a run."""
    path = runs_dir / node.name / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [r["perf/step_time_s"] for r in records if "perf/step_time_s" in r and first <= r["step"] <= last]


def recipe_chain(plan: Plan, recipe: str, seed: int) -> list[tuple[Node, int, int]]:
    """(run, first step, last step) of each stage of a recipe's model."""
    chain, node = [], plan.finals[(recipe, seed)]
    last = node.max_steps
    while node is not None:
        first = (node.branch_step or 0) + 1
        chain.append((node, first, last))
        last, node = node.branch_step, node.parent
    return chain[::-1]


def train_seconds(plan: Plan, runs_dir: Path, recipe: str, seed: int) -> float | None:
    """Training GPU time of a recipe's model: per stage, its steps times the median measured step time."""
    total = 0.0
    for node, first, last in recipe_chain(plan, recipe, seed):
        if last is None or reached_step(runs_dir, node) < last:
            return None
        times = step_times(runs_dir, node, first, last)
        if not times:
            return None
        total += (last - first + 1) * statistics.median(times)
    return total


def equal_time_steps(spec: Spec, runs_dir: Path) -> dict[tuple[str, int], int]:
    """Steps of each equal-time recipe whose reference and fixed-context twin have both trained: the reference's
    training time over the median step time of the fixed-context run at the same seq_len. `runs_dir` holds the run
    dirs (runs/<study>, or an exported raw/runs: the same files at the same paths)."""
    steps, plan = {}, build_plan(spec)
    for recipe in spec.recipes.values():
        if recipe.equal_time_to is None:
            continue
        for seed in spec.seeds:
            target = train_seconds(plan, runs_dir, recipe.equal_time_to, seed)
            twin = plan.nodes[f"{seed_dir(seed, recipe)}{recipe.stage_name(0)}"]
            times = step_times(runs_dir, twin, 1, spec.max_steps)
            # Both finished: their step times are final, so the step count never changes once the run starts.
            if target is not None and times and reached_step(runs_dir, twin) >= max(twin.targets):
                steps[(recipe.name, seed)] = max(1, round(target / statistics.median(times)))
    return steps


def current_plan(spec: Spec, runs_dir: Path) -> Plan:
    return build_plan(spec, equal_time_steps(spec, runs_dir))
