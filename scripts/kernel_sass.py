"""Compile the attention kernels for Hopper (sm_90a) on a machine without a GPU and count what ptxas made of them.

Each pass is compiled at its tuned H100 configuration for one shape, exactly as a launch would specialise it (the
launch functions run with the launch itself replaced by Triton's compile-only warmup), then disassembled with the
cuobjdump/nvdisasm that ship with Triton. Per kernel: registers, spill stores/loads, shared memory, how many
instructions of each kind the machine code holds (matrix products, exp2 on the special-function unit, fp32 ALU,
conversions), and ptxas's warnings (`warn`: e.g. C7515, a wgmma pipeline serialised). A static A/B for a kernel
change costs no GPU time:

    python scripts/kernel_sass.py --head-dim 64 --seq-len 16384 --passes fwd,bwd_dq,bwd_dkdv
    python scripts/kernel_sass.py --passes fwd --dump /tmp/sass      # also writes each kernel's SASS
    python scripts/kernel_sass.py --passes fwd --same-as /tmp/sass   # after a refactor: is the code unchanged?
    python scripts/kernel_sass.py --passes bwd_fused_hopper --loops   # each warpgroup's step, instruction by kind

--same-as compares instruction streams; where they differ only in the offsets at which the kernel's parameters sit
in constant bank 0 (a refactor that reorders or regroups arguments), it says so and still exits 0. That the launch
then passes each value where the kernel now reads it, only running the kernel shows (the CPU tests for the Triton
passes, `scripts/bench_attention.py --check-only` and `scripts/bench_masks.py --check-only` on a GPU for all).

The counts are of the whole kernel (every loop copy: masked and mask-free runs), not of executed instructions.
"""

import argparse
import collections
import math
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

from flashgpt.kernels.tuning import HOPPER_PASSES, LaunchConfig

HOPPER = GPUTarget("cuda", 90, 32)
TRITON_PASSES = ("fwd", "bwd_dq", "bwd_dkdv", "bwd_fused")
# fwd_hopper, bwd_dq_hopper, bwd_dkdv_hopper, bwd_fused_hopper: the Gluon passes, at the table's configuration for
# the shape (dense; with dropout, those that draw the mask).
PASSES = (*TRITON_PASSES, *HOPPER_PASSES)
MASKS = ("none", "window", "documents", "blocks")
# Opcode families worth watching in an attention kernel: tensor-core products, the exp2 unit, fp32 arithmetic,
# fp32 -> bf16 packing, shuffles (row reductions) and spills.
FAMILIES = ("HGMMA", "MUFU", "FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "F2FP", "SHFL", "STL", "LDL")
# A SASS instruction line: its address, opcode (after any predicate) and operands.
INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)(.*)", flags=re.M)


class _HopperWithoutGpu:
    """The slice of Triton's driver interface that compiling (not launching) asks for."""

    def get_current_target(self) -> GPUTarget:
        return HOPPER

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def _triton_bin(tool: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool)


