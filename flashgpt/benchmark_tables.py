"""The kernel benchmark's tables (scripts/bench_attention.py's JSON rows): fwd / bwd / fwd+bwd TFLOP/s per provider
and sequence length, and how they compare with the peers' numbers measured on the lent H100 (the anchors). Used by
the benchmark itself and by the run report (`flashgpt.training.run_report`)."""

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

# In a checkout: the peers' numbers on the lent H100, as the benchmark measures them (same shapes and FLOP formula).
ANCHORS = Path(__file__).resolve().parents[1] / "results" / "anchors" / "h100-attention.json"
# A row whose fwd+bwd took the CPU at least this share of the GPU's time for it to issue measured the host, not the
# kernels: the GPU waits between launches once the CPU needs longer than it does, and the margin covers the jitter
# of a host that runs close to that.
HOST_BOUND_SHARE = 0.9
HOST_BOUND_NOTE = "† host-bound: issuing one fwd+bwd took the CPU ≥ 90% of the GPU time its kernels need"


def host_bound(row: dict) -> bool:
    """Whether a timed row measured the CPU: its host time (`host_ms`) against its kernels' GPU time (`gpu_ms`,
    `flashgpt.gpu_timing`). Rows recorded without both never are."""
    host, gpu = row.get("host_ms"), row.get("gpu_ms")
    return row["status"] == "ok" and host is not None and gpu is not None and host >= HOST_BOUND_SHARE * gpu


def tflops_cell(tflops: dict[str, float]) -> str:
    """A row's fwd / bwd / fwd+bwd TFLOP/s, "-" for a pass not measured."""
    return " / ".join("-" if math.isnan(tflops[k]) else f"{tflops[k]:.0f}" for k in ("fwd", "bwd", "fwd_bwd"))


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return {"oom": "OOM", "skipped": "unsupported"}.get(row["status"], "error")
    mem = f" ({row['peak_extra_gib']:.2f} GiB)" if row["peak_extra_gib"] is not None else ""
    return tflops_cell(row["tflops"]) + mem + (" †" if host_bound(row) else "")


def _anchor_ratio(rows: list[dict], anchors: dict, anchor_provider: str) -> float | None:
    """Geometric mean over T of measured fwd+bwd TFLOP/s / the anchor's, where both exist."""
    ratios = []
    for row in rows:
        key = f"d{row['head_dim']}_p{row['dropout']}"
        anchor = anchors.get(key, {}).get(anchor_provider, {}).get(str(row["seq_len"]))
        if row["status"] == "ok" and anchor:
            ratios.append(row["tflops"]["fwd_bwd"] / anchor[2])
    return math.exp(statistics.fmean(math.log(r) for r in ratios)) if ratios else None


def _anchor_cell(provider: str, rows: list[dict], anchors: dict) -> str:
    targets = ("sdpa_flash", "sdpa_cudnn") if provider == "flash" else (provider,)
    parts = [(t, _anchor_ratio(rows, anchors, t)) for t in targets]
    return ", ".join(f"{r:.2f}× {t}" for t, r in parts if r is not None)


def markdown_tables(rows: Sequence[dict], anchors: dict | None = None) -> str:
    """One table per (head dim, dropout): fwd / bwd / fwd+bwd TFLOP/s (peak extra GiB), as in the anchors.
    With `anchors`, a last column: fwd+bwd vs the anchors (geometric mean over T; flash vs FA2 and cuDNN). Cells
    that measured the host are marked † (`host_bound`), with a note under their table."""
    out = []
    for head_dim, p in sorted({(r["head_dim"], r["dropout"]) for r in rows}):
        section = [r for r in rows if (r["head_dim"], r["dropout"]) == (head_dim, p)]
        seq_lens = sorted({r["seq_len"] for r in section})
        providers = list(dict.fromkeys(r["provider"] for r in section))
        extra = ["fwd+bwd vs H100 anchors"] if anchors else []
        header = ["provider", *(f"T={t}" for t in seq_lens), *extra]
        out += [
            f"**head dim {head_dim}, causal, dropout {p}** — fwd / bwd / fwd+bwd TFLOP/s (peak extra memory)",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for provider in providers:
            mine = [r for r in section if r["provider"] == provider]
            by_t = {r["seq_len"]: r for r in mine}
            cells = [_cell(by_t.get(t)) for t in seq_lens]
            cells += [_anchor_cell(provider, mine, anchors)] if anchors else []
            out.append(f"| {provider} | " + " | ".join(cells) + " |")
        out += ["", HOST_BOUND_NOTE, ""] if any(host_bound(r) for r in section) else [""]
    return "\n".join(out)


def anchors_for(device: str, dtype: str, tokens_per_call: int) -> dict | None:
    """The anchors apply only to the same GPU model, dtype and shapes."""
    if "H100" not in device or dtype != "torch.bfloat16" or tokens_per_call != 16384:
        return None
    return json.loads(ANCHORS.read_text())["kernels"]
