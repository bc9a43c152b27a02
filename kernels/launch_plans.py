"""Replaying an eager call's kernel launches: everything but its tensors and dropout seed bound once.

Most of the host time of a flash_attention call goes into deciding what to launch: the tuned configuration, the
constexpr flags, the mask's schedule for each pass, the strides, and the key under which Triton compiled the
kernel. For calls with the same signature (shapes, strides, 16-byte alignment, dtype, device, options, mask) all
of that comes out the same. So a signature's second call records its launches and binds them
(`FastLauncher.bind`) into a `LaunchPlan`, and every later call replays the plan, filling in only what differs
from call to call: the tensors and, with dropout, the seed and offset. A signature seen once never pays for
binding, so masks built afresh inside every compiled call cost nothing here.

A plan keeps its tensors' positions, not the tensors, except those of a mask (document ids, block mask,
schedule), which it keeps bound for as long as that mask lives: plans of a mask live in a table that forgets them
with it. A host-made tensor descriptor of a call's tensor (the Gluon passes take them) is bound as the TMA
descriptor of each call's tensor's address (`fast_launch.TensorMaps`). Binding refuses (and the signature keeps the
full path) if a launch took any other tensor, such as a temporary copy made inside a launch function, which a
replay would otherwise reuse.

`ENABLED = False` turns replays off (benchmarks compare both ways in one process).
"""

import weakref
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .fast_launch import DESCRIPTOR_TYPES, int_width
from .launch import Launch
from .tile_schedule import FlashMask

ENABLED = True
MAX_PLANS = 64  # signatures kept per mask (and for calls without tensor masks); past that the table starts over
SCALARS = ("seed", "offset_lo", "offset_hi")  # the kernels' per-call ints, after the tensors in a call's values


class LaunchPlan:
    """The launches of one call signature, bound; `plan(values)` replays them with that call's values."""

    __slots__ = ("launches", "mask_tensors")

    def __init__(self, launches: list, mask_tensors: list[Tensor]) -> None:
        self.launches = launches
        self.mask_tensors = mask_tensors  # bound by address: kept alive with the plan

    @classmethod
    def bind(cls, launches: Sequence[Launch], values: Sequence, mask: FlashMask) -> "LaunchPlan | None":
        """Plan `launches`, made with `values` (the call's tensors, None where absent, then its SCALARS). None if
        they cannot be replayed: a launch took a tensor (or a descriptor of one) that is neither among values nor
        the mask's, or inside a tuple a tensor not the mask's (a replay binds those by address) or a descriptor,
        two values are one tensor (their positions would be ambiguous), or launches do not take the direct path."""
        tensors = {id(t): i for i, t in enumerate(values) if isinstance(t, Tensor)}
        if len(tensors) != sum(isinstance(t, Tensor) for t in values):
            return None
        mask_tensors = (mask.document_ids, mask.block_mask, mask.schedule)
        owned = {t.untyped_storage().data_ptr() for t in mask_tensors if t is not None}
        first_scalar = len(values) - len(SCALARS)
        bound, kept = [], []
        for launch in launches:
            slots, descriptors, baked = [], [], []
            for position, arg in enumerate(launch.args):
                if isinstance(arg, Tensor):
                    index = tensors.get(id(arg))
                    if index is not None:
                        slots.append((position, index))
                    elif arg.untyped_storage().data_ptr() in owned:
                        baked.append(position)
                    else:
                        return None
                elif isinstance(arg, DESCRIPTOR_TYPES):
                    index = tensors.get(id(arg.base))
                    if index is None:
                        return None
                    descriptors.append((position, index))
                elif type(arg) is tuple:
                    inside = list(_leaves(arg))
                    if any(isinstance(item, DESCRIPTOR_TYPES) for item in inside):
                        return None
                    nested = [item for item in inside if isinstance(item, Tensor)]
                    if any(t.untyped_storage().data_ptr() not in owned for t in nested):
                        return None  # a call's tensor inside a tuple would be replayed as it is
                    if nested:
                        baked.append(position)
            names = launch.kernel.arg_names[: len(launch.args)]
            slots += [(names.index(name), first_scalar + i) for i, name in enumerate(SCALARS) if name in names]
            replay = launch.bind(slots, descriptors, baked)
            if replay is None:
                return None
            kept += [launch.args[position] for position in baked]
            bound.append(replay)
        return cls(bound, kept)

    def __call__(self, values: Sequence) -> None:
        stream = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
        arguments = [pointer(v) if isinstance(v, Tensor) else v for v in values]
        for launch in self.launches:
            launch(arguments, stream)


def _leaves(value: tuple):
    """The items of a tuple argument, nested tuples' included."""
    for item in value:
        if type(item) is tuple:
            yield from _leaves(item)
        else:
            yield item


def pointer(t: Tensor) -> int:
    """A tensor as a replay passes it: its address. For a tensor, Triton's launcher calls data_ptr() and asks the
    driver to check the pointer (cuPointerGetAttribute), a few µs per tensor argument; an int it takes as it is.
    The call's own checks have put every tensor on the device."""
    return t.data_ptr()


_SEEN_ONCE, _NOT_PLANNABLE = object(), object()
_WITHOUT_TENSOR_MASKS: dict = {}
_BY_MASK: "weakref.WeakKeyDictionary[FlashMask, dict]" = weakref.WeakKeyDictionary()


def plans_for(mask: FlashMask) -> dict:
    """The plan table of calls with this mask; calls without document ids or block mask share one (their key then
    holds the window)."""
    if mask.document_ids is None and mask.block_mask is None:
        return _WITHOUT_TENSOR_MASKS
    table = _BY_MASK.get(mask)
    if table is None:
        table = _BY_MASK[mask] = {}
    return table


def launch_or_replay(mask: FlashMask, key: tuple, values: Sequence, launch: Callable[[], list[Launch]]) -> None:
    """Replay the plan of call signature `key` with `values` if it has one; else `launch()` (which makes the launches
    the full way and returns them), noting a signature's first call and binding its plan at the second."""
    table = plans_for(mask)
    seen = table.get(key)
    if type(seen) is LaunchPlan and ENABLED:
        seen(values)
        return
    launches = launch()
    if seen is None:
        if len(table) >= MAX_PLANS:
            table.clear()
        table[key] = _SEEN_ONCE
    elif seen is _SEEN_ONCE and ENABLED:
        plan = LaunchPlan.bind(launches, values, mask)
        table[key] = _NOT_PLANNABLE if plan is None else plan


def int_widths(values: Sequence[int]) -> tuple[int, ...]:
    """Triton compiles an int argument as i32 or i64 by its value: the seed and offset are part of a signature by
    their widths."""
    return tuple(map(int_width, values))


def signature(*tensors: Tensor | None) -> tuple:
    """Shape, strides and 16-byte alignment of each tensor (None stays None): what the launches derive from them."""
    return tuple([None if t is None else (t.shape, t.stride(), t.data_ptr() % 16 == 0) for t in tensors])