def _masks(kind: str, seq_len: int, tiles: tuple) -> object:
    """A FlashMask of one kind (none, window, documents, blocks) with schedules for the given tilings."""
    from flashgpt.kernels.tile_schedule import FlashMask

    if kind == "none":
        return None
    if kind == "window":
        return FlashMask.build(seq_len, seq_len, tiles, window_size=seq_len // 4)
    if kind == "documents":
        return FlashMask.build(seq_len, seq_len, tiles, document_ids=torch.arange(seq_len)[None] * 3 // seq_len)
    blocks = -(-seq_len // 128)
    block_mask = torch.rand(1, blocks, blocks, generator=torch.Generator().manual_seed(0)) < 0.3
    return FlashMask.build(seq_len, seq_len, tiles, block_mask=block_mask, block_size=128)


def compile_passes(
    passes: list[str], head_dim: int, seq_len: int, dropout: float, mask: str, config: LaunchConfig | None = None
) -> dict[str, object]:
    """{pass: compiled kernel} at the tuned Hopper configuration (or `config`, for every pass) for B = 1, H = 1,
    causal, bf16, with a mask."""
    driver.set_active(_HopperWithoutGpu())
    from flashgpt.kernels import launch  # after the driver, so that nothing asks for a real GPU
    from flashgpt.kernels.tile_schedule import tile_key
    from flashgpt.kernels.tuning import launch_config

    compiled: dict[str, object] = {}

    def compile_only(kernel, grid, *args, **constexprs) -> None:
        compiled[current] = kernel.warmup(*args, grid=grid, **constexprs)

    launch._launch = compile_only
    shape = (1, 1, seq_len, head_dim)
    q, k, v, o, do, dq, dk, dv = (torch.empty(shape, dtype=torch.bfloat16) for _ in range(8))
    lse, delta = torch.empty(shape[:3]), torch.empty(shape[:3])
    dq_acc = torch.empty(shape)
    params = launch.AttentionParams(True, dropout, 1 / math.sqrt(head_dim))

    def cfg(kernel_pass: str) -> LaunchConfig:
        if config is not None:
            return config
        return launch_config(kernel_pass, head_dim, "bfloat16", True, dropout > 0, seq_len, interpreting=False,
                             hopper=True)  # fmt: skip

    def hopper_cfg(kernel_pass: str) -> LaunchConfig | None:
        if config is not None:
            return config
        return launch.gluon_config(kernel_pass, head_dim, "bfloat16", True, dropout > 0, seq_len,
                                   window=mask == "window", documents=mask == "documents",
                                   block_size=128 if mask == "blocks" else None)  # fmt: skip

    gluon_tiles = tuple(tile_key(p, hopper_cfg(p)) for p in passes if p in HOPPER_PASSES and hopper_cfg(p))
    masks = _masks(mask, seq_len, tuple(tile_key(p, cfg(p)) for p in TRITON_PASSES) + gluon_tiles)
    for current in passes:
        if current == "fwd":
            launch.launch_forward(q, k, v, o, lse, params, cfg("fwd"), masks)
        elif current == "bwd_dq":
            launch.launch_dq(q, k, v, do, lse, delta, dq, params, cfg("bwd_dq"), masks, o=o)
        elif current in HOPPER_PASSES:
            hopper = hopper_cfg(current)
            if hopper is None:
                raise SystemExit(f"no {current} pass for D={head_dim}, T={seq_len}, dropout {dropout}, mask {mask}")
            gluon_masks = masks or launch.NO_MASKS
            if current == "fwd_hopper":
                launch.launch_forward_hopper(q, k, v, o, lse, params, hopper, gluon_masks)
            elif current == "bwd_dq_hopper":
                launch.launch_dq_hopper(q, k, v, do, o, lse, None, delta, dq, params, hopper, gluon_masks)
            elif current == "bwd_fused_hopper":
                launch.launch_fused_hopper(q, k, v, do, lse, delta, dk, dv, dq_acc, params, hopper, gluon_masks)
            else:
                launch.launch_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, params, hopper, gluon_masks)
        elif current == "bwd_dkdv":
            launch.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg("bwd_dkdv"), masks)
        else:
            launch.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, cfg("bwd_fused"), masks, dq_acc=dq_acc,
                               dq_reduce="tma")  # fmt: skip
    return compiled


