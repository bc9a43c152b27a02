"""GPT-2 and the attention backends, in-process on the CPU (flash through the Triton interpreter, which
tests/conftest.py switches on before `flashgpt.kernels` is imported)."""

import math

import pytest
import torch
import torch.nn.functional as F

from flashgpt.model.attention import CAUSAL
from flashgpt.model.backends import ATTENTION_BACKENDS, build_attention
from flashgpt.model.gpt import GPT, ModelConfig

TINY = ModelConfig(name="gpt2-tiny", n_layer=2, n_head=2, d_model=128)  # configs/model/gpt2-tiny.yaml
GPT2 = ModelConfig(name="gpt2", n_layer=12, n_head=12, d_model=768)  # configs/model/gpt2.yaml
SEQ_LEN = 64
# All three backends compute in fp32 here; they differ only in summation order (measured: 7e-7 on the logits,
# 7e-8 on the gradients), so these bounds are two orders of magnitude above that and far below any real bug.
LOGITS_TOL = {"rtol": 1e-4, "atol": 1e-5}
GRAD_TOL = {"rtol": 1e-4, "atol": 1e-6}


def tiny_gpt(attention: str, dropout: float = 0.0) -> GPT:
    torch.manual_seed(0)  # identical weights for every backend
    return GPT(ModelConfig(**{**vars(TINY), "dropout": dropout}), SEQ_LEN, attention)


def logits_and_grads(model: GPT, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model(idx[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
    return logits.detach(), {name: p.grad for name, p in model.named_parameters()}


def test_backends_agree_on_logits_and_gradients():
    idx = torch.randint(0, 50257, (2, SEQ_LEN + 1), generator=torch.Generator().manual_seed(1))
    ref_logits, ref_grads = logits_and_grads(tiny_gpt("naive"), idx)
    for backend in ("sdpa", "flash"):
        logits, grads = logits_and_grads(tiny_gpt(backend), idx)
        torch.testing.assert_close(logits, ref_logits, **LOGITS_TOL, msg=f"{backend} logits")
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], **GRAD_TOL, msg=f"{backend} grad of {name}")


@pytest.mark.parametrize("backend", sorted(ATTENTION_BACKENDS))
def test_attention_dropout_only_in_training_mode(backend):
    model = tiny_gpt(backend, dropout=0.5)
    idx = torch.randint(0, 50257, (1, SEQ_LEN))
    assert not torch.equal(model(idx), model(idx))  # training: fresh masks each call
    model.eval()
    assert torch.equal(model(idx), model(idx))
    torch.testing.assert_close(model(idx), tiny_gpt("naive", dropout=0.5).eval()(idx), **LOGITS_TOL)


def test_inner_attention_dropout_is_applied_by_the_backend():
    """Every backend drops attention probabilities when given dropout_p > 0, and is deterministic at 0."""
    q, k, v = torch.randn(3, 1, 2, SEQ_LEN, 64).unbind(0)
    for name in ATTENTION_BACKENDS:
        inner = build_attention(name)
        exact = inner(q, k, v, mask=CAUSAL, dropout_p=0.0, scale=0.125)
        dropped = inner(q, k, v, mask=CAUSAL, dropout_p=0.5, scale=0.125)
        assert not torch.allclose(exact, dropped), name
        torch.testing.assert_close(exact, inner(q, k, v, mask=CAUSAL, dropout_p=0.0, scale=0.125), msg=name)


def test_context_longer_than_the_model_is_a_value_error():
    with pytest.raises(ValueError, match=r"context of 65 tokens is longer than the model's 64"):
        tiny_gpt("naive")(torch.zeros(1, SEQ_LEN + 1, dtype=torch.long))


def test_head_dim_must_be_whole():
    with pytest.raises(ValueError, match=r"d_model=128 is not divisible by n_head=3; pick n_head"):
        GPT(ModelConfig(name="odd", n_layer=1, n_head=3, d_model=128), SEQ_LEN, "naive")


def test_unknown_backend_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown attention backend 'flesh'; choose one of: naive, flash, sdpa"):
        build_attention("flesh")
    assert set(ATTENTION_BACKENDS) == {"naive", "flash", "sdpa"}


def test_gpt2_parameter_count_and_flops():
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = GPT(GPT2, 1024, "sdpa")
    assert model.num_params(exclude_position_embeddings=False) == 124_475_904  # with the padded 50304-token vocab
    assert model.num_params() == 124_475_904 - 1024 * 768  # position table excluded, tied token table kept
    assert model.flops_per_token(1024) == 6 * 123_689_472 + 6 * 12 * 768 * 1024


def test_weights_are_tied_and_initialised_like_gpt2():
    model = GPT(ModelConfig(name="init", n_layer=4, n_head=4, d_model=256), 16, "naive")
    assert model.lm_head.weight is model.wte.weight
    residual_std = 0.02 / math.sqrt(2 * 4)
    checked = set()
    for name, param in model.named_parameters():
        kind = ".".join(name.split(".")[-2:])  # e.g. "proj.weight" for blocks.0.attn.proj.weight
        if kind == "proj.weight":  # attn.proj and mlp.proj write into the residual stream
            assert param.std().item() == pytest.approx(residual_std, rel=0.05), name
        elif kind in ("fc.weight", "qkv.weight", "wte.weight", "wpe.weight"):
            assert param.std().item() == pytest.approx(0.02, rel=0.05), name
        elif kind.endswith(".bias"):
            assert not param.any(), name
        elif kind in ("ln_1.weight", "ln_2.weight", "ln_f.weight"):
            assert torch.equal(param, torch.ones_like(param)), name
        else:
            pytest.fail(f"no expectation for {name}")
        checked.add(kind)
    assert {"proj.weight", "fc.weight", "qkv.weight", "wte.weight", "wpe.weight", "ln_1.weight"} <= checked


def test_weight_decay_applies_to_matrices_only():
    model = tiny_gpt("naive")
    optimizer = model.configure_optimizer(lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), device_type="cpu")
    decayed, not_decayed = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and not_decayed["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decayed["params"])
    assert all(p.dim() == 1 for p in not_decayed["params"])
    n_optimized = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    assert n_optimized == model.num_params(exclude_position_embeddings=False)
