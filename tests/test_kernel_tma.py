"""The tensor-descriptor (TMA) tile loads against the pointer loads, pass by pass, through the interpreter.

A launch configuration with `tma=True` streams the tiles of the inner loop (K and V in the forward and the dQ pass,
Q and dO in the dK/dV pass) through tensor descriptors, whose bounds zero-fill the rows past the sequence where
the pointer loads mask them. The products are then the same, so every output must be the pointer kernel's; the
pointer kernels themselves are checked against the float64 reference elsewhere. Ragged tiles
(77, 101 rows), Tq < Tk, every mask, dropout, and the fused backward's dQ atomics.

"The same" is up to the rounding of one tile product: the interpreter computes tl.dot with NumPy's BLAS, which
picks its kernel (and so its summation order) by the operands' memory layout, and a descriptor load returns its
tile in another layout than a pointer gather does. That moves a product by a few float32 ulps (~1e-6 here),
while a wrong or misplaced tile moves it by the size of the values (~1e-1).
"""

from dataclasses import replace

import pytest
import test_kernels
import torch
from test_kernel_backward import MASKS
from test_kernels import make_qkv

from flashgpt.kernels import attention_op, flash_mask, launch

seed = test_kernels.seed  # the fresh-seed-per-check fixture


def run_passes(q, k, v, do, mask, params, tma: bool) -> dict[str, torch.Tensor]:
    """o, lse and both backwards' gradients, every pass at its interpreter configuration with tma set."""
    fit = {"seq_len_k": k.shape[2], "block_size": mask.block_size if mask.block_mask is not None else None}
    config = {p: replace(launch.tuned_config(p, q, params, **fit), tma=tma) for p in attention_op.PASSES}
    o, lse = torch.empty_like(q), q.new_empty(q.shape[:3])
    launch.launch_forward(q, k, v, o, lse, params, config["fwd"], mask)
    out = {"o": o, "lse": lse}
    delta, dq, dk, dv = torch.empty_like(lse), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    launch.launch_dq(q, k, v, do, lse, delta, dq, params, config["bwd_dq"], mask, o=o)
    launch.launch_dkdv(q, k, v, do, lse, delta, dk, dv, params, config["bwd_dkdv"], mask)
    out |= {"delta": delta, "dq": dq, "dk": dk, "dv": dv}
    dq_acc, fused_dk, fused_dv = torch.empty(q.shape), torch.empty_like(k), torch.empty_like(v)
    launch.launch_preprocess(o, do, delta, None, dq_acc)
    launch.launch_dkdv(q, k, v, do, lse, delta, fused_dk, fused_dv, params, config["bwd_fused"], mask,
                       dq_acc=dq_acc, dq_reduce="atomic")  # fmt: skip
    return out | {"fused dq (unscaled)": dq_acc, "fused dk": fused_dk, "fused dv": fused_dv}


@pytest.mark.parametrize("dropout_p", [0.0, 0.3], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize(("seq_len_q", "seq_len_k"), [(77, 77), (40, 101)], ids=["square", "fewer-queries"])
def test_tma_loads_equal_pointer_loads(seq_len_q, seq_len_k, mask, dropout_p, seed):
    q = make_qkv(1, 2, seq_len_q, 32, "fused_qkv")[0].detach()
    k, v = (t.detach() for t in make_qkv(1, 2, seq_len_k, 32, "fused_qkv")[1:])
    do = torch.randn_like(q)
    masks = MASKS[mask](seq_len_q, seq_len_k)
    kernel_mask = flash_mask(seq_len_q, seq_len_k, head_dim=32, dtype=q.dtype, dropout_p=dropout_p, **masks)
    rng = torch.tensor([seed, 7]) if dropout_p else None
    params = attention_op._params(True, dropout_p, None, 32, rng)
    pointers = run_passes(q, k, v, do, kernel_mask, params, tma=False)
    descriptors = run_passes(q, k, v, do, kernel_mask, params, tma=True)
    for name, want in pointers.items():
        # Element-wise atomics (fused dq) add in any order; BLAS rounds by layout (see the module docstring).
        torch.testing.assert_close(
            descriptors[name], want, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name} ({mask}, seed {seed}): {m}"
        )


def test_tma_falls_back_to_pointers_for_a_strided_head_dim(seed):
    """Descriptors need unit stride along D: other layouts take the pointer loads, whatever the configuration."""
    q, k, v = (t.detach() for t in make_qkv(1, 2, 50, 32, "transposed_d"))
    cfg = replace(launch.tuned_config("fwd", q, attention_op._params(True, 0.0, None, 32, None)), tma=True)
    assert not launch._use_tma(cfg, k, v)
    assert launch._use_tma(cfg, *(t.contiguous() for t in (k, v)))
    assert not launch._use_tma(replace(cfg, tma=False), *(t.contiguous() for t in (k, v)))


def test_descriptor_scratch_is_provided_on_every_thread():
    """Triton asks a per-thread (context variable) allocator for the descriptors' scratch at launch, and autograd
    runs backward passes on its own threads: a launch that streams through descriptors provides it on whichever
    thread launches, not once per process (which failed every backward on the GPU)."""
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime import _allocation

    q, k, v = (t.detach().contiguous() for t in make_qkv(1, 2, 50, 32, "fused_qkv"))
    cfg = replace(launch.tuned_config("fwd", q, attention_op._params(True, 0.0, None, 32, None)), tma=True)

    def allocator_after_use_tma():
        before = _allocation._allocator.get()
        assert launch._use_tma(cfg, k, v)
        return before, _allocation._allocator.get()

    for _ in range(2):  # a fresh thread each time starts with Triton's default (no allocator)
        with ThreadPoolExecutor(max_workers=1) as pool:
            before, after = pool.submit(allocator_after_use_tma).result()
        assert before is _allocation._NULL_ALLOCATOR
        assert after is launch._tma_scratch
