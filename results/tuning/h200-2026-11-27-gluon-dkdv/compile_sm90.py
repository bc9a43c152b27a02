"""Compile the Gluon dK/dV pass for sm_90a on a machine without a GPU and print what ptxas made of it (registers,
spills, opcode counts, warnings such as C7515), as `scripts/kernel_sass.py` does for the Triton passes:

    PYTHONPATH=.:scripts python results/tuning/h200-2026-11-27-gluon-dkdv/compile_sm90.py 64 64,64,4,3 1

Arguments: head dim, BLOCK_M,BLOCK_N,WARPS,STAGES, causal (0/1), and optionally the module beside this script
(default flash_bwd_dkdv_one_warpgroup; the kept, warp-specialised pass compiles through scripts/kernel_sass.py
--passes bwd_dkdv_hopper) and maxnreg. T = 4096, B = H = 1, bf16.
"""

import importlib
import math
import sys
from pathlib import Path

import torch
from kernel_sass import _HopperWithoutGpu, inspect
from triton.runtime import driver

driver.set_active(_HopperWithoutGpu())
sys.path.insert(0, str(Path(__file__).parent))

head_dim = int(sys.argv[1])
block_m, block_n, warps, stages = (int(x) for x in sys.argv[2].split(","))
causal = bool(int(sys.argv[3]))
module = importlib.import_module(sys.argv[4] if len(sys.argv) > 4 else "flash_bwd_dkdv_one_warpgroup")
options = {"maxnreg": int(sys.argv[5])} if len(sys.argv) > 5 else {}
seq_len = 4096
shape = (1, 1, seq_len, head_dim)
q, k, v, do, dk, dv = (torch.empty(shape, dtype=torch.bfloat16) for _ in range(6))
lse, delta = torch.empty(shape[:3]), torch.empty(shape[:3])
strides = [s for t in (q, k, v, do, dk, dv) for s in t.stride()[:3]]
compiled = module.flash_bwd_dkdv_hopper_kernel.warmup(
    q, k, v, do, lse, delta, dk, dv, *strides, 1, seq_len, seq_len, 1 / math.sqrt(head_dim),
    grid=(seq_len // block_n, 1), HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
    num_warps=warps, **options,
)  # fmt: skip
info, _ = inspect(compiled.asm["cubin"], compiled.asm["ptx"])
info["shared"] = compiled.metadata.shared
print(info)
