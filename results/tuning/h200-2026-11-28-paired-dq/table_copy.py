"""Make .ab/NAME: a copy of the tree's flashgpt, kernels, scripts and model whose launch table takes one configuration
of one pass at the given T buckets (D = 64, bf16, causal, no dropout), for an `ab_kernels.py` A/B of the table alone.

    python results/tuning/h200-2026-11-28-paired-dq/table_copy.py dkdv_32x192 bwd_dkdv_hopper 32,192,4,4,128 8192,16384
"""

import json
import shutil
import sys
from pathlib import Path

name, kernel_pass, config, buckets = sys.argv[1:5]
block_m, block_n, num_warps, num_stages, maxnreg = map(int, config.split(","))
dest = Path(".ab") / name
shutil.rmtree(dest, ignore_errors=True)
for part in ("flashgpt", "kernels", "scripts", "model"):
    shutil.copytree(part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
shutil.copy("pyproject.toml", dest)
table_path = dest / "kernels" / "tuned_h100.json"
table = json.loads(table_path.read_text())
for bucket in buckets.split(","):
    key = f"{kernel_pass}/d64/bfloat16/causal/nodrop/T{bucket}"
    assert key in table[kernel_pass], key
    table[kernel_pass][key] = {"block_m": block_m, "block_n": block_n, "num_warps": num_warps,
                               "num_stages": num_stages, "tma": True, "maxnreg": maxnreg}  # fmt: skip
table_path.write_text(json.dumps(table, indent=1) + "\n")
print(f"{dest}: {kernel_pass} at T {buckets} -> {config}")
