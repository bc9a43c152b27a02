"""The kernels as ptxas builds them for Hopper (sm_90a), checked on a machine without a GPU (`scripts/kernel_sass.py`:
Triton compiles for the H100 target and its bundled ptxas assembles): no register spills (a stack frame), and no
ptxas warning, whose usual one, C7515, says a wgmma pipeline was serialised (loop bounds computed through selects once
did that to the dense backward and cost it 9-13%). Cases: the passes the launch table runs for these shapes (the
fused backward where the table picks it, at D = 64, and the Gluon forward, dQ, dK/dV and fused backward passes),
with and without dropout and masks (for the Gluon passes: a causal sliding window, documents, block masks). The
Gluon passes have no interpreter path, so this compile is what the CPU suite checks of them; their numerics are
checked on the GPU (`scripts/bench_attention.py`, `scripts/bench_masks.py`, and for every mask and combination
`results/tuning/h200-2026-11-27-gluon-blocks/check_masks.py`)."""

import os
import subprocess
import sys

import pytest

from training_runs import REPO

CASES = {  # kernel_sass.py's arguments
    # the fused backward there: two math warpgroups whose dQ a third sums
    "D64 16K": "--head-dim 64 --seq-len 16384 "
    "--passes fwd,bwd_dq,bwd_dkdv,bwd_fused,fwd_hopper,bwd_dq_hopper,bwd_dkdv_hopper,bwd_fused_hopper",
    "D64 4K dropout documents": "--head-dim 64 --seq-len 4096 --dropout 0.1 --mask documents "
    "--passes fwd,bwd_dq,bwd_dkdv,bwd_fused",
    "D128 16K blocks": "--head-dim 128 --seq-len 16384 --mask blocks --passes fwd,bwd_dq,bwd_dkdv",
    "D128 4K Gluon": "--head-dim 128 --seq-len 4096 "
    "--passes fwd_hopper,bwd_dq_hopper,bwd_dkdv_hopper,bwd_fused_hopper",  # the fused one with a dQ warpgroup
    "D64 8K Gluon dK/dV": "--head-dim 64 --seq-len 8192 --passes bwd_dkdv_hopper",  # three math warpgroups
    "D64 4K Gluon dropout": "--head-dim 64 --seq-len 4096 --dropout 0.1 "
    "--passes bwd_dq_hopper,bwd_dkdv_hopper,bwd_fused_hopper",
    "D128 4K Gluon dropout": "--head-dim 128 --seq-len 4096 --dropout 0.1 "
    "--passes fwd_hopper,bwd_dq_hopper,bwd_dkdv_hopper,bwd_fused_hopper",
    "D128 16K Gluon dropout forward": "--head-dim 128 --seq-len 16384 --dropout 0.1 --passes fwd_hopper",
    "D64 8K Gluon window": "--head-dim 64 --seq-len 8192 --mask window "
    "--passes fwd_hopper,bwd_dq_hopper,bwd_dkdv_hopper,bwd_fused_hopper",
    "D128 4K Gluon window dropout": "--head-dim 128 --seq-len 4096 --mask window --dropout 0.1 "
    "--passes bwd_dq_hopper,bwd_dkdv_hopper",
    "D64 16K Gluon documents": "--head-dim 64 --seq-len 16384 --mask documents "
    "--passes fwd_hopper,bwd_dq_hopper,bwd_dkdv_hopper,bwd_fused_hopper",
    "D64 8K Gluon blocks": "--head-dim 64 --seq-len 8192 --mask blocks "
    "--passes fwd_hopper,bwd_dq_hopper,bwd_dkdv_hopper",
    # a dQ warpgroup, which block masks take past 16K (the split passes up to it)
    "D64 32K Gluon blocks": "--head-dim 64 --seq-len 32768 --mask blocks --passes bwd_fused_hopper",
    "D128 4K Gluon documents": "--head-dim 128 --seq-len 4096 --mask documents "
    "--passes fwd_hopper,bwd_dq_hopper,bwd_dkdv_hopper",  # the forward's two math warpgroups under a mask
    # with dropout under masks: the forward on 64 x 64 tiles at maxnreg 80, dQ on 64-key tiles, the fused backward on
    # 32-query tiles (one math warpgroup's 32 x 64 up to 8K, 32 x 128 with a dQ warpgroup past it)
    "D64 16K Gluon documents dropout": "--head-dim 64 --seq-len 16384 --mask documents --dropout 0.1 "
    "--passes fwd_hopper,bwd_dq_hopper,bwd_fused_hopper",
    "D64 8K Gluon window dropout": "--head-dim 64 --seq-len 8192 --mask window --dropout 0.1 --passes bwd_fused_hopper",
    "D64 16K Gluon blocks dropout": "--head-dim 64 --seq-len 16384 --mask blocks --dropout 0.1 "
    "--passes bwd_fused_hopper",
}


