"""Build results/<study>/report.md and its plots from the study's raw files alone (no GPU, no torch):

    python scripts/study.py import context-raw.tar.gz      # -> results/context/raw/
    python scripts/study_report.py results/context

raw/ holds what `scripts/study.py run --export` (`flashgpt.training.study`) packed: spec.yaml, plan.json,
runs/<run>/{config.yaml, metrics.jsonl, result.json, study.json} and evals/<run>.json (training/context_eval.py's
numbers per model).
Every number in the report is computed here from those files; recipes or seeds not finished yet are left out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on GPU boxes or CI
import matplotlib.pyplot as plt
import yaml

from flashgpt.training.context_eval import CHOICES
from flashgpt.training.study_plan import Recipe, Spec, current_plan, parse_spec, read_json, train_seconds

CODE_SUFFIX = ".py"  # doc ids of source files end so (data/python_code.py); the rest of long_mix is prose


@dataclass
class Model:
    """One recipe trained with one seed: its evaluation and what it cost."""

    recipe: Recipe
    seed: int
    run: str  # the run dir of its last stage
    evaluation: dict
    train_s: float | None  # training GPU seconds: per stage, steps x median step time
    tokens: int | None  # training tokens

    @property
    def full(self) -> dict:
        """The evaluation at the model's own (longest) context."""
        return self.evaluation["contexts"][str(self.evaluation["full_context"])]

    def read(self, reading: str) -> dict | None:
        """The evaluation at its own context read in sliding windows ("sliding"), or in consecutive windows
        ("consecutive"; None for evaluations made before it was measured)."""
        return self.full if reading == "sliding" else self.evaluation.get("consecutive")


def load_models(raw: Path) -> tuple[Spec, list[Model], dict]:
    plan_json = read_json(raw / "plan.json")
    if missing := [key for key in ("study", "nodes") if key not in plan_json]:
        raise ValueError(f"{raw / 'plan.json'} has no {', '.join(missing)}: it is not the plan of a study.py export")
    spec = parse_spec(plan_json["study"], yaml.safe_load((raw / "spec.yaml").read_text()), where=str(raw / "spec.yaml"))
    runs = raw / "runs"
    plan = current_plan(spec, runs)
    models = []
    for (recipe, seed), node in plan.finals.items():
        evaluation = read_json(raw / "evals" / f"{node.name}.json")
        if not evaluation:
            continue
        per_step = read_json(runs / node.name / "result.json").get("tokens_per_step")
        tokens = per_step * node.max_steps if per_step and node.max_steps else None
        models.append(Model(spec.recipes[recipe], seed, node.name, evaluation,
                            train_seconds(plan, runs, recipe, seed), tokens))  # fmt: skip
    return spec, models, plan_json


# --- numbers ----------------------------------------------------------------------------------------------


def _span(name: str) -> tuple[int, int]:
    lo, hi = name.split("-")
    return int(lo), int(hi) + 1


def beyond_first_bin(summary: dict) -> tuple[float, list[float]]:
    """Loss over the targets past the first position bin: overall and per document (bins weighted by width)."""
    bins = [(name, _span(name)) for name in summary["bins"]][1:]
    width = sum(hi - lo for _, (lo, hi) in bins)
    overall = sum(summary["bins"][name] * (hi - lo) for name, (lo, hi) in bins) / width
    n_docs = len(summary["per_doc"])
    per_doc = [
        sum(summary["per_doc_bins"][name][d] * (hi - lo) for name, (lo, hi) in bins) / width for d in range(n_docs)
    ]
    return overall, per_doc


def paired(
    model: Model, baseline: Model, docs: list[int] | None = None, reading: str = "sliding"
) -> tuple[float, float, int]:
    """Mean per-document difference (model - baseline) of the loss past the first bin, its standard error, and
    the number of documents; `docs` restricts it to some documents (indices); `reading` as in Model.read."""
    _, mine = beyond_first_bin(model.read(reading))
    _, theirs = beyond_first_bin(baseline.read(reading))
    keep = range(len(mine)) if docs is None else docs
    diffs = [mine[d] - theirs[d] for d in keep]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return statistics.fmean(diffs), se, len(diffs)


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:{spec}}"


