"""Launching a compiled Triton kernel without Triton's per-call argument binding.

`kernel[grid](*args, **constexprs)` re-derives on every call what the compiled kernel was specialised for: it
binds ~70 arguments, classifies each one (dtype, 16-byte alignment, integer width, == 1), builds a cache key and
looks the kernel up, about 60 µs of host time per launch on an H200 host at our argument counts. Once a call with a
given specialisation has gone through Triton, `FastLauncher` keeps the compiled kernel under a key of exactly the
properties Triton specialises on, and later calls with the same key launch it directly (a few µs).

Key per positional argument: a tensor's dtype and whether its address is 16-byte aligned; an int's value, or, for
the kernel's `do_not_specialize` arguments (seeds, offsets: different on every call), only its integer width;
the type of anything else (float, None). Constexpr keyword arguments are part of the key by value. Launch hooks
(profilers) and the interpreter always take Triton's own path.
"""

from collections.abc import Callable

import torch
from triton import knobs

_INT32_RANGE = range(-(2**31), 2**31)


def _int_width(value: int) -> int:
    """Triton's integer argument types: i32 inside the int32 range, u64 from 2**63, i64 otherwise."""
    return 32 if value in _INT32_RANGE else 65 if value >= 2**63 else 64


class FastLauncher:
    """`launcher(grid, *args, **constexprs)` ≡ `kernel[grid](*args, **constexprs)` on the current CUDA stream."""

    MAX_ENTRIES = 256  # specialisations kept; past that, calls take Triton's path (still correct, just slower)

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        names = kernel.arg_names
        self.unspecialized = frozenset(p.num for p in kernel.params if p.do_not_specialize)
        self.names = names
        self._entries: dict[tuple, tuple[Callable, object, object, tuple[str, ...]]] = {}

    def _key(self, args: tuple, constexprs: dict) -> tuple:
        # One comprehension over the ~60 arguments (a per-argument loop was 17 µs of an H100 host's time per launch).
        key = [
            (arg.dtype, arg.data_ptr() % 16 == 0) if isinstance(arg, torch.Tensor) else arg if type(arg) is int
            else type(arg)
            for arg in args
        ]  # fmt: skip
        for i in self.unspecialized:
            if i < len(args) and type(args[i]) is int:
                key[i] = ("width", _int_width(args[i]))
        return (torch.cuda.current_device(), tuple(key), tuple(constexprs.items()))

    def __call__(self, grid: tuple[int, ...], *args, **constexprs) -> None:
        if knobs.runtime.launch_enter_hook.calls or knobs.runtime.launch_exit_hook.calls:
            self.kernel[grid](*args, **constexprs)
            return
        key = self._key(args, constexprs)
        entry = self._entries.get(key)
        if entry is None:
            compiled = self.kernel[grid](*args, **constexprs)  # compiles on first use, launches
            if len(self._entries) < self.MAX_ENTRIES:
                # The launcher takes every kernel parameter in order; options (num_warps, ...) are not parameters.
                tail = tuple(name for name in self.names[len(args) :])
                self._entries[key] = (compiled.run, compiled.function, compiled.packed_metadata, tail)
            return
        run, function, metadata, tail = entry
        grid_y = grid[1] if len(grid) > 1 else 1
        grid_z = grid[2] if len(grid) > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(key[0])
        constexpr_args = [constexprs[name] for name in tail]
        run(grid[0], grid_y, grid_z, stream, function, metadata, None, None, None, *args, *constexpr_args)
