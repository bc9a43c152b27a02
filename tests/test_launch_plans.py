"""Launch plans (`kernels/launch_plans.py`): a replayed call computes exactly what the full path computes.

On a GPU a plan replays Triton's compiled launcher with the bound arguments, tensors passed by address; here
those two are what is stood in for: a bound launch runs its kernel through the interpreter with the argument list
the plan built (its constexprs included), tensors passed as tensors, so a wrong slot (a tensor of the previous call,
a stale seed) shows as a wrong result. Every call takes new tensors of the same signature, so nothing from the call
a plan was bound at can pass for a value. (On the GPU, results/tuning/h200-2026-11-26-launch-plans/plans_ab.py
checks replays bit for bit against the full path.)

(Named to be collected after test_hf.py: see test_launch_cache_key.py.)
"""

import gc
import weakref
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from test_kernel_masks import make_masks
from triton.runtime.jit import JITFunction

from flashgpt.kernels import flash_attention, flash_mask, launch_plans
from flashgpt.kernels.attention_op import _draw_rng_state, _params
from flashgpt.kernels.fast_launch import BoundLaunch
from flashgpt.kernels.launch import NO_MASKS, Launch


@pytest.fixture
def interpreted_replays(monkeypatch) -> list[str]:
    """Plans bind as on a GPU, but their launches run through the interpreter; returns the replayed kernels' names."""
    replayed: list[str] = []

    def bind(self: Launch, slots, descriptors, baked):
        assert not descriptors  # the interpreted kernels take no host-made descriptors
        tail = self.kernel.arg_names[len(self.args) :]
        kernel = self.kernel  # not the launch record, which holds the call's tensors (as a compiled launcher does not)

        def run(grid_x, grid_y, grid_z, stream, *args):
            replayed.append(kernel.fn.__name__)
            kernel[(grid_x, grid_y, grid_z)](*args)  # the kernel's arguments, constexprs last

        # The grid and the stream, then the kernel's arguments; mask tensors (baked) stay tensors for the interpreter.
        args = [*(*self.grid, 1, 1)[:3], None, *self.args, *(self.constexprs[name] for name in tail)]
        return BoundLaunch(run, args, [(4 + position, index) for position, index in slots])

    monkeypatch.setattr(Launch, "bind", bind)
    monkeypatch.setattr(launch_plans, "pointer", lambda t: t)  # the interpreter takes tensors, not addresses
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    monkeypatch.setattr(launch_plans, "ENABLED", True)
    # Fresh tables: other tests' calls of the same signatures found no plan to bind in the interpreter.
    monkeypatch.setattr(launch_plans, "_WITHOUT_TENSOR_MASKS", {})
    monkeypatch.setattr(launch_plans, "_BY_MASK", launch_plans.weakref.WeakKeyDictionary())
    return replayed


def _seeds_of_one_signature(count: int) -> list[int]:
    """Seeds whose dropout draws (seed, offset) have one set of integer widths, so one plan serves their calls: the
    width is part of the signature (an offset's low word is i32 or i64 by its value)."""
    by_widths: dict[tuple, list[int]] = {}
    for seed in range(100):
        torch.manual_seed(seed)
        params = _params(True, 0.25, None, 32, _draw_rng_state())
        seeds = by_widths.setdefault(launch_plans.int_widths(params.scalars[1:4]), [])
        seeds.append(seed)
        if len(seeds) == count:
            return seeds
    raise AssertionError("no seeds found")


def _inputs(head_dim: int, generator: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(1, 2, 40, head_dim, generator=generator).requires_grad_() for _ in range(3)]


def _fwd_bwd(q, k, v, dropout_p: float, use_lse: bool, deterministic: bool, masks: dict, seed: int):
    torch.manual_seed(seed)  # the dropout draw
    o, lse = flash_attention(q, k, v, dropout_p=dropout_p, return_lse=True, deterministic=deterministic, **masks)
    generator = torch.Generator().manual_seed(seed)
    loss = (o * torch.randn(o.shape, generator=generator)).sum()
    if use_lse:
        loss = loss + (lse * torch.randn(lse.shape, generator=generator)).sum()
    return [o.detach(), lse.detach(), *torch.autograd.grad(loss, (q, k, v))]


