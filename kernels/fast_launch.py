"""Launching a compiled Triton kernel without Triton's per-call argument binding.

`kernel[grid](*args, **constexprs)` re-derives on every call what the compiled kernel was specialised for: it
binds ~70 arguments, classifies each one (dtype, 16-byte alignment, integer width, == 1), builds a cache key and
looks the kernel up, about 60 µs of host time per launch on an H200 host at our argument counts. Once a call with a
given specialisation has gone through Triton, `FastLauncher` keeps the compiled kernel under a key of exactly the
properties Triton specialises on, and later calls with the same key launch it directly (a few µs).

Key per positional argument: a tensor's dtype and whether its address is 16-byte aligned; a host-made tensor
descriptor's element type, tile shape, shared-memory layout and padding; an int's value, or, for the kernel's
`do_not_specialize` arguments (seeds, offsets: different on every call), only its integer width; a tuple (a
tensor's strides, a mask's tensors and strides) item by item, its ints by value, as Triton specialises every int in
it, and its tensors as tensors are keyed; a float by its type alone, None as it is; with the constexpr keyword
arguments (by value) and the current device, that is the key. Which positions hold tensors, unspecialised ints,
floats, descriptors and tuples follows from the arguments' types, so it is worked out once per tuple of types and
each call only visits those positions (a comprehension over every argument cost an H100 host ~35 µs per launch).
Launch hooks (profilers) and the interpreter always take Triton's own path.

`bind` goes one step further for a caller that launches the same kernel with the same arguments but a few (its
tensors, a seed): it returns a `BoundLaunch` holding the whole argument list of the compiled launcher's C entry
point, whose call only fills in those (top-level arguments; tensors inside a tuple are bound by address). A
host-made tensor descriptor becomes there what Triton's Python launcher makes of it on every call
(`make_tensordesc_arg`): a TMA descriptor (CUtensorMap) of the tensor's address, then its shape and strides. A bound
launch fills the shape and strides in once and each address's TMA descriptor once (`TensorMaps`): a launch of the
fused backward, with seven descriptors, cost ~50 µs of host time through Triton's launcher.

The direct path leans on Triton internals (the compiled kernel's `run`, `function` and `packed_metadata`, and the
launcher's argument order), checked on the Triton release named below. With any other release every launch takes
Triton's own path: still correct, only slower per call.
"""

import warnings
from collections.abc import Callable, Sequence

import torch
import triton
from triton import knobs

try:  # the launcher's layout of a TMA descriptor's element type (Triton releases without host descriptors lack it)
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
except ImportError:
    TMA_DTYPE_DEVICE_TO_HOST = {}

try:  # host-made tensor descriptors, Triton's and Gluon's (releases without them have none to key)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonDescriptor
    from triton.tools.tensor_descriptor import TensorDescriptor as _TritonDescriptor

    DESCRIPTOR_TYPES: tuple[type, ...] = (_GluonDescriptor, _TritonDescriptor)
except ImportError:
    DESCRIPTOR_TYPES = ()

TESTED_TRITON = "3.6."  # the release the direct path was written and checked against (CI installs it)
DIRECT_LAUNCH = triton.__version__.startswith(TESTED_TRITON)

_INT32_RANGE = range(-(2**31), 2**31)


def int_width(value: int) -> int:
    """Triton's integer argument types: i32 inside the int32 range, u64 from 2**63, i64 otherwise."""
    return 32 if value in _INT32_RANGE else 65 if value >= 2**63 else 64


def direct_launches() -> bool:
    """Whether launches take the direct path now: the tested Triton release, and no launch hook (a profiler's)."""
    return DIRECT_LAUNCH and not (knobs.runtime.launch_enter_hook.calls or knobs.runtime.launch_exit_hook.calls)