def inspect(cubin: bytes, ptx: str) -> tuple[dict, str]:
    """(registers, stack frame (spills) and local memory in bytes, opcode-family counts, ptxas warnings and their
    text, the SASS text) of one compiled kernel. The warnings come from assembling its PTX again: e.g. C7515, a
    wgmma pipeline serialised."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        (Path(tmp) / "kernel.ptx").write_text(ptx)
        assembled = subprocess.run([_triton_bin("ptxas"), "-arch=sm_90a", str(Path(tmp) / "kernel.ptx"), "-o",
                                    str(Path(tmp) / "again.cubin")], capture_output=True, text=True)  # fmt: skip
        output = (assembled.stdout + assembled.stderr).splitlines()
        warnings = [line for line in output if "warning" in line.lower() or "Performance Loss" in line]
        usage = subprocess.run([_triton_bin("cuobjdump"), "--dump-resource-usage", str(path)], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
        sass = subprocess.run([_triton_bin("nvdisasm"), "-c", str(path)], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip
    # Spilled registers live in the stack frame (STACK), not in LOCAL, which counts local arrays.
    info = {key.lower(): int(value) for key, value in re.findall(r"(REG|STACK|LOCAL):(\d+)", usage)}
    opcodes = collections.Counter(m.group(2) for m in INSTRUCTION.finditer(sass))
    info.update({family: opcodes.get(family, 0) for family in FAMILIES})
    info["total"] = sum(opcodes.values())
    info["warn"] = len(warnings)
    info["warnings"] = warnings
    return info, sass


def product_loops(sass: str) -> list[dict]:
    """The innermost loops of a SASS listing that run matrix products (HGMMA), in order: a step of a warpgroup's
    walk, one per copy the compiler made (masked, mask-free). Each: its first and last address, its instruction
    count, and the count of each of FAMILIES. A loop is the span from a label to a branch back to it, the branch
    before the kernel's last EXIT: the slow paths placed after it (an mbarrier wait's retry) jump back into the
    code they left without making a loop of it."""
    labels, body = {}, []  # label -> index of the instruction after it; (address, opcode, operands) per instruction
    for line in sass.splitlines():
        if label := re.match(r"^\s*(\.L_x_\d+):", line):
            labels[label.group(1)] = len(body)
        elif op := INSTRUCTION.match(line):
            body.append((int(op.group(1), 16), op.group(2), op.group(3)))
    last_exit = max((i for i, (_, op, _) in enumerate(body) if op == "EXIT"), default=len(body))
    spans = []
    for end, (_, opcode, rest) in enumerate(body[:last_exit]):
        target = re.search(r"(\.L_x_\d+)", rest) if opcode == "BRA" else None
        start = labels.get(target.group(1), end + 1) if target else end + 1
        if start <= end and any(op == "HGMMA" for _, op, _ in body[start : end + 1]):
            spans.append((start, end))
    innermost = [(a, b) for a, b in spans if not any((c, d) != (a, b) and a <= c and d <= b for c, d in spans)]
    loops = []
    for start, end in sorted(set(innermost)):
        kinds = collections.Counter(op for _, op, _ in body[start : end + 1])
        loops.append({"first": body[start][0], "last": body[end][0], "instructions": end - start + 1,
                      **{family: kinds.get(family, 0) for family in FAMILIES}})  # fmt: skip
    return loops


PARAMETER = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")  # a load from constant bank 0, where the kernel's parameters sit


def parameters_moved(ours: list[str], theirs: list[str]) -> bool:
    """Whether two instruction streams are the same but for the constant-bank offsets they read parameters at."""
    return [PARAMETER.sub("c[0x0][param]", line) for line in ours] == [
        PARAMETER.sub("c[0x0][param]", line) for line in theirs
    ]


def instructions(sass: str) -> list[str]:
    """The instruction stream of a SASS listing, without addresses, labels' numbering or source-line comments."""
    lines = []
    for line in sass.splitlines():
        line = line.split("/*", 2)[-1] if line.lstrip().startswith("/*") else line
        if line.strip() and not line.lstrip().startswith("//"):
            lines.append(re.sub(r"\.L_x_\d+", ".L", line.split("*/", 1)[-1]).strip())
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=16384, help="picks the tuned configuration's T bucket")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--passes", default=",".join(PASSES[:3]), help=f"comma-separated, of {', '.join(PASSES)}")
    parser.add_argument("--mask", choices=MASKS, default="none", help="the mask the kernels are specialised for")
    parser.add_argument("--dump", type=Path, default=None, help="write <pass>.sass (and ptxas's warnings) here")
    parser.add_argument(
        "--config",
        type=LaunchConfig.parse,
        default=None,
        help="BLOCK_M,BLOCK_N,WARPS,STAGES[,tma][,maxnreg=N] for every pass instead of the tuned one",
    )
    parser.add_argument("--same-as", type=Path, default=None, help="a --dump folder: exit 1 unless the code matches")
    parser.add_argument("--loops", action="store_true", help="also each pass's loops that run matrix products")
    args = parser.parse_args()
    passes = args.passes.split(",")
    if unknown := set(passes) - set(PASSES):
        parser.error(f"unknown passes {sorted(unknown)}; choose from {', '.join(PASSES)}")

    compiled = compile_passes(passes, args.head_dim, args.seq_len, args.dropout, args.mask, args.config)
    columns = ("reg", "stack", "local", "shared", *FAMILIES, "total", "warn")
    print(f"sm_90a, D={args.head_dim}, T={args.seq_len}, dropout={args.dropout}, mask {args.mask}, causal, bf16")
    print(f"{'pass':10s}" + "".join(f"{c:>8s}" for c in columns))
    differ, moved = [], []
    for name, kernel in compiled.items():
        info, sass = inspect(kernel.asm["cubin"], kernel.asm["ptx"])
        info["shared"] = kernel.metadata.shared  # static and dynamic (pipeline buffers), bytes
        print(f"{name:10s}" + "".join(f"{info.get(c, 0):8d}" for c in columns))
        if args.loops:
            for loop in product_loops(sass):
                kinds = ", ".join(f"{family} {loop[family]}" for family in FAMILIES if loop[family])
                print(f"  loop {loop['first']:#07x}-{loop['last']:#07x}: {loop['instructions']} instructions ({kinds})")
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{name}.sass").write_text(sass)
            if info["warnings"]:
                (args.dump / f"{name}.warnings.txt").write_text("\n".join(info["warnings"]) + "\n")
        if args.same_as:
            ours, theirs = instructions(sass), instructions((args.same_as / f"{name}.sass").read_text())
            if ours != theirs:
                (moved if parameters_moved(ours, theirs) else differ).append(name)
    if args.same_as:
        if differ:
            print(f"machine code differs from {args.same_as}: {', '.join(differ)}")
        elif moved:
            print(f"machine code identical to {args.same_as} but for parameter offsets: {', '.join(moved)}")
        else:
            print(f"machine code identical to {args.same_as}")
        raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
