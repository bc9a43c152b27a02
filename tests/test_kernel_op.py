"""flash_attention as a PyTorch operator: opcheck, torch.compile (fullgraph, static and dynamic shapes), dropout
randomness under compile, gradients through the returned log-sum-exp, and the refused double backward.

Compiled checks use the aot_eager backend: it runs the same AOTAutograd tracing as inductor (fake tensors,
functionalisation, the joint graph and its partitioning) without generating code, so it is fast on a CPU.
"""

import pytest
import test_kernels
import torch
from test_kernels import FP32_TOL, make_qkv, recover_keep_mask
from torch._dynamo.testing import CompileCounterWithBackend

from flashgpt.attention_reference import reference_attention, rel_err
from flashgpt.kernels import flash_attention
from flashgpt.kernels.attention_op import _draw_rng_state, flash_attention_backward, flash_attention_forward
from flashgpt.kernels.dropout import keep_scale

seed = test_kernels.seed  # the fresh-seed-per-check fixture


@pytest.mark.parametrize(
    ("head_dim", "dropout_p", "causal"), [(32, 0.0, True), (40, 0.25, False)], ids=["native", "padded-dropout"]
)
def test_opcheck(head_dim, dropout_p, causal, seed):
    """Schema, autograd registration, fake tensors and AOTAutograd (static and dynamic) agree with eager."""
    q, k, v = make_qkv(1, 2, 20, head_dim, "fused_qkv")
    rng_state = _draw_rng_state() if dropout_p else None
    torch.library.opcheck(flash_attention_forward, (q, k, v, rng_state, causal, dropout_p, None))
    o, lse = flash_attention_forward(q, k, v, rng_state, causal, dropout_p, None)
    do, dlse = torch.randn_like(o), torch.randn_like(lse)
    detached = [t.detach() for t in (q, k, v, o, lse)]
    torch.library.opcheck(flash_attention_backward, (do, *detached, dlse, rng_state, causal, dropout_p, 0.2))


class TinyAttention(torch.nn.Module):
    """A projection into heads, flash_attention, a projection out: what a transformer block does around it."""

    def __init__(self, d_model: int = 64, n_head: int = 2, dropout_p: float = 0.0):
        super().__init__()
        self.n_head, self.dropout_p = n_head, dropout_p
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.out = torch.nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = self.qkv(x).view(batch, seq_len, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)
        o = flash_attention(q, k, v, causal=True, dropout_p=self.dropout_p)
        return self.out(o.transpose(1, 2).reshape(batch, seq_len, d_model)).relu()


def _loss_and_grads(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = model(x).square().mean()
    return loss, torch.autograd.grad(loss, list(model.parameters()))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_fullgraph_matches_eager(dynamic, seed):
    """No graph break (fullgraph), eager's loss and gradients; a new sequence length recompiles only when static."""
    model = TinyAttention()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=dynamic)
    compiles = []
    for seq_len in (24, 40):
        x = torch.randn(2, seq_len, 64)
        loss, grads = _loss_and_grads(model, x)
        compiled_loss, compiled_grads = _loss_and_grads(compiled, x)
        compiles.append(counter.frame_count)
        assert rel_err(compiled_loss, loss) < FP32_TOL, f"seed {seed}"
        for got, want in zip(compiled_grads, grads, strict=True):
            assert rel_err(got, want) < FP32_TOL, f"seed {seed}"
    assert (compiles[1] == compiles[0]) is dynamic, f"compiled frames after each shape: {compiles}"


def test_compiled_dropout_draws_fresh_reproducible_masks(seed):
    """Under compile the seed is not baked into the graph: consecutive calls differ, torch.manual_seed reproduces
    a call, and two identical calls inside one graph are not merged into one mask."""
    q, k, v = (t.detach() for t in make_qkv(1, 2, 32, 32, "contiguous"))

    def two_calls(q, k, v):
        return flash_attention(q, k, v, dropout_p=0.5), flash_attention(q, k, v, dropout_p=0.5)

    compiled = torch.compile(two_calls, backend="aot_eager", fullgraph=True)
    torch.manual_seed(seed)
    first_a, first_b = compiled(q, k, v)
    second_a, _ = compiled(q, k, v)
    torch.manual_seed(seed)
    again_a, again_b = compiled(q, k, v)
    torch.manual_seed(seed)
    eager_a, eager_b = two_calls(q, k, v)
    assert not torch.equal(first_a, first_b), f"identical calls in one graph shared a mask (seed {seed})"
    assert not torch.equal(first_a, second_a), f"the compiled graph reused its mask (seed {seed})"
    assert torch.equal(first_a, again_a) and torch.equal(first_b, again_b), f"not reproducible (seed {seed})"
    assert torch.equal(first_a, eager_a) and torch.equal(first_b, eager_b), f"compiled != eager (seed {seed})"


def _lse_loss_check(q, k, v, causal: bool, dropout_p: float, seed: int) -> None:
    """loss = Σ wo∘o + Σ wl∘lse: dq, dk, dv against float64 autograd (under the kernel's own dropout mask)."""
    keep = recover_keep_mask(*q.shape, causal, dropout_p, seed) if dropout_p else None
    wo, wl = torch.randn(q.shape, dtype=torch.float64), torch.randn(q.shape[:3], dtype=torch.float64)
    torch.manual_seed(seed)
    o, lse = flash_attention(q, k, v, causal=causal, dropout_p=dropout_p, return_lse=True)
    grads = torch.autograd.grad((o * wo).sum() + (lse * wl).sum(), (q, k, v))
    ref_o, ref_lse = reference_attention(q, k, v, causal=causal, keep=keep, keep_scale=keep_scale(dropout_p))
    ref_grads = torch.autograd.grad((ref_o * wo).sum() + (ref_lse * wl).sum(), (q, k, v))
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True):
        assert rel_err(got, want) < FP32_TOL, f"{name}: relative error {rel_err(got, want):.2e} (seed {seed})"


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradient_through_lse(causal, seed):
    q, k, v = make_qkv(2, 2, 45, 32, "fused_qkv")
    _lse_loss_check(q, k, v, causal, 0.0, seed)


def test_gradient_through_lse_with_dropout(seed):
    q, k, v = make_qkv(1, 2, 30, 32, "contiguous")
    _lse_loss_check(q, k, v, True, 0.25, seed)


def test_gradient_of_lse_alone(seed):
    """Only the log-sum-exp is used: the output gradient is absent (None), dv is zero."""
    q, k, v = make_qkv(1, 2, 33, 32, "contiguous")
    _, lse = flash_attention(q, k, v, return_lse=True)
    dq, dk, dv = torch.autograd.grad(lse.sum(), (q, k, v))
    _, ref_lse = reference_attention(q, k, v, causal=True)
    ref_dq, ref_dk = torch.autograd.grad(ref_lse.sum(), (q, k))
    assert rel_err(dq, ref_dq) < FP32_TOL and rel_err(dk, ref_dk) < FP32_TOL, f"seed {seed}"
    assert not dv.any()


def test_double_backward_raises(seed):
    q, k, v = make_qkv(1, 2, 16, 32, "contiguous")
    o = flash_attention(q, k, v)
    (dq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        dq.square().sum().backward()