@pytest.mark.parametrize(
    ("head_dim", "dropout_p", "use_lse", "deterministic", "mask"),
    [
        (32, 0.0, False, False, "none"),
        (32, 0.25, True, True, "window"),
        (40, 0.0, True, False, "docs"),  # a padded head dim
        (32, 0.25, False, False, "blocks"),
    ],
    ids=["dense", "dropout-lse-window", "padded-docs", "dropout-blocks"],
)
def test_replayed_call_matches_the_full_path(interpreted_replays, head_dim, dropout_p, use_lse, deterministic, mask):
    generator = torch.Generator().manual_seed(0)
    kwargs = make_masks(mask, 1, 2, 40, 40)
    if "document_ids" in kwargs or "block_mask" in kwargs:  # built once, as a model step does for all its layers
        kwargs = {"mask": flash_mask(40, 40, head_dim=head_dim, dtype=torch.float32, dropout_p=dropout_p, **kwargs)}
    options = (dropout_p, use_lse, deterministic, kwargs)
    seeds = _seeds_of_one_signature(3)
    for seed in seeds[:2]:  # the first call is noted, the second binds the plans
        _fwd_bwd(*_inputs(head_dim, generator), *options, seed=seed)
        assert not interpreted_replays
    q, k, v = _inputs(head_dim, generator)
    replayed = _fwd_bwd(q, k, v, *options, seed=seeds[2])
    assert "flash_fwd_kernel" in interpreted_replays and "flash_bwd_dkdv_kernel" in interpreted_replays
    launch_plans.ENABLED = False
    full = _fwd_bwd(q, k, v, *options, seed=seeds[2])
    for name, got, want in zip(("o", "lse", "dq", "dk", "dv"), replayed, full, strict=True):
        assert torch.equal(got, want), name


@pytest.mark.parametrize("alter", [torch.Tensor.clone, lambda t: (t, 1)], ids=["temporary-tensor", "tensor-in-a-tuple"])
def test_a_launch_with_a_tensor_a_replay_cannot_fill_is_not_planned(interpreted_replays, monkeypatch, alter):
    """A tensor made inside a launch function is neither among the call's values nor the mask's, and one inside a
    tuple has no position of its own among the arguments: binding refuses, so no replay could reuse it."""
    original = launch_plans.LaunchPlan.bind.__func__

    def bind_altered(cls, launches, values, mask):
        first = launches[0]
        position = next(i for i, a in enumerate(first.args) if isinstance(a, torch.Tensor))
        altered = (*first.args[:position], alter(first.args[position]), *first.args[position + 1 :])
        return original(cls, [Launch(first.kernel, first.grid, altered, first.constexprs), *launches[1:]], values, mask)

    monkeypatch.setattr(launch_plans.LaunchPlan, "bind", classmethod(bind_altered))
    generator = torch.Generator().manual_seed(0)
    for call in range(4):
        _fwd_bwd(*_inputs(32, generator), 0.0, False, False, {}, seed=call)
    assert not interpreted_replays


def test_plans_keep_no_call_tensor_and_no_mask_alive(interpreted_replays):
    """A plan fills its slots at every call, so it holds none of the call it was bound at: neither its tensors nor,
    through an output's autograd graph, the mask whose plan table holds the plan. (Holding them leaked a mask, its
    plans and a layer's tensors per training step: 1.1 GiB a step at 64K tokens.)"""
    generator = torch.Generator().manual_seed(0)
    kwargs = make_masks("docs", 1, 2, 40, 40)
    mask = flash_mask(40, 40, head_dim=32, dtype=torch.float32, **kwargs)
    held = [weakref.ref(mask)]
    for _ in range(3):  # noted, bound, replayed
        q, k, v = _inputs(32, generator)
        o = flash_attention(q, k, v, mask=mask)
        o.sum().backward()
        held += [weakref.ref(t) for t in (q, k, v, o, q.grad, k.grad, v.grad)]
    assert "flash_fwd_kernel" in interpreted_replays
    del mask, q, k, v, o
    gc.collect()
    assert [ref() for ref in held] == [None] * len(held)


def _descriptor_kernel(q_desc, k_desc, out, seed, BLOCK: tl.constexpr):  # only its signature is read
    pass