# Known spills (bytes of stack the pass may take; more is a regression). The Triton passes sit at 255 registers: the
# fused backward with documents and dropout spills in its masked loops, and the D = 128 dK/dV pass under a block mask
# took 96 bytes before its masked runs became one loop (results/tuning/h100-2026-11-26-one-loop/). The Gluon dK/dV
# pass at D = 128 stores a few addresses before its walk and reloads them after it, never inside it; with dropout
# (the mask's counters and stream beside dK and dV) it reloads one word a query tile inside the walk, at both head
# dims (results/tuning/h200-2026-11-27-dkdv-dropout/). The Gluon dQ pass with dropout at D = 64 keeps two words
# across its walk. Under a sliding window the dK/dV pass keeps the bounds of its runs (stored before the walk,
# reloaded after each loop, never inside one). At D = 128 under documents it spills inside its walk too (48 bytes
# since document ids reach the kernels as int32, 80 before; unmeasured: the next thing to look at there). The Gluon
# fused backward with a dQ warpgroup takes 8 bytes under documents (24 with int64 ids; at 64K it still ran 1.10x the
# split passes: results/tuning/h200-2026-11-28-dq-warpgroup-all/); with
# dropout under masks it runs 32-query tiles, on which it spills nothing but 16 bytes under a block mask with a dQ
# warpgroup (on 64-query tiles its masked steps spilled 112-176 bytes: results/tuning/h200-2026-11-27-masked-dropout/,
# and with a dQ warpgroup 16-112: results/tuning/h200-2026-11-28-masked-dq-warpgroup/).
KNOWN_SPILLS = {
    ("D64 4K dropout documents", "bwd_fused"): 72,
    ("D128 16K blocks", "bwd_dkdv"): 16,
    ("D128 4K Gluon", "bwd_dkdv_hopper"): 24,  # two warpgroups at 248 and 232: addresses kept across the walk
    ("D64 4K Gluon dropout", "bwd_dq_hopper"): 8,
    ("D64 4K Gluon dropout", "bwd_dkdv_hopper"): 8,
    ("D128 4K Gluon dropout", "bwd_dkdv_hopper"): 16,
    ("D64 8K Gluon window", "bwd_dkdv_hopper"): 24,
    ("D128 4K Gluon window dropout", "bwd_dkdv_hopper"): 24,
    ("D128 4K Gluon documents", "bwd_dkdv_hopper"): 48,
    ("D64 16K Gluon documents", "bwd_fused_hopper"): 8,
    ("D64 16K Gluon blocks dropout", "bwd_fused_hopper"): 16,
    ("D128 16K Gluon dropout forward", "fwd_hopper"): 8,  # 128 x 128 tiles with the mask's draws: one word
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_hopper_kernels_never_serialise_their_matrix_pipelines_nor_spill_beyond_the_known_cases(case):
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # real compilation
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, "scripts/kernel_sass.py", *CASES[case].split()]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header, *rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    table = {row[0]: dict(zip(header[1:], map(int, row[1:]), strict=True)) for row in rows}
    assert set(table) == set(CASES[case].split()[-1].split(","))
    for kernel_pass, counts in table.items():
        allowed = KNOWN_SPILLS.get((case, kernel_pass), 0)
        assert counts["stack"] <= allowed and counts["local"] == 0, f"{case}, {kernel_pass}: spills ({counts})"
        assert counts["warn"] == 0, f"{case}, {kernel_pass}: ptxas warned (run the command to see it): {command}"
        assert counts["HGMMA"] > 0, f"{case}, {kernel_pass}: no wgmma at all ({counts})"


