"""`FastLauncher`'s cache key: it must tell apart exactly the launches Triton compiles differently.

The key is checked on CPU tensors (no launch): a Triton JIT function stands for a kernel, built directly because
the interpreter (TRITON_INTERPRET=1) replaces `triton.jit` with its own function type.

(Named to be collected after test_hf.py: importing flashgpt.kernels before transformers in one pytest process makes
test_kernel_masks' opcheck of the backward operator fail inside PyTorch's schema check — "std::bad_alloc", a
garbled schema, or a segfault. Seen at 18c8cc4 too, not reproduced outside pytest; not yet understood.)
"""

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from flashgpt.kernels.fast_launch import FastLauncher


def _kernel(X, Y, strides, masks, n, seed, scale, BLOCK: tl.constexpr):  # the signature is all the key reads
    pass


@pytest.fixture
def launcher() -> FastLauncher:
    return FastLauncher(JITFunction(_kernel, do_not_specialize=["seed"]))


def _masks(ids=None, stride=64) -> tuple:
    """A mask argument as the kernels take one: its tensors and their strides in a tuple, None where not given."""
    ids = torch.zeros(2, 64, dtype=torch.int32) if ids is None else ids
    return ((ids, stride), (None, 0))


def _args(x=None, y=None, strides=(64, 1), masks=None, n=64, seed=5, scale=0.5) -> tuple:
    x = torch.zeros(64) if x is None else x
    return (x, y, strides, _masks() if masks is None else masks, n, seed, scale)


def test_same_specialisation_same_key(launcher):
    key = launcher.key(0, _args(), {"BLOCK": 16})
    # other tensor data, equal strides of another tensor, another seed of the same integer width, another float: the
    # same compiled kernel
    strides = torch.zeros(3, 64).stride()
    masks = _masks(ids=torch.ones(2, 64, dtype=torch.int32))  # another mask tensor of the same dtype and alignment
    assert (
        launcher.key(0, _args(x=torch.ones(64), strides=strides, masks=masks, seed=2**31 - 1, scale=3.0), {"BLOCK": 16})
        == key
    )


def test_the_key_holds_no_tensor(launcher):
    """Tensors, at the top or inside a tuple, are keyed by what Triton specialises on: a key kept in the launcher's
    cache must neither keep a call's tensors alive nor tell apart two calls by their tensors' identity."""

    def leaves(value):
        for item in value:
            yield from leaves(item) if isinstance(item, tuple) else (item,)

    assert not any(isinstance(item, torch.Tensor) for item in leaves(launcher.key(0, _args(), {"BLOCK": 16})))


@pytest.mark.parametrize(
    ("change", "constexprs"),
    [
        ({"x": torch.zeros(64, dtype=torch.float16)}, {"BLOCK": 16}),  # dtype
        ({"x": torch.zeros(65)[1:]}, {"BLOCK": 16}),  # address no longer 16-byte aligned
        ({"y": torch.zeros(4)}, {"BLOCK": 16}),  # a tensor where there was None
        ({"n": 65}, {"BLOCK": 16}),  # a specialised int's value
        ({"n": 2**40}, {"BLOCK": 16}),  # a specialised int's width
        ({"strides": (72, 1)}, {"BLOCK": 16}),  # an int in a tuple: Triton specialises each (divisible by 16)
        ({"strides": (64, 2)}, {"BLOCK": 16}),  # == 1 no longer
        ({"masks": _masks(ids=torch.zeros(2, 64, dtype=torch.int64))}, {"BLOCK": 16}),  # a tensor's dtype in a tuple
        ({"masks": _masks(ids=torch.zeros(129, dtype=torch.int32)[1:])}, {"BLOCK": 16}),  # its alignment
        ({"masks": ((None, 64), (None, 0))}, {"BLOCK": 16}),  # None where a tuple held a tensor
        ({"masks": _masks(stride=72)}, {"BLOCK": 16}),  # an int beside it
        ({"seed": 2**40}, {"BLOCK": 16}),  # an unspecialised int's width
        ({"scale": 1}, {"BLOCK": 16}),  # an int where there was a float
        ({}, {"BLOCK": 32}),  # a constexpr
    ],
    ids=[
        "dtype",
        "alignment",
        "none-to-tensor",
        "int-value",
        "int-width",
        "tuple-int-value",
        "tuple-int-one",
        "tuple-tensor-dtype",
        "tuple-tensor-alignment",
        "tuple-tensor-to-none",
        "tuple-stride",
        "seed-width",
        "float-to-int",
        "constexpr",
    ],
)
def test_every_specialisation_changes_the_key(launcher, change, constexprs):
    assert launcher.key(0, _args(**change), constexprs) != launcher.key(0, _args(), {"BLOCK": 16})


def test_device_is_part_of_the_key(launcher):
    assert launcher.key(1, _args(), {"BLOCK": 16}) != launcher.key(0, _args(), {"BLOCK": 16})


def test_the_direct_launcher_is_on_for_the_triton_release_ci_installs():
    """The direct path is checked against one Triton release; CI installs it, so a Triton upgrade shows here first
    (re-check the launcher on a GPU, then move TESTED_TRITON)."""
    import triton

    from flashgpt.kernels import fast_launch

    assert triton.__version__.startswith(fast_launch.TESTED_TRITON) and fast_launch.DIRECT_LAUNCH


class _RecordingKernel:
    """Stands for a JIT kernel: `kernel[grid](*args, **constexprs)` records the call (Triton's own path)."""

    def __init__(self) -> None:
        fn = JITFunction(_kernel, do_not_specialize=["seed"])
        self.arg_names, self.params, self.calls = fn.arg_names, fn.params, []

    def __getitem__(self, grid):
        return lambda *args, **constexprs: self.calls.append((grid, args, constexprs))


def test_another_triton_release_takes_tritons_own_path_on_every_call(monkeypatch):
    from flashgpt.kernels import fast_launch

    monkeypatch.setattr(fast_launch, "DIRECT_LAUNCH", False)
    kernel = _RecordingKernel()
    launcher = FastLauncher(kernel)
    with pytest.warns(UserWarning, match="take Triton's own path"):
        for _ in range(3):  # the direct path would take a CUDA device after the first call; this one never does
            launcher((2, 3), *_args(), BLOCK=16)
    assert [(grid, constexprs) for grid, _, constexprs in kernel.calls] == [((2, 3), {"BLOCK": 16})] * 3
    assert not launcher._entries


def _descriptor(t: torch.Tensor, rows: int):
    from flashgpt.kernels.gluon_common import head_descriptor

    return head_descriptor(t, rows)


def test_a_tensor_descriptor_is_keyed_by_what_triton_specialises_it_on(launcher):
    """Triton compiles a host-made descriptor as `tensordesc<dtype[tile], layout>`: other data, shape or strides of
    the same tile reuse the kernel, another tile or dtype does not."""
    args = lambda d: (d, None, (64, 1), 64, 5, 0.5)
    q = torch.zeros(2, 3, 256, 64, dtype=torch.bfloat16)
    key = launcher.key(0, args(_descriptor(q, 64)), {"BLOCK": 16})
    other = torch.zeros(1, 4, 1000, 64, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    assert launcher.key(0, args(_descriptor(other, 64)), {"BLOCK": 16}) == key
    assert launcher.key(0, args(_descriptor(q, 128)), {"BLOCK": 16}) != key
    assert launcher.key(0, args(_descriptor(q.half(), 64)), {"BLOCK": 16}) != key
    assert launcher.key(0, args(q), {"BLOCK": 16}) != key
