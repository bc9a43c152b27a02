"""model.activation_checkpointing=true: every block recomputed in the backward (torch.utils.checkpoint, non-reentrant)
gives the same loss and gradients as keeping its activations, dropout included, on every attention backend, and
holds fewer activations in memory."""

import copy

import pytest
import torch
import torch.nn.functional as F

from flashgpt.model.gpt import GPT, ModelConfig

VOCAB = 256
# Small enough for the flash kernel in the Triton interpreter (dropout tests T <= 128).
SHAPE = {"n_layer": 2, "n_head": 2, "d_model": 64, "vocab_size": VOCAB}


def models(attention: str, dropout: float, seq_len: int) -> tuple[GPT, GPT]:
    """The same weights twice: activations kept, and recomputed per block."""
    torch.manual_seed(0)
    plain = GPT(ModelConfig(name="tiny", dropout=dropout, **SHAPE), seq_len, attention).train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.cfg = ModelConfig(name="tiny", dropout=dropout, activation_checkpointing=True, **SHAPE)
    return plain, checkpointed


def loss_and_grads(model: GPT, idx: torch.Tensor, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward from RNG state `seed`; also checks where the RNG stream ends up."""
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    logits = model(idx[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    grads["rng state after the step"] = torch.get_rng_state()  # the next step must draw the same numbers too
    return loss.detach(), grads


@pytest.mark.parametrize("attention", ["naive", "sdpa", "flash"])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_recomputed_blocks_give_the_same_loss_and_gradients(attention: str, dropout: float) -> None:
    seq_len = 32
    idx = torch.randint(0, VOCAB, (2, seq_len + 1), generator=torch.Generator().manual_seed(1))
    plain, checkpointed = models(attention, dropout, seq_len)
    loss, grads = loss_and_grads(plain, idx, seed=7)
    loss_ckpt, grads_ckpt = loss_and_grads(checkpointed, idx, seed=7)
    assert torch.equal(loss, loss_ckpt)
    assert grads.keys() == grads_ckpt.keys()
    for name in grads:
        assert torch.equal(grads[name], grads_ckpt[name]), name
    if dropout:  # the masks are really random: another seed gives another loss
        assert not torch.equal(loss_and_grads(checkpointed, idx, seed=8)[0], loss_ckpt)


def saved_activation_bytes(model: GPT, idx: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward during one forward (parameters excluded)."""
    parameters = {p.data_ptr() for p in model.parameters()}
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        if tensor.data_ptr() not in parameters:
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(idx)
    return total


def test_checkpointing_keeps_a_fraction_of_the_activations() -> None:
    plain, checkpointed = models("sdpa", 0.0, seq_len=128)
    idx = torch.randint(0, VOCAB, (4, 128))
    kept, kept_ckpt = saved_activation_bytes(plain, idx), saved_activation_bytes(checkpointed, idx)
    # Per block only its (B, T, C) input stays, instead of ~a dozen tensors of (B, T, C) to (B, T, 4C).
    assert kept_ckpt < kept / 3
    checkpointed.eval()  # no backward follows an evaluation: nothing to recompute, so no checkpointing
    assert saved_activation_bytes(checkpointed, idx) == kept
