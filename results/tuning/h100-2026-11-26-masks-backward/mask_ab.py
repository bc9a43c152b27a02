"""Masked fwd+bwd under backward variants, one process: split (tuned), fused, and other tiles for the split passes."""
import importlib.util, json, sys, os, torch
sys.path.insert(0, "scripts")
import bench_masks as bm
from flashgpt.kernels import attention_op, launch
from flashgpt.kernels.tuning import LaunchConfig

orig_config_for = launch.config_for
orig_schedule = attention_op.backward_schedule_for
VARIANTS = {
    "split": ({}, "split"),
    "fused": ({}, "fused"),
    "split_dkdv128x64_dq64x128": ({"bwd_dkdv": "128,64,8,2,tma", "bwd_dq": "64,128,8,2,tma"}, "split"),
    "split_dkdv64x128": ({"bwd_dkdv": "64,128,8,2,tma"}, "split"),
    "fwd128x64": ({"fwd": "128,64,8,2,tma"}, "split"),
}
def use(name):
    overrides, schedule = VARIANTS[name]
    def config_for(kernel_pass, *args, **kw):
        if kernel_pass in overrides:
            return LaunchConfig.parse(overrides[kernel_pass])
        return orig_config_for(kernel_pass, *args, **kw)
    launch.config_for = config_for
    attention_op.backward_schedule_for = lambda *a, **k: schedule
profile = bm.Profile("cuda", torch.bfloat16, 128, 4096, 1024)
rows = []
seq_lens = [int(x) for x in sys.argv[1].split(",")]
masks = sys.argv[2].split(",")
variants = sys.argv[3].split(",")
for T in seq_lens:
    batch = max(1, bm.TOKENS_PER_CALL // T)
    for mask in masks:
        case = bm.build_case(mask, T, batch, profile)
        for rep in range(2):
            for v in variants:
                use(v)
                row = bm.Row(mask, v, T, batch, 0.0, case.density, case.visible_pairs)
                bm.bench_row(row, lambda c=case: bm.flash_fn(c, 0.0, T, torch.bfloat16), profile)
                d = row.__dict__ | {"rep": rep}
                rows.append(d)
                print(f"T={T} {mask:13} {v:28} rep{rep} fwd {row.fwd_ms} fb {row.fwd_bwd_ms} tf {row.tflops}", flush=True)
json.dump(rows, open(os.environ["OUT"] + "/mask_ab.json", "w"), indent=1)