class FastLauncher:
    """`launcher(grid, *args, **constexprs)` ≡ `kernel[grid](*args, **constexprs)` on the current CUDA stream."""

    MAX_ENTRIES = 256  # specialisations kept; past that, calls take Triton's path (still correct, just slower)

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.names = kernel.arg_names
        self.unspecialized = frozenset(p.num for p in kernel.params if p.do_not_specialize)
        self._layouts: dict[tuple[type, ...], tuple[tuple[int, ...], ...]] = {}
        self._entries: dict[tuple, tuple[Callable, object, object, tuple[str, ...]]] = {}

    def _layout(self, types: tuple[type, ...]) -> tuple[tuple[int, ...], ...]:
        """Positions of the tensors, of the unspecialised ints, of the floats, of the tensor descriptors and of the
        tuples among arguments of these types."""
        layout = self._layouts.get(types)
        if layout is None:  # once per types tuple
            tensors = tuple(i for i, t in enumerate(types) if issubclass(t, torch.Tensor))
            widths = tuple(i for i, t in enumerate(types) if t is int and i in self.unspecialized)
            floats = tuple(i for i, t in enumerate(types) if t is float)
            descriptors = tuple(i for i, t in enumerate(types) if issubclass(t, DESCRIPTOR_TYPES))
            tuples = tuple(i for i, t in enumerate(types) if t is tuple)
            layout = self._layouts[types] = (tensors, widths, floats, descriptors, tuples)
        return layout

    def key(self, device: int, args: tuple, constexprs: dict) -> tuple:
        """What Triton specialises a launch with these arguments on, on `device` (see the module docstring)."""
        types = tuple(map(type, args))
        tensors, widths, floats, descriptors, tuples = self._layout(types)
        key = list(args)
        for i in tensors:
            key[i] = _tensor_key(args[i])
        for i in widths:
            key[i] = int_width(args[i])
        for i in floats:
            key[i] = float
        for i in descriptors:  # Triton's `tensordesc<dtype[tile], layout>`; the base is 16-byte aligned by contract
            d = args[i]
            key[i] = (types[i], d.base.dtype, tuple(d.block_shape), getattr(d, "layout", None), d.padding)
        for i in tuples:
            key[i] = _tuple_key(args[i])
        # A tensor's (dtype, aligned) pair, a descriptor's tuple, an int, a width, None, float: no value at one
        # position stands for two types, so the key needs no types tuple.
        return (device, tuple(key), tuple(constexprs.items()))

    def bind(
        self,
        grid: tuple[int, ...],
        args: tuple,
        constexprs: dict,
        slots: Sequence[tuple[int, int]],
        descriptors: Sequence[tuple[int, int]] = (),
        baked: Sequence[int] = (),
    ) -> "BoundLaunch | None":
        """This launch, already made once (so compiled), as a `BoundLaunch` whose calls replace args[position] by
        values[index] for each (position, index) in slots, and the host-made tensor descriptor args[position] by
        one of the same tile, shape and strides of the tensor at address values[index] for each (position, index)
        in descriptors. The tensors at the positions in baked are bound by address: the caller keeps them alive.
        None where launches do not take the direct path."""
        if not direct_launches():
            return None
        entry = self._entries.get(self.key(torch._C._cuda_getDevice(), args, constexprs))
        if entry is None:
            return None
        run, function, metadata, tail = entry
        kernel_args = [*args, *(constexprs[name] for name in tail)]
        for position in baked:
            kernel_args[position] = addresses(kernel_args[position])
        grid = (*grid, 1, 1)[:3]
        launcher, metas = _c_entry(run)
        if (
            run.profile_scratch_size
            or len(metas) != len(descriptors)
            or any(meta is None or meta["fp4_padded"] for meta in metas)
        ):  # a profiler's scratch, descriptors lowered to pointers or fp4-padded, or another launcher than written for
            return None
        # The C entry point's arguments: grid, stream, function, cooperative grid and PDL flags, the two scratch
        # buffers, packed metadata, launch metadata and hooks (none), then the kernel's, descriptors expanded.
        head = [*grid, None, function, run.launch_cooperative_grid, run.launch_pdl, None, None, metadata, None, None,
                None]  # fmt: skip
        at = {position: index for position, index in descriptors}
        full, where, maps = list(head), {}, []
        for position, arg in enumerate(kernel_args):
            where[position] = len(full)
            if position in at:
                meta = metas[len(maps)]
                maps.append((len(full), at[position], TensorMaps(_tma_fill(arg, meta))))
                full += [None, *arg.shape, *arg.strides]
            else:
                full.append(arg)
        # Global scratch (descriptors a Triton kernel builds in memory): as Triton's launcher sizes it, per call.
        scratch = grid[0] * grid[1] * grid[2] * run.num_ctas * run.global_scratch_size
        return BoundLaunch(launcher, full, [(where[p], i) for p, i in slots], maps, scratch)

    def __call__(self, grid: tuple[int, ...], *args, **constexprs) -> None:
        if not DIRECT_LAUNCH:
            warnings.warn(  # shown once: Python's default filter reports a warning once per place
                f"flashgpt: kernel launches take Triton's own path with triton {triton.__version__} (the direct "
                f"launcher is checked on {TESTED_TRITON}x only): correct, with more host time per call",
                stacklevel=2,
            )
        if not direct_launches():
            self.kernel[grid](*args, **constexprs)
            return
        device = torch._C._cuda_getDevice()
        key = self.key(device, args, constexprs)
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
        stream = torch._C._cuda_getCurrentRawStream(device)
        constexpr_args = [constexprs[name] for name in tail]
        run(grid[0], grid_y, grid_z, stream, function, metadata, None, None, None, *args, *constexpr_args)