def _k(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def by_recipe(spec: Spec, models: list[Model]) -> dict[str, list[Model]]:
    grouped: dict[str, list[Model]] = {name: [] for name in spec.recipes}
    for model in models:
        grouped[model.recipe.name].append(model)
    return {name: sorted(group, key=lambda m: m.seed) for name, group in grouped.items() if group}


def baseline_name(spec: Spec, recipe: Recipe) -> str | None:
    """The recipe a recipe is compared with: within an arm, the arm's recipe of the baseline's stages (rope-fixed-1k
    for the rope recipes), so that only the schedule differs; the spec's baseline for recipes of no arm and for the
    arm's own baseline (rope-fixed-1k vs fixed-1k: the position encoding alone); None for the spec's baseline."""
    base = spec.recipes[spec.baseline]
    if recipe.arm is not None and recipe.arm != base.arm:
        for other in spec.recipes.values():
            same = (other.stages, other.stage_overrides) == (base.stages, base.stage_overrides)
            if other.arm == recipe.arm and same and other.equal_time_to is None and other.name != recipe.name:
                return other.name
    return None if recipe.name == spec.baseline else spec.baseline


def baseline_of(spec: Spec, models: list[Model], model: Model) -> Model | None:
    name = baseline_name(spec, model.recipe)
    return next((m for m in models if m.recipe.name == name and m.seed == model.seed), None)


# --- tables -----------------------------------------------------------------------------------------------


def summary_table(spec: Spec, models: list[Model]) -> str:
    first = spec.eval.first_bin
    lines = [
        f"| recipe | stages | seeds | training tokens | training GPU-min | ppl at own context | loss | loss at "
        f"positions ≥ {_k(first)} | baseline | Δ vs baseline at ≥ {_k(first)} (paired SE) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for name, group in by_recipe(spec, models).items():
        deltas = []
        for model in group:
            base = baseline_of(spec, models, model)
            if base is not None:
                mean, se, _ = paired(model, base)
                deltas.append(f"seed {model.seed}: {mean:+.4f} ({se:.4f})")
        loss = _mean([m.full["loss"] for m in group])
        cells = [
            name,
            group[0].recipe.describe(),
            ", ".join(str(m.seed) for m in group),
            _fmt(_mean([m.tokens for m in group]), ",.0f"),
            _fmt(_mean([m.train_s / 60 if m.train_s else None for m in group]), ".2f"),
            _fmt(math.exp(loss) if loss is not None else None, ".2f"),
            _fmt(loss, ".4f"),
            _fmt(_mean([beyond_first_bin(m.full)[0] for m in group]), ".4f"),
            baseline_name(spec, group[0].recipe) or "–",
            "; ".join(deltas) or "–",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def position_table(models: list[Model]) -> str:
    bins = list(next(iter(models)).full["bins"]) if models else []
    lines = ["| recipe | seed | context | " + " | ".join(bins) + " |", "|---|---:|---:" + "|---:" * len(bins) + "|"]
    for m in models:
        cells = [_fmt(m.full["bins"].get(b), ".4f") for b in bins]
        lines.append(f"| {m.recipe.name} | {m.seed} | {_k(m.evaluation['full_context'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def position_delta_table(spec: Spec, models: list[Model]) -> str | None:
    """Per recipe with a baseline: the change of its loss in each position bin against the baseline's (sliding
    windows, same seeds), the mean over seeds and their range. Whatever makes later positions of a document easier
    for every model cancels, and what is left is what the recipe's longer history buys at each position."""
    bins = list(models[0].full["bins"]) if models else []
    rows = []
    for name, group in by_recipe(spec, models).items():
        pairs = [(m, base) for m in group if (base := baseline_of(spec, models, m)) is not None]
        if pairs:
            deltas = {b: [m.full["bins"][b] - base.full["bins"][b] for m, base in pairs] for b in bins}
            rows.append((name, baseline_name(spec, group[0].recipe), len(pairs), deltas))
    if not rows:
        return None
    lines = ["| recipe | baseline | seeds | " + " | ".join(bins) + " |", "|---|---|---:" + "|---:" * len(bins) + "|"]
    for name, base, n, deltas in rows:
        cells = []
        for b in bins:
            values = deltas[b]
            spread = f" ({min(values):+.3f} to {max(values):+.3f})" if len(values) > 1 else ""
            cells.append(f"{statistics.fmean(values):+.4f}{spread}")
        lines.append(f"| {name} | {base} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def context_table(spec: Spec, models: list[Model]) -> str:
    contexts = sorted({int(c) for m in models for c in m.evaluation["contexts"]})
    lines = ["| recipe | seed | " + " | ".join(f"context {_k(c)}" for c in contexts) + " |",
             "|---|---:" + "|---:" * len(contexts) + "|"]  # fmt: skip
    for m in models:
        cells = [_fmt(m.evaluation["contexts"].get(str(c), {}).get("loss"), ".4f") for c in contexts]
        lines.append(f"| {m.recipe.name} | {m.seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def consecutive_table(spec: Spec, models: list[Model]) -> str | None:
    """Loss by position bin read in consecutive windows of each model's own context, and the paired change past
    the first bin against its baseline read the same way."""
    read = [m for m in models if m.read("consecutive") is not None]
    if not read:
        return None
    first = _k(spec.eval.first_bin)
    bins = list(read[0].read("consecutive")["bins"])
    lines = [f"| recipe | seed | context | loss at ≥ {first} | Δ vs baseline at ≥ {first} (paired SE) | "
             + " | ".join(bins) + " |", "|---|---:|---:|---:|---" + "|---:" * len(bins) + "|"]  # fmt: skip
    for m in read:
        summary = m.read("consecutive")
        base = baseline_of(spec, models, m)
        delta = "–"
        if base is not None and base.read("consecutive") is not None:
            delta = "{:+.4f} ({:.4f})".format(*paired(m, base, reading="consecutive")[:2])
        cells = [_fmt(beyond_first_bin(summary)[0], ".4f"), delta, *(_fmt(summary["bins"][b], ".4f") for b in bins)]
        lines.append(f"| {m.recipe.name} | {m.seed} | {_k(m.evaluation['full_context'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The later probes' report sections: (evaluation key, heading, what the trials ask).
PROBE_SECTIONS = (
    (
        "passkey_code",
        "## Passkey retrieval, code probe",
        "The same trials worded as Python: the needle `PASS_KEY = <key>  # the pass key` on a line of its own, the "
        "question `assert PASS_KEY ==`, which asks for the value bound to a name rather than for a copy of what "
        "followed the question's own words (models evaluated before this probe existed are absent). Accuracy, then "
        "the mean loss of a key token.",
    ),
    (
        "passkey_identifier",
        "## Identifier copy",
        "The copy that source code asks for: the needle assigns a made-up name of five random words "
        "(`flame_finger_stone_night_grass = None`), and `distance` tokens later a line starts with its first two "
        "words; the model is right if it continues with the rest of the name (`_stone_night_grass`, six tokens), "
        "each token its argmax (models evaluated before this probe existed are absent). Accuracy, then the mean "
        "loss of an answer token.",
    ),
    (
        "passkey_repeat",
        "## Repeated words",
        "The plainest copy: a run of eight distinct rare words (`quartz lobster violin …`, one token each) stands in "
        "the text, and `distance` tokens later its first three words come again; the model is right if it continues "
        "with the other five, each token its argmax (models evaluated before this probe existed are absent). "
        "Accuracy, then the mean loss of an answer token.",
    ),
)


def passkey_table(models: list[Model], probe: str = "passkey", measure: str = "accuracy") -> str | None:
    """Accuracy (or the mean loss of a key token, `measure="key_loss"`, or the choice accuracy against distractors,
    `"choice_accuracy"`) per distance of the probe's trials (evaluation key `passkey`: prose, `passkey_code`: code,
    `passkey_identifier`: identifier, `passkey_repeat`: repeated words), for the models evaluated with it."""
    models = [m for m in models if _has_measure(m, probe, measure)]
    if not models:
        return None
    distances = sorted({int(d) for m in models for d in m.evaluation[probe]})
    lines = ["| recipe | seed | context | " + " | ".join(f"d={d}" for d in distances) + " |",
             "|---|---:|---:" + "|---:" * len(distances) + "|"]  # fmt: skip
    for m in models:
        cells = []
        for d in distances:
            score = m.evaluation[probe].get(str(d))
            cut = score is not None and score["needle_in_context"] < 1
            cells.append("–" if score is None else f"{score[measure]:.2f}" + (" (cut off)" if cut else ""))
        lines.append(f"| {m.recipe.name} | {m.seed} | {_k(m.evaluation['seq_len'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def domain_table(spec: Spec, models: list[Model]) -> str | None:
    """Loss past the first bin on source files and on prose, and each recipe's paired change there."""
    if not models:
        return None
    doc_ids = models[0].evaluation["doc_ids"]
    domains = {"code": [i for i, d in enumerate(doc_ids) if d.endswith(CODE_SUFFIX)]}
    domains["prose"] = [i for i in range(len(doc_ids)) if i not in domains["code"]]
    domains = {name: docs for name, docs in domains.items() if docs}
    if len(domains) < 2:
        return None
    header = " | ".join(f"{name} ({len(docs)} docs): loss, Δ vs baseline" for name, docs in domains.items())
    lines = [f"| recipe | seed | {header} |", "|---|---:" + "|---" * len(domains) + "|"]
    for m in models:
        _, per_doc = beyond_first_bin(m.full)
        base = baseline_of(spec, models, m)
        cells = []
        for docs in domains.values():
            loss = statistics.fmean(per_doc[d] for d in docs)
            delta = "" if base is None else ", {:+.4f} ({:.4f})".format(*paired(m, base, docs)[:2])
            cells.append(f"{loss:.4f}{delta}")
        lines.append(f"| {m.recipe.name} | {m.seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(raw: Path, plan_json: dict) -> tuple[str, float, float]:
    """Per run: steps, tokens/s, jobs' wall time; and the study's total training and evaluation wall seconds."""
    lines = ["| run | seq_len | steps | median step s | tokens/s | jobs | wall s (jobs) | evaluation wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    train_wall = eval_wall = 0.0
    for name, node in plan_json["nodes"].items():
        run_dir = raw / "runs" / name
        jobs = read_json(run_dir / "study.json").get("jobs", [])
        if not jobs:
            continue  # not started (a recipe not run yet)
        metrics = run_dir / "metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        times = [r["perf/step_time_s"] for r in records if "perf/step_time_s" in r]
        result = read_json(run_dir / "result.json")
        wall = sum(job["wall_s"] for job in jobs)
        evaluation = read_json(raw / "evals" / f"{name}.json").get("wall_s")
        train_wall, eval_wall = train_wall + wall, eval_wall + (evaluation or 0.0)
        step_s = statistics.median(times) if times else None
        speed = result.get("tokens_per_step") / step_s if step_s and result.get("tokens_per_step") else None
        state = f"FAILED: {node['failed']}" if node.get("failed") else f"{node['reached_step']} of {node['max_steps']}"
        cells = [name, str(node["seq_len"]), state, _fmt(step_s, ".4f"), _fmt(speed, ",.0f"), str(len(jobs)),
                 _fmt(wall, ".0f"), _fmt(evaluation, ".0f")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), train_wall, eval_wall


# --- reading ----------------------------------------------------------------------------------------------


def reading(spec: Spec, models: list[Model]) -> list[str]:
    lines = []
    first = _k(spec.eval.first_bin)
    groups = by_recipe(spec, models)
    baselines = [n for n in groups if n == spec.baseline or any(baseline_name(spec, m.recipe) == n for m in models)]
    for base in baselines:
        if len(groups[base]) > 1:
            values = [beyond_first_bin(m.full)[0] for m in groups[base]]
            lines.append(f"- run-to-run spread of {base} (loss at positions ≥ {first}, seeds "
                         f"{[m.seed for m in groups[base]]}): {max(values) - min(values):.4f} nats.")  # fmt: skip
    for name, group in groups.items():
        bins = group[0].full["bins"]
        trend = " → ".join(f"{_fmt(_mean([m.full['bins'][b] for m in group]), '.3f')}" for b in bins)
        lines.append(f"- {name}: loss by position bin {trend} ({', '.join(bins)}).")
        pairs = [(m, baseline_of(spec, models, m)) for m in group]
        pairs = [(m, b) for m, b in pairs if b is not None]
        base_name = baseline_name(spec, group[0].recipe)
        if pairs:
            ppl = statistics.fmean(math.exp(m.full["loss"]) for m, _ in pairs)
            base_ppl = statistics.fmean(math.exp(b.full["loss"]) for _, b in pairs)
            lines.append(
                f"  held-out perplexity at its own context {ppl:.2f} vs {base_name}'s {base_ppl:.2f} "
                f"({100 * (ppl / base_ppl - 1):+.2f}%), same targets, seeds {[m.seed for m, _ in pairs]}."
            )
            means = [paired(m, b)[0] for m, b in pairs]
            relative = [paired(m, b)[0] / beyond_first_bin(b.full)[0] for m, b in pairs]
            detail = "; ".join(f"seed {m.seed}: {paired(m, b)[0]:+.4f} ± {paired(m, b)[1]:.4f}" for m, b in pairs)
            spread = f"; spread over seeds {max(means) - min(means):.4f}" if len(means) > 1 else ""
            lines.append(
                f"  vs {base_name} at positions ≥ {first}: {statistics.fmean(means):+.4f} nats "
                f"({100 * statistics.fmean(relative):+.2f}%; perplexity there "
                f"{100 * statistics.fmean(math.expm1(d) for d in means):+.2f}%), "
                f"paired over {paired(*pairs[0])[2]} documents ({detail}{spread})."
            )
        read = [(m, b) for m, b in pairs if m.read("consecutive") is not None and b.read("consecutive") is not None]
        if read:
            means = [paired(m, b, reading="consecutive")[0] for m, b in read]
            lines.append(
                f"  read in consecutive windows of each model's own context: {statistics.fmean(means):+.4f} nats vs "
                f"{base_name} at positions ≥ {first} (perplexity there "
                f"{100 * statistics.fmean(math.expm1(d) for d in means):+.2f}%; seeds "
                + ", ".join(f"{d:+.4f}" for d in means)
                + ")."
            )
        for probe, exact, choice in (
            ("passkey", "passkey accuracy", "passkey choice accuracy"),
            ("passkey_code", "passkey accuracy, code probe", "passkey choice accuracy, code probe"),
            ("passkey_identifier", "identifier copy accuracy", "identifier copy choice accuracy"),
            ("passkey_repeat", "repeated-words copy accuracy", "repeated-words copy choice accuracy"),
        ):
            if passkey := _mean_passkey(group, probe):
                cells = ", ".join(f"d={d}: {acc:.2f}" for d, acc in passkey)
                lines.append(f"  {exact} (own context {_k(group[0].evaluation['seq_len'])}): {cells}.")
            if chosen := _mean_passkey(group, probe, "choice_accuracy"):
                cells = ", ".join(f"d={d}: {acc:.2f}" for d, acc in chosen)
                lines.append(f"  {choice} (chance {1 / CHOICES:.2f}): {cells}.")
    return lines


def _has_measure(model: Model, probe: str, measure: str) -> bool:
    """Whether the model was scored with the probe and this measure (choice accuracy is newer than the probes)."""
    return probe in model.evaluation and all(measure in score for score in model.evaluation[probe].values())


def _mean_passkey(group: list[Model], probe: str = "passkey", measure: str = "accuracy") -> list[tuple[int, float]]:
    """Mean of a measure over the group's seeds per distance; empty unless every model was scored with it."""
    if not all(_has_measure(m, probe, measure) for m in group):
        return []
    distances = sorted({int(d) for m in group for d in m.evaluation[probe]})
    return [(d, statistics.fmean(m.evaluation[probe][str(d)][measure] for m in group)) for d in distances]


def _choice_section(probe: str, models: list[Model]) -> list[str]:
    """The probe's choice-accuracy table and what it measures, for the models scored with it."""
    table = passkey_table(models, probe, "choice_accuracy")
    if table is None:
        return []
    return [
        f"Choice accuracy: the share of trials where the model finds the answer strictly more likely than each of "
        f"{CHOICES - 1} distractors, other keys' answers of as many tokens (chance {1 / CHOICES:.2f}; models "
        "evaluated before this measure existed are absent).",
        table,
    ]


# --- plots ------------------------------------------------------------------------------------------------


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_loss_by_position(spec: Spec, models: list[Model], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, group in by_recipe(spec, models).items():
        bins = list(group[0].full["bins"])
        ax.plot(range(len(bins)), [_mean([m.full["bins"][b] for m in group]) for b in bins], "o-", label=name)
    ax.set_xticks(range(len(bins)), bins, fontsize=8)
    ax.set_xlabel("absolute position in the held-out document (bin)")
    ax.set_ylabel("loss (nats), mean over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_context(spec: Spec, models: list[Model], path: Path) -> None:
    """Left: each model scored with 1K, 2K, ... of history (equal training tokens). Right: perplexity at its own
    context against training GPU time (equal time)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, group in by_recipe(spec, models).items():
        contexts = sorted({int(c) for m in group for c in m.evaluation["contexts"]})
        ppl = [math.exp(_mean([m.evaluation["contexts"][str(c)]["loss"] for m in group])) for c in contexts]
        left.plot(contexts, ppl, "o-", label=name)
        minutes = _mean([m.train_s / 60 if m.train_s else None for m in group])
        if minutes is not None:
            right.plot(minutes, math.exp(_mean([m.full["loss"] for m in group])), "o")
            right.annotate(name, (minutes, math.exp(_mean([m.full["loss"] for m in group]))), fontsize=8,
                           textcoords="offset points", xytext=(4, 4))  # fmt: skip
    left.set_xscale("log", base=2)
    left.set_xlabel("context given at evaluation (tokens)")
    left.set_ylabel("held-out perplexity, long documents")
    left.set_title("same tokens, different context (equal training tokens)", fontsize=9)
    left.legend(fontsize=8)
    right.set_xlabel("training GPU-minutes")
    right.set_ylabel("perplexity at the model's own context")
    right.set_title("equal time", fontsize=9)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    _save(fig, path)


def plot_passkey(spec: Spec, models: list[Model], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, group in by_recipe(spec, models).items():
        points = _mean_passkey(group)
        ax.plot([d for d, _ in points], [acc for _, acc in points], "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("tokens between the passkey and the question")
    ax.set_ylabel("retrieval accuracy, mean over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_passkey_choice(models: list[Model], path: Path) -> bool:
    """Choice accuracy on the prose passkey per distance, one line per model scored with it; False if none was."""
    scored = [m for m in models if _has_measure(m, "passkey", "choice_accuracy")]
    if not scored:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in scored:
        points = sorted((int(d), score["choice_accuracy"]) for d, score in m.evaluation["passkey"].items())
        ax.plot([d for d, _ in points], [acc for _, acc in points], "o-", label=f"{m.recipe.name}, seed {m.seed}")
    ax.axhline(1 / CHOICES, color="gray", linestyle="--", linewidth=1, label="chance")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("tokens between the passkey and the question")
    ax.set_ylabel(f"choice accuracy (1 of {CHOICES})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


# --- the report -------------------------------------------------------------------------------------------


def build_report(results: Path) -> Path:
    raw = results / "raw"
    if not (raw / "plan.json").is_file():
        raise FileNotFoundError(f"{raw}/plan.json is missing: import an export first (python scripts/study.py import)")
    spec, models, plan_json = load_models(raw)
    costs, train_wall, eval_wall = cost_table(raw, plan_json)
    sections = [
        f"# {spec.name}",
        f"Rebuild: `python scripts/study_report.py {results}` (reads only `raw/`). Study: `configs/study/{spec.name}"
        f".yaml` (a copy is raw/spec.yaml); preset `configs/experiment/{spec.preset}.yaml`.",
        "## Setup",
        _setup(spec, models, raw),
        "## Summary",
        summary_table(spec, models) if models else "No recipe has been evaluated yet.",
        "Reading:",
        "\n".join(reading(spec, models)),
    ]
    if models:
        plot_loss_by_position(spec, models, results / "loss_by_position.png")
        plot_context(spec, models, results / "context.png")
        plot_passkey(spec, models, results / "passkey.png")
        sections += [
            "## Loss by absolute position",
            "Every target of the first "
            f"{spec.eval.length:,} tokens of each long held-out document, predicted with as much history as the "
            "model's context allows (sliding windows, stride context/"
            f"{spec.eval.stride_divisor}), averaged by absolute position in the document.",
            position_table(models),
            "![loss by position](loss_by_position.png)",
        ]
        if deltas := position_delta_table(spec, models):
            sections += [
                "### Change against the baseline, by position",
                "Each recipe's loss in each bin minus its baseline's (the recipe its Δ is taken against in the "
                "summary), seed by seed, then the mean over seeds (their range in brackets). Later parts of a "
                "document are easier for every model, so each model's own loss falls with position; in the "
                "difference that cancels, and what is left is what the recipe's longer history buys there.",
                deltas,
            ]
        if consecutive := consecutive_table(spec, models):
            sections += [
                "## Reading in consecutive windows",
                "The same targets read as a fixed-context model reads a long document at no extra cost: consecutive "
                "windows of the model's own context, so a 1K model restarts every 1,024 tokens and a target has 0 "
                "to context − 1 tokens of history (sliding windows give it at least 3/4 of the context, at "
                f"{spec.eval.stride_divisor}× the compute). A 16K model reads each document in one window, as above.",
                consecutive,
            ]
        sections += [
            "## Same tokens, different context",
            "Each model scored on the same targets with 1K, 2K, ... tokens of history, up to its own context: the "
            "weights fixed, only the context varied.",
            context_table(spec, models),
            "![context](context.png)",
            "## Passkey retrieval",
            f"{spec.eval.passkey_trials} trials per distance; accuracy = every key token is the model's argmax. "
            "'cut off': the needle lies beyond the model's context.",
            passkey_table(models),
            "![passkey](passkey.png)",
        ]
        sections += [
            "Mean loss of a key token (nats), which shows the partial retrieval that exact recall misses: a "
            "uniform guess among the 90,000 five-digit keys (two or three tokens each) costs about 4–6 nats a "
            "token, and a model whose context cuts the needle off pays 9–10.",
            passkey_table(models, measure="key_loss"),
        ]
        sections += _choice_section("passkey", models)
        if plot_passkey_choice(models, results / "passkey_choice.png"):
            sections.append("![passkey choice accuracy](passkey_choice.png)")
        for probe, title, description in PROBE_SECTIONS:
            if accuracy := passkey_table(models, probe):
                sections += [title, description, accuracy, passkey_table(models, probe, "key_loss")]
                sections += _choice_section(probe, models)
        if domains := domain_table(spec, models):
            sections += ["## Code and prose", f"Loss at positions ≥ {_k(spec.eval.first_bin)}.", domains]
    sections += [
        "## Cost",
        f"GPU wall time of every job (start-up included): training {train_wall / 60:.1f} min, evaluation "
        f"{eval_wall / 60:.1f} min.",
        costs,
        "## Commands",
        _commands(raw, plan_json),
    ]
    path = results / "report.md"
    path.write_text("\n\n".join(sections) + "\n")
    return path


def _setup(spec: Spec, models: list[Model], raw: Path) -> str:
    recipes_on: dict[str, list[str]] = {}  # device -> recipes evaluated there (their training ran there too)
    for name, group in by_recipe(spec, models).items():
        for device in sorted({m.evaluation["device"] for m in group}):
            recipes_on.setdefault(device, []).append(name)
    devices = [f"{d} ({', '.join(names)})" if len(recipes_on) > 1 else d for d, names in sorted(recipes_on.items())]
    first_config = next(iter(sorted(raw.glob("runs/**/config.yaml"))), None)
    config = yaml.safe_load(first_config.read_text()) if first_config else {}
    model = config.get("model", {})
    return "\n".join(
        [
            f"- model: {model.get('name')} ({model.get('n_layer')} layers, {model.get('d_model')} wide), data "
            f"{config.get('data', {}).get('name')}, {spec.max_steps} steps of "
            f"{config.get('train', {}).get('tokens_per_step')} tokens per recipe",
            f"- evaluation: {len(models[0].evaluation['doc_ids']) if models else 0} held-out documents of at least "
            f"{spec.eval.length + 1:,} tokens; seeds {list(spec.seeds)}; devices: {'; '.join(devices) or '–'}",
        ]
    )


def _commands(raw: Path, plan_json: dict) -> str:
    """Every training job that ran, as run (a job stopped for the budget and run again appears twice), and how
    each model was evaluated."""
    lines = ["```"]
    for name in plan_json["nodes"]:
        jobs = read_json(raw / "runs" / name / "study.json").get("jobs", [])
        lines += [" ".join(job["command"]) for job in jobs]
    study = plan_json["study"]
    lines.append(f"python scripts/study.py eval runs/{study}/<run> --study {study} --out runs/{study}/evals/<run>.json")
    return "\n".join([*lines, "```"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="results/<study>, holding raw/")
    args = parser.parse_args(argv)
    try:
        print(build_report(args.results))
    except (FileNotFoundError, ValueError) as error:  # a missing, truncated or foreign file: the message names it
        raise SystemExit(f"study_report.py: {error}") from error
    return 0


if __name__ == "__main__":
    sys.exit(main())