def test_a_bound_launch_passes_what_tritons_launcher_would(monkeypatch):
    """A launch that took host-made tensor descriptors (the Gluon passes), planned and replayed with another call's
    tensors, hands the compiled launcher's C entry point exactly the arguments that Triton's own launcher
    (`wrap_handle_tensordesc`) would make of descriptors of that call's tensors; each address's TMA descriptor is
    made once; the plan holds no tensor of the call it was bound at; and a descriptor of a tensor outside the call's
    values makes binding refuse. The C entry point and the TMA descriptor maker are stood in for."""
    from triton.backends.nvidia.driver import wrap_handle_tensordesc

    from flashgpt.kernels import launch
    from flashgpt.kernels.gluon_common import head_descriptor

    filled: list[tuple] = []

    def fill_tma_descriptor(*args):
        filled.append(args)
        return ("tensor map", *args)

    driver = SimpleNamespace(utils=SimpleNamespace(fill_tma_descriptor=fill_tma_descriptor))
    monkeypatch.setattr(triton.runtime.driver, "_active", driver)
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)

    entered: list[list] = []
    signature = {"q_desc": "tensordesc<bf16[1, 1, 64, 64]>", "k_desc": "tensordesc<bf16[1, 1, 128, 64]>",
                 "out": "*bf16", "seed": "i64", "BLOCK": "constexpr"}  # fmt: skip
    metas = [{"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [1, 1, rows, 64], "fp4_padded": False}
             for rows in (64, 128)]  # fmt: skip
    run = SimpleNamespace(
        launch=wrap_handle_tensordesc(lambda *args: entered.append(list(args)), signature, metas),
        global_scratch_size=0, profile_scratch_size=0, num_ctas=1, launch_cooperative_grid=False, launch_pdl=False,
    )  # fmt: skip
    kernel = JITFunction(_descriptor_kernel, do_not_specialize=["seed"])

    def values_of_a_call(seed: int) -> list:
        q, k = (torch.randn(1, 2, 100, 64).bfloat16() for _ in range(2))
        return [q, k, torch.empty_like(q), seed, 0, 0]

    def launches(values) -> list[Launch]:
        q, k, o, seed = values[:4]
        return [Launch(kernel, (3, 2), (head_descriptor(q, 64), head_descriptor(k, 128), o, seed), {"BLOCK": 16})]

    first = values_of_a_call(2**40)
    (made,) = launches(first)
    fast = launch._fast_launcher(kernel)
    fast._entries[fast.key(0, made.args, made.constexprs)] = (run, 7, "packed metadata", ("BLOCK",))
    plan = launch_plans.LaunchPlan.bind([made], first, NO_MASKS)
    assert plan is not None
    held = [weakref.ref(t) for t in first[:3]]
    del first, made
    gc.collect()
    assert [ref() for ref in held] == [None] * 3

    call = values_of_a_call(2**41)
    for _ in range(2):
        plan(call)
    q, k, o, seed = call[:4]
    run.launch(3, 2, 1, 0, 7, False, False, None, None, "packed metadata", None, None, None,
               head_descriptor(q, 64), head_descriptor(k, 128), o.data_ptr(), seed, 16)  # fmt: skip
    replayed, replayed_again, triton_made = entered
    assert replayed == triton_made
    assert replayed_again == triton_made
    assert len(filled) == 2 + 2  # the replayed call's two descriptors, made once for both replays, and Triton's two

    foreign = values_of_a_call(2**40)
    assert launch_plans.LaunchPlan.bind(launches(values_of_a_call(2**40)), foreign, NO_MASKS) is None


def _masked_kernel(out, masks, seed, BLOCK: tl.constexpr):  # only its signature is read
    pass


class _Entry:
    """Stands for a compiled launcher's C entry point: records the arguments of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args) -> None:
        self.calls.append(args)


def test_a_mask_tensor_inside_a_tuple_is_bound_by_address(monkeypatch):
    """A launch that takes a mask's tensors inside a tuple (the kernels' documents and block-mask arguments) is
    planned: the mask's tensors are bound by address inside the tuple, kept alive with the plan, and every replay
    passes the call's own tensors and seed; a tuple holding a tensor of the call instead makes binding refuse."""
    from flashgpt.kernels import launch

    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    entry = _Entry()
    run = SimpleNamespace(launch=entry, global_scratch_size=0, profile_scratch_size=0, num_ctas=1,
                          launch_cooperative_grid=False, launch_pdl=False)  # fmt: skip
    kernel = JITFunction(_masked_kernel, do_not_specialize=["seed"])
    mask = flash_mask(40, 40, head_dim=32, dtype=torch.float32, document_ids=torch.arange(40)[None] // 16)
    ids = mask.document_ids

    def values_of_a_call(seed: int) -> list:
        return [torch.empty(8), seed, 0, 0]  # the call's tensors, then launch_plans.SCALARS

    def launches(values, masks_arg) -> list[Launch]:
        return [Launch(kernel, (3, 2), (values[0], masks_arg, values[1]), {"BLOCK": 16})]

    first = values_of_a_call(5)
    (made,) = launches(first, ((ids, 40), (None, 0)))
    fast = launch._fast_launcher(kernel)
    fast._entries[fast.key(0, made.args, made.constexprs)] = (run, 7, "packed metadata", ("BLOCK",))
    plan = launch_plans.LaunchPlan.bind([made], first, mask)
    assert plan is not None and plan.mask_tensors == [made.args[1]]  # the mask's tuple, kept alive with the plan

    call = values_of_a_call(6)
    plan(call)
    (args,) = entry.calls
    assert args[-4:] == (call[0].data_ptr(), ((ids.data_ptr(), 40), (None, 0)), 6, 16)  # BLOCK last

    foreign = values_of_a_call(5)
    (made,) = launches(foreign, ((torch.zeros_like(ids), 40), (None, 0)))
    assert launch_plans.LaunchPlan.bind([made], foreign, mask) is None
