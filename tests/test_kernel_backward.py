"""The two backward schedules: fused (5 products, dQ summed with atomics) and deterministic (7 products, split).

Both against the float64 reference on fresh random inputs, with every mask, Tq < Tk, a gradient into the returned
log-sum-exp, and dropout (the two schedules must draw the same keep-mask as the forward); how the schedule is chosen
(`deterministic`, `torch.use_deterministic_algorithms`); bit-identical gradients on the deterministic path.
"""

import pytest
import test_kernels
import torch
from test_kernels import FP32_TOL, make_qkv

from flashgpt.attention_masks import dense_mask
from flashgpt.attention_reference import reference_attention, rel_err
from flashgpt.kernels import attention_op, flash_attention

seed = test_kernels.seed  # the fresh-seed-per-check fixture

MASKS = {
    "causal": lambda tq, tk: {},
    "window": lambda tq, tk: {"window_size": 19},
    "documents": lambda tq, tk: {"document_ids": torch.randint(0, 3, (1, tk)).sort(dim=1).values},
    "blocks": lambda tq, tk: {"block_mask": torch.rand(1, -(-tq // 32), -(-tk // 32)) < 0.6, "block_size": 32},
    "blocks_straddling": lambda tq, tk: {
        "block_mask": torch.rand(2, -(-tq // 24), -(-tk // 24)) < 0.6,
        "block_size": 24,
    },
}


def gradients(q, k, v, *, deterministic: bool, dropout_p: float = 0.0, rng_seed: int = 0, **masks):
    torch.manual_seed(rng_seed)  # the same dropout seed for both schedules
    o, lse = flash_attention(q, k, v, dropout_p=dropout_p, return_lse=True, deterministic=deterministic, **masks)
    gen = torch.Generator().manual_seed(rng_seed + 1)
    do, dlse = torch.randn(o.shape, generator=gen), torch.randn(lse.shape, generator=gen)
    dlse = torch.where(torch.isfinite(lse), dlse, 0.0)  # rows that see no key have no LSE to differentiate
    return (o, lse), torch.autograd.grad((o, lse), (q, k, v), (do, dlse)), (do, dlse)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused", "deterministic"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize(("seq_len_q", "seq_len_k"), [(77, 77), (40, 101)], ids=["square", "fewer-queries"])
def test_matches_float64_reference(seq_len_q, seq_len_k, mask, deterministic, seed):
    q = torch.randn(1, 2, seq_len_q, 64, requires_grad=True)
    k, v = (torch.randn(1, 2, seq_len_k, 64, requires_grad=True) for _ in range(2))
    masks = MASKS[mask](seq_len_q, seq_len_k)
    _, grads, (do, dlse) = gradients(q, k, v, deterministic=deterministic, **masks)

    visible = dense_mask(seq_len_q, seq_len_k, causal=True, **masks)
    ref_o, ref_lse = reference_attention(q, k, v, visible)
    ref_lse_used = torch.where(torch.isfinite(ref_lse), ref_lse, 0.0)
    ref = torch.autograd.grad((ref_o, ref_lse_used), (q, k, v), (do.double(), dlse.double()))
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref, strict=True):
        assert torch.isfinite(got).all(), f"{name} has non-finite values (seed {seed})"
        err = rel_err(got, want)
        assert err < FP32_TOL, f"{name}: relative error {err:.2e} >= {FP32_TOL} ({mask}, seed {seed})"


@pytest.mark.parametrize("mask", ["causal", "documents", "blocks"])
def test_schedules_agree_under_dropout(mask, seed):
    """Both schedules regenerate the forward's keep-mask: same forward, gradients equal to fp32 rounding."""
    q, k, v = make_qkv(1, 2, 70, 64, "fused_qkv")
    masks = MASKS[mask](70, 70)
    fused_out, fused, _ = gradients(q, k, v, deterministic=False, dropout_p=0.3, rng_seed=seed, **masks)
    split_out, split, _ = gradients(q, k, v, deterministic=True, dropout_p=0.3, rng_seed=seed, **masks)
    assert torch.equal(fused_out[0], split_out[0])
    for name, a, b in zip(("dq", "dk", "dv"), fused, split, strict=True):
        err = rel_err(a, b)
        assert err < FP32_TOL, f"{name}: fused vs deterministic {err:.2e} ({mask}, seed {seed})"


def test_deterministic_gradients_are_bit_identical(seed):
    q, k, v = make_qkv(2, 3, 90, 32, "contiguous")
    first = gradients(q, k, v, deterministic=True, dropout_p=0.2, rng_seed=seed)[1]
    second = gradients(q, k, v, deterministic=True, dropout_p=0.2, rng_seed=seed)[1]
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@pytest.fixture
def launched(monkeypatch) -> list[str]:
    """The backward launches, by name, of the calls made while the test runs."""
    names: list[str] = []
    for name in ("launch_dq", "launch_dkdv", "launch_preprocess", "launch_dq_convert"):
        real = getattr(attention_op, name)

        def record(*args, _real=real, _name=name, **kwargs):
            names.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(attention_op, name, record)
    return names


@pytest.mark.parametrize(
    ("deterministic", "torch_flag", "expected"),
    [
        (None, False, ["launch_preprocess", "launch_dkdv", "launch_dq_convert"]),
        (None, True, ["launch_dq", "launch_dkdv"]),
        (True, False, ["launch_dq", "launch_dkdv"]),
        (False, True, ["launch_preprocess", "launch_dkdv", "launch_dq_convert"]),
    ],
    ids=["default", "torch-deterministic", "asked", "asked-fast-despite-torch"],
)
def test_schedule_choice(deterministic, torch_flag, expected, launched):
    """None follows torch.use_deterministic_algorithms; an explicit bool wins. The interpreter's faster schedule is
    the fused one (`tuning.backward_schedule`)."""
    q, k, v = make_qkv(1, 1, 20, 16, "contiguous")
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(torch_flag)
    try:
        o = flash_attention(q, k, v, deterministic=deterministic)
    finally:
        torch.use_deterministic_algorithms(previous)
    o.sum().backward()
    assert launched == expected


def test_each_call_takes_its_own_schedule_on_one_signature(launched):
    """The schedule is decided once per call signature (`attention_op._backward_schedule`); determinism is part of
    that signature, so alternating it on the same tensors alternates the backward."""
    q, k, v = make_qkv(1, 1, 24, 16, "contiguous")
    split, fused = ["launch_dq", "launch_dkdv"], ["launch_preprocess", "launch_dkdv", "launch_dq_convert"]
    for deterministic, expected in ((False, fused), (True, split), (False, fused), (True, split)):
        launched.clear()
        flash_attention(q, k, v, deterministic=deterministic).sum().backward()
        assert launched == expected, deterministic


def test_deterministic_must_be_a_bool():
    q, k, v = make_qkv(1, 1, 8, 16, "contiguous")
    with pytest.raises(TypeError, match="deterministic must be a bool or None"):
        flash_attention(q, k, v, deterministic="yes")


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused", "deterministic"])
def test_rows_that_see_no_key_beside_a_ragged_key_tile(deterministic, seed):
    """Keys past Tk in the last key tile are out of bounds, not visible: queries at positions 40-47 see no key (their
    block keeps only keys 48-63, of which 48-49 exist and hold another document, and the missing ones would read
    document 0, theirs), so their P there must be 0, not exp(s − (−inf)) = inf; the fused pass's dS·K made inf · 0 =
    NaN of it in dq."""
    q = torch.randn(1, 2, 10, 32, requires_grad=True)
    k, v = (torch.randn(1, 2, 50, 32, requires_grad=True) for _ in range(2))
    document_ids = torch.zeros(1, 50, dtype=torch.long)
    document_ids[0, 48:] = 1
    block_mask = torch.tensor([[[False, False, False, True]]])  # (1, 1 query block, 4 key blocks of 16)
    masks = {"document_ids": document_ids, "block_mask": block_mask, "block_size": 16}
    o = flash_attention(q, k, v, causal=False, deterministic=deterministic, **masks)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    visible = dense_mask(10, 50, causal=False, **masks)
    assert not visible[..., :8, :].any() and visible[..., 8:, :].any()  # the case the test is about
    ref_o, _ = reference_attention(q, k, v, visible)
    ref = torch.autograd.grad(ref_o, (q, k, v), do.double())
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref, strict=True):
        assert torch.isfinite(got).all(), f"{name} has non-finite values (seed {seed})"
        assert rel_err(got, want) < FP32_TOL, f"{name} (seed {seed})"
