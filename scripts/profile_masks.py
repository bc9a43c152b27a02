"""Where a masked call's time goes: which tiles it computes, what each costs against the dense kernel, tile sizes.

For each mask of bench_masks.py at one T (default 4K; B = 16384 // T, H = 12, D = 64, bf16, causal, no dropout):

- census: the forward's tile pairs (its row tile × column tile), classed from `dense_mask` as empty, partial (some
  pairs visible) or full. The kernel computes the partial and full ones and pays the element-wise mask on the
  partial ones. tile density = computed tiles / the dense causal kernel's; pair density = visible / causal pairs.
  Where tile density is far above pair density, most of the work kept is on pairs the mask removes.
- time: fwd and fwd+bwd wall time (triton's do_bench, median; host-bound calls show their host time), each of our
  kernels' GPU time per fwd+bwd (torch.profiler), and the GPU time per computed tile over the dense kernel's at the
  same T (1.0: a masked tile costs what a dense one does).
- tile caps: the same call through the Triton passes (the Gluon passes, which take masked calls on a Hopper GPU,
  taken away) with every pass's tiles capped at --tile-caps rows and columns (the masks' schedules rebuilt for
  them), in the same process. The Gluon passes' tiles under masks are A/B'd in
  `results/tuning/h200-2026-11-27-mask-tiles/`.

    python scripts/profile_masks.py --seq-len 4096 --out $OUT/profile_masks.json
    ncu --clock-control none -k regex:flash_ --launch-skip 60 --launch-count 4 --section SpeedOfLight \
        --section Occupancy --section LaunchStats python scripts/profile_masks.py --masks documents --no-caps
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton.testing
from bench_masks import HEAD_DIM, HEADS, MASKS, TOKENS_PER_CALL, Profile, build_case, flash_fn

from flashgpt.attention_masks import dense_mask
from flashgpt.command_line import command_line, csv_list, write_json
from flashgpt.kernels import launch

TUNED_CONFIG_FOR = launch.config_for
GLUON_KERNELS = {  # the Gluon passes that take masked calls on a Hopper GPU, by their names in `launch`
    f"flash_{name}_kernel": getattr(launch, f"flash_{name}_kernel") for name in launch.GLUON_PASSES.values()
}
PROFILE = Profile("cuda", torch.bfloat16, block_size=128, check_seq_len=4096, dropout_check_seq_len=1024)


def census(seq_len: int, kwargs: dict, row_tile: int, col_tile: int) -> dict[str, int]:
    """Tile pairs of a (row_tile × col_tile) tiling that are empty, partial or full under the masks (all batch
    elements and mask heads together), from the exact dense mask."""
    visible = dense_mask(seq_len, seq_len, causal=True, device="cuda", **kwargs)  # (B or 1, H or 1, T, T)
    b, h = visible.shape[:2]
    rows, cols = math.ceil(seq_len / row_tile), math.ceil(seq_len / col_tile)
    padded = torch.zeros(b, h, rows * row_tile, cols * col_tile, dtype=torch.int32, device="cuda")
    padded[..., :seq_len, :seq_len] = visible
    counts = padded.view(b, h, rows, row_tile, cols, col_tile).sum(dim=(3, 5))
    size = torch.full_like(counts, row_tile * col_tile)  # ragged edge tiles are never full here: T % tile == 0
    return {
        "empty": int((counts == 0).sum()),
        "partial": int(((counts > 0) & (counts < size)).sum()),
        "full": int((counts == size).sum()),
        "instances": b * h,
    }


def timed(fn, seq_len: int) -> tuple[float, float, dict[str, float]]:
    """(fwd ms, fwd+bwd ms, GPU ms per fwd+bwd of each of our kernels) of fn on fresh inputs of this T. The wall
    times include host time where the call is bound by it; the kernel times (torch.profiler) do not."""
    batch = max(1, TOKENS_PER_CALL // seq_len)
    q, k, v = (
        torch.randn(batch, HEADS, seq_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn_like(q)
    fn(q, k, v).backward(grad)  # compile outside the timing

    def fwd_bwd() -> None:
        fn(q, k, v).backward(grad)

    fwd = triton.testing.do_bench(lambda: fn(q, k, v), warmup=25, rep=100, return_mode="median")
    both = triton.testing.do_bench(fwd_bwd, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
    calls = 20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fwd_bwd()
        torch.cuda.synchronize()
    kernels = {
        event.key: event.device_time_total / calls / 1e3
        for event in prof.key_averages()
        if event.key.startswith("flash_") and event.device_time_total > 0
    }
    return fwd, both, kernels


def capped_tiles(cap: int | None) -> None:
    """Make every Triton launch configuration's tiles at most cap rows and columns, or with a negative cap at least
    −cap, and take the Gluon passes away so that the Triton ones take the calls (None: the tuned passes)."""

    def config_for(*args, **kwargs):
        cfg = TUNED_CONFIG_FOR(*args, **kwargs)
        if cap < 0:
            return replace(cfg, block_m=max(cfg.block_m, -cap), block_n=max(cfg.block_n, -cap))
        return replace(cfg, block_m=min(cfg.block_m, cap), block_n=min(cfg.block_n, cap))

    launch.config_for = TUNED_CONFIG_FOR if cap is None else config_for
    for name, kernel in GLUON_KERNELS.items():
        setattr(launch, name, kernel if cap is None else None)


def forward_tiles(case, seq_len: int) -> tuple[str, int, int]:
    """(pass, row tile, column tile) of the forward that takes the case's calls: the Gluon one where
    `launch.hopper_launch_config` gives it the masks, else the Triton one."""
    from flashgpt.kernels import flash_mask

    mask = flash_mask(seq_len, seq_len, head_dim=HEAD_DIM, dtype=torch.bfloat16, **case.flash_kwargs)
    q = torch.empty(1, HEADS, seq_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    params = launch.AttentionParams(True, 0.0, HEAD_DIM**-0.5)
    if (cfg := launch.hopper_launch_config("fwd_hopper", q, q, q, q, None, params, mask)) is not None:
        return "fwd_hopper", cfg.block_m, cfg.block_n
    cfg = launch.config_for("fwd", HEAD_DIM, torch.bfloat16, q.device, True, False, seq_len)
    return "fwd", cfg.block_m, cfg.block_n


def compiled_kernels() -> list[dict]:
    """Registers, spills and shared memory of every attention kernel compiled so far (all mask variants)."""
    from flashgpt.kernels import flash_bwd, flash_fwd

    out = []
    triton_kernels = (flash_fwd.flash_fwd_kernel, flash_bwd.flash_bwd_dq_kernel, flash_bwd.flash_bwd_dkdv_kernel)
    for kernel in (*triton_kernels, *(k for k in GLUON_KERNELS.values() if k is not None)):
        for device_cache in kernel.device_caches.values():
            for key, compiled in device_cache[0].items():
                out.append({
                    "kernel": kernel.fn.__name__, "regs": getattr(compiled, "n_regs", None),
                    "spills": getattr(compiled, "n_spills", None),
                    "shared_kib": getattr(compiled.metadata, "shared", 0) / 1024, "key": str(key),
                })  # fmt: skip
    return out


def profile_mask(name: str, seq_len: int, caps: list[int | None], dense: dict | None) -> dict:
    batch = max(1, TOKENS_PER_CALL // seq_len)
    case = build_case(name, seq_len, batch, PROFILE)
    row: dict = {"mask": name, "seq_len": seq_len, "batch": batch, "pair_density": case.density, "runs": []}
    for cap in caps:
        capped_tiles(cap)
        forward, rows, cols = forward_tiles(case, seq_len)
        tiles = census(seq_len, case.flash_kwargs, rows, cols)
        fwd, both, kernels = timed(flash_fn(case, 0.0, seq_len, torch.bfloat16), seq_len)
        gpu = sum(kernels.values())
        run = {"cap": cap, "forward": forward, "fwd_tile": [rows, cols], "census": tiles, "fwd_ms": fwd,
               "fwd_bwd_ms": both, "kernel_ms": kernels, "gpu_ms": gpu}  # fmt: skip
        computed = (tiles["partial"] + tiles["full"]) * (batch * HEADS // tiles["instances"])
        run["computed_tiles"] = computed
        if dense is not None and cap is None:
            dense_run = dense["runs"][0]
            run["tile_density"] = computed / dense_run["computed_tiles"]
            run["cost_per_tile_vs_dense"] = (gpu / computed) / (dense_run["gpu_ms"] / dense_run["computed_tiles"])
        row["runs"].append(run)
        line = f"T={seq_len} {name:>12} cap={cap}: {forward} tile {rows}x{cols}, {tiles}, "
        line += f"fwd {fwd:.3f} ms, fwd+bwd {both:.3f} ms (kernels {gpu:.3f} ms: "
        line += ", ".join(f"{name} {ms:.3f}" for name, ms in kernels.items()) + ")"
        if "tile_density" in run:
            line += f", tile density {run['tile_density']:.2f} (pairs {case.density:.2f}), "
            line += f"cost per tile {run['cost_per_tile_vs_dense']:.2f}x dense"
        print(line, flush=True)
    capped_tiles(None)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--masks", type=csv_list(str), default=list(MASKS))
    parser.add_argument("--tile-caps", type=csv_list(int), default=[64, 32], help="negative: at least that many")
    parser.add_argument("--no-caps", action="store_true", help="the tuned tiles only (e.g. under ncu)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    caps: list[int | None] = [None] if args.no_caps else [None, *args.tile_caps]
    command = command_line("profile_masks.py", sys.argv[1:])
    rows = [profile_mask("dense", args.seq_len, [None], None)]
    for name in (m for m in args.masks if m != "dense"):
        rows.append(profile_mask(name, args.seq_len, caps, rows[0]))
        if args.out:  # after every mask, so a job stopped at its time limit keeps what it measured
            report = {"device": torch.cuda.get_device_name(), "command": command, "rows": rows}
            write_json(Path(args.out), report | {"kernels": compiled_kernels()})


if __name__ == "__main__":
    main()
