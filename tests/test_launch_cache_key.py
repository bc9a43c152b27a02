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


def _kernel(X, Y, n, seed, scale, BLOCK: tl.constexpr):  # the signature is all the key reads
    pass


@pytest.fixture
def launcher() -> FastLauncher:
    return FastLauncher(JITFunction(_kernel, do_not_specialize=["seed"]))


def _args(x=None, y=None, n=64, seed=5, scale=0.5) -> tuple:
    x = torch.zeros(64) if x is None else x
    return (x, y, n, seed, scale)


def test_same_specialisation_same_key(launcher):
    key = launcher.key(0, _args(), {"BLOCK": 16})
    # other tensor data, another seed of the same integer width, another float: the same compiled kernel
    assert launcher.key(0, _args(x=torch.ones(64), seed=2**31 - 1, scale=3.0), {"BLOCK": 16}) == key


@pytest.mark.parametrize(
    ("change", "constexprs"),
    [
        ({"x": torch.zeros(64, dtype=torch.float16)}, {"BLOCK": 16}),  # dtype
        ({"x": torch.zeros(65)[1:]}, {"BLOCK": 16}),  # address no longer 16-byte aligned
        ({"y": torch.zeros(4)}, {"BLOCK": 16}),  # a tensor where there was None
        ({"n": 65}, {"BLOCK": 16}),  # a specialised int's value
        ({"n": 2**40}, {"BLOCK": 16}),  # a specialised int's width
        ({"seed": 2**40}, {"BLOCK": 16}),  # an unspecialised int's width
        ({"scale": 1}, {"BLOCK": 16}),  # an int where there was a float
        ({}, {"BLOCK": 32}),  # a constexpr
    ],
    ids=["dtype", "alignment", "none-to-tensor", "int-value", "int-width", "seed-width", "float-to-int", "constexpr"],
)
def test_every_specialisation_changes_the_key(launcher, change, constexprs):
    assert launcher.key(0, _args(**change), constexprs) != launcher.key(0, _args(), {"BLOCK": 16})


def test_device_is_part_of_the_key(launcher):
    assert launcher.key(1, _args(), {"BLOCK": 16}) != launcher.key(0, _args(), {"BLOCK": 16})