ROTARY_PTX = """
import re, sys, torch
sys.path.insert(0, "scripts")
from kernel_sass import _HopperWithoutGpu
from triton.runtime import driver
driver.set_active(_HopperWithoutGpu())
from flashgpt.kernels import rotary
B, T, H, D = 2, 1024, 12, 64
dq, dk, dv = (torch.empty(B, H, T, D, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
dqkv = torch.empty(B, T, 3, H, D, dtype=torch.bfloat16)
strides = [s for g in (dq, dk, dv) for s in g.stride()[:3]]
kernel = rotary.rotary_qkv_grad_kernel.warmup(dq, dk, dv, torch.empty(T, D), torch.empty(T, D), dqkv, T, H, *strides,
    HEAD_DIM=D, BLOCK_T=64, BLOCK_D=64, num_warps=4, grid=(16, B * H))
print(" ".join(re.findall(r"(?:ld|st)\\.global[.\\w]*", kernel.asm["ptx"])))
"""


def test_the_rotary_gradient_kernel_moves_whole_16_byte_vectors():
    """kernels/rotary.py as Triton compiles it for sm_90a (D = 64, bf16, the attention's token-major gradients): every
    global load and store, the partner columns' (i + D/2) mod D included, is a 16-byte vector, and there are as many
    as the tile needs: per thread, 4 of each of dq, dk, their partners, dv and 3 stores of 4 (8 bf16 each), and 8 of
    each fp32 table."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}  # real compilation
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", ROTARY_PTX], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    accesses = proc.stdout.split()
    assert set(accesses) == {"ld.global.v4.b32", "st.global.v4.b32"}, set(accesses)
    assert accesses.count("ld.global.v4.b32") == 5 * 4 + 2 * 8 and accesses.count("st.global.v4.b32") == 3 * 4


SASS_WITH_LOOPS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], RZ ;
        /*0020*/              @!P0 BRA `(.L_x_9) ;
.L_x_1:
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0040*/                   MUFU.EX2 R3, R3 ;
        /*0050*/                   FFMA R4, R3, R5, R6 ;
        /*0060*/               @P1 BRA `(.L_x_1) ;
        /*0070*/                   ISETP.GE.AND P2, PT, R7, R8, PT ;
        /*0080*/               @P2 BRA `(.L_x_0) ;
.L_x_2:
        /*0090*/                   FADD R9, R9, R10 ;
        /*00a0*/               @P3 BRA `(.L_x_2) ;
.L_x_3:
        /*00b0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*00c0*/                   FMUL R11, R11, R12 ;
        /*00d0*/                   BRA `(.L_x_3) ;
        /*00e0*/                   EXIT ;
.L_x_9:
        /*00f0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], RZ ;
        /*0100*/               @!P0 BRA `(.L_x_9) ;
        /*0110*/                   BRA `(.L_x_1) ;
"""


def test_kernel_sass_finds_the_innermost_loops_that_run_matrix_products():
    """`kernel_sass.py --loops`: the innermost loops with an HGMMA (here a product loop nested in an outer one, and a
    second product loop), not the outer loop, not a loop without products, and not a slow path after the last EXIT
    that jumps back into the code it left."""
    from kernel_sass import product_loops

    loops = product_loops(SASS_WITH_LOOPS)
    assert [(loop["first"], loop["last"], loop["instructions"]) for loop in loops] == [(0x30, 0x60, 4), (0xB0, 0xD0, 3)]
    assert (loops[0]["HGMMA"], loops[0]["MUFU"], loops[0]["FFMA"], loops[0]["FMUL"]) == (1, 1, 1, 0)
    assert (loops[1]["HGMMA"], loops[1]["FMUL"]) == (1, 1)