def _tensor_key(t: torch.Tensor) -> tuple:
    return (t.dtype, t.data_ptr() % 16 == 0)


def _tuple_key(value: tuple) -> tuple:
    """A tuple argument as Triton specialises it: its tensors by dtype and alignment, its tuples alike, anything
    else by value."""
    return tuple(
        _tensor_key(item) if isinstance(item, torch.Tensor) else _tuple_key(item) if type(item) is tuple else item
        for item in value
    )


def addresses(value):
    """A tensor, or a tuple holding tensors, with each tensor replaced by its address, as a bound launch passes it."""
    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    if type(value) is tuple:
        return tuple(addresses(item) for item in value)
    return value


def _c_entry(run) -> tuple[Callable, list]:
    """The C entry point of a compiled kernel's launcher and the TMA metadata of its tensor-descriptor arguments, in
    order: Triton's launcher wraps the entry point to expand descriptors where the kernel takes any."""
    launch = run.launch
    if getattr(launch, "__closure__", None) is None:  # the C function itself
        return launch, []
    captured = dict(zip(launch.__code__.co_freevars, (cell.cell_contents for cell in launch.__closure__), strict=True))
    return captured["launcher"], list(captured["tensordesc_meta"] or [None] * len(captured["tensordesc_indices"]))


def _tma_fill(descriptor, meta: dict) -> Callable[[int], object]:
    """address -> the TMA descriptor that Triton's launcher makes of `descriptor` with its base at that address
    (`make_tensordesc_arg`)."""
    fill = triton.runtime.driver.active.utils.fill_tma_descriptor
    swizzle, elem_size, block = meta["swizzle"], meta["elem_size"], meta["block_size"]
    elem_type = TMA_DTYPE_DEVICE_TO_HOST[meta["elem_type"]]
    shape, strides, padding = list(descriptor.shape), list(descriptor.strides), int(descriptor.padding == "nan")
    return lambda address: fill(address, swizzle, elem_size, elem_type, block, shape, strides, padding)


class TensorMaps:
    """The TMA descriptors of one launch argument by base address, each made once: everything else in them (element
    type, tile, swizzle, shape, strides) is the bound launch's, which a replay's signature fixes."""

    MAX_ADDRESSES = 16  # a replayed step reuses a few addresses (PyTorch's caching allocator); past that, start over

    __slots__ = ("fill", "maps")

    def __init__(self, fill: Callable[[int], object]) -> None:
        self.fill = fill
        self.maps: dict[int, object] = {}

    def __call__(self, address: int) -> object:
        tensor_map = self.maps.get(address)
        if tensor_map is None:
            if len(self.maps) >= self.MAX_ADDRESSES:
                self.maps.clear()
            tensor_map = self.maps[address] = self.fill(address)
        return tensor_map


STREAM, GLOBAL_SCRATCH = 3, 7  # positions in a bound launch's argument list (the C entry point's)


class BoundLaunch:
    """One compiled kernel's launch with its whole argument list fixed but for some positions (`FastLauncher.bind`):
    `launcher(*args)`, with the stream at STREAM and `scratch` bytes of global scratch memory at GLOBAL_SCRATCH,
    allocated per call on the current device. The caller keeps the slots' values to what the kernel was specialised
    for: a tensor's address of the same 16-byte alignment, an int of the same width."""

    __slots__ = ("args", "descriptors", "launcher", "scratch", "slots")

    def __init__(
        self,
        launcher: Callable,
        args: list,
        slots: Sequence[tuple[int, int]],
        descriptors: Sequence[tuple[int, int, Callable[[int], object]]] = (),
        scratch: int = 0,
    ) -> None:
        self.launcher = launcher
        self.slots = tuple(slots)
        # (position, index, maps): args[position] = maps(values[index]), a TMA descriptor of the address there.
        self.descriptors = tuple(descriptors)
        self.scratch = scratch
        # The slots' values are filled in at every call: holding the binding call's would keep its tensors alive
        # as long as the plan, and through an output's autograd graph the very mask whose plan table holds them.
        filled = {position for position, _ in self.slots} | {position for position, _, _ in self.descriptors}
        self.args = [None if i in filled else arg for i, arg in enumerate(args)]

    def __call__(self, values: Sequence, stream: int) -> None:
        """Launch on `stream` with args[position] = values[index] for each slot."""
        args = self.args.copy()
        args[STREAM] = stream
        for position, index in self.slots:
            args[position] = values[index]
        for position, index, maps in self.descriptors:
            args[position] = maps(values[index])
        if self.scratch:  # freed once the launch is queued: PyTorch's allocator reuses it in stream order
            scratch = torch.empty(self.scratch, dtype=torch.int8, device="cuda")
            args[GLOBAL_SCRATCH] = scratch.data_ptr()
        self.launcher(*args)
