"""Masks in the model: every backend applies the same window, block-sparse and document masks; the named
block-sparse patterns; document ids from `<|endoftext|>`; the config checks; and KV-cache generation, which must
give exactly the tokens of recomputing the sequence at every step."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from flashgpt.attention_masks import dense_mask
from flashgpt.data.documents import document_ids
from flashgpt.data.tokenizer import EOT_ID, VOCAB_SIZE, get_tokenizer
from flashgpt.model.attention import AttentionConfig, AttentionMask
from flashgpt.model.backends import build_attention
from flashgpt.model.generation import generate, sample_next
from flashgpt.model.gpt import GPT, ModelConfig
from flashgpt.model.sparsity import (
    BlockSparseConfig,
    block_density,
    block_mask_for,
    build_block_mask,
    butterfly_blocks,
    local_global_blocks,
    resolve_parameters,
    strided_blocks,
    visible_fraction,
)
from flashgpt.training.config import EvalConfig, register_configs, typed_config, validate
from flashgpt.training.distributed import DistContext
from flashgpt.training.evaluation import Evaluator
from flashgpt.training.saved_model import model_from_checkpoint
from flashgpt.training.step import TrainStep
from training_runs import REPO, assert_ok, read_result, train

TINY = ModelConfig(name="gpt2-tiny", n_layer=2, n_head=2, d_model=128)  # head dim 64, as configs/model/gpt2-tiny
SEQ_LEN = 80  # 5 blocks of 16: several blocks, and (with 77-token inputs) a partial last one
BLOCK = 16
# Backends differ only in fp32 summation order (see tests/test_model.py), far below what any mask error changes.
LOSS_TOL = {"rtol": 1e-5, "atol": 1e-6}
GRAD_TOL = {"rtol": 1e-4, "atol": 1e-6}

MASKS = {
    "window": AttentionConfig("naive", window_size=9),
    "local_global": AttentionConfig(
        "naive", block_sparse=BlockSparseConfig("local_global", local_blocks=2), block_size=BLOCK
    ),
    "strided": AttentionConfig(
        "naive", block_sparse=BlockSparseConfig("strided", stride=3, local_blocks=1), block_size=BLOCK
    ),
    "butterfly": AttentionConfig("naive", block_sparse=BlockSparseConfig("butterfly", unit_blocks=1), block_size=BLOCK),
    "window+strided": AttentionConfig(
        "naive", window_size=40, block_sparse=BlockSparseConfig("strided", stride=2), block_size=BLOCK
    ),
}


def tiny_gpt(att: AttentionConfig, backend: str, seq_len: int = SEQ_LEN) -> GPT:
    torch.manual_seed(0)  # identical weights for every backend
    return GPT(TINY, seq_len, AttentionConfig(**{**vars(att), "name": backend}))


def packed_tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    """Random tokens with <|endoftext|> sprinkled in: several documents per row, different per row."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50000, (batch, length), generator=gen)
    tokens[torch.rand(batch, length, generator=gen) < 0.06] = EOT_ID
    return tokens


def loss_and_grads(model: GPT, tokens: torch.Tensor, doc_mask: bool) -> tuple[torch.Tensor, dict]:
    x, y = tokens[:, :-1], tokens[:, 1:]
    logits = model(x, document_ids=document_ids(x) if doc_mask else None)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


# Every mask alone, document masking alone and with two others (plain causal is tests/test_model.py's case).
MODEL_CASES = [(name, False) for name in MASKS] + [("none", True), ("window", True), ("butterfly", True)]


@pytest.mark.parametrize(("mask_name", "doc_mask"), MODEL_CASES)
def test_backends_agree_on_loss_and_gradients_under_each_mask(mask_name, doc_mask):
    att = MASKS.get(mask_name, AttentionConfig("naive"))
    tokens = packed_tokens(2, 78, seed=1)  # 77 inputs: the last block is partial
    ref_loss, ref_grads = loss_and_grads(tiny_gpt(att, "naive"), tokens, doc_mask)
    dense_loss, _ = loss_and_grads(tiny_gpt(AttentionConfig("naive"), "naive"), tokens, doc_mask=False)
    assert not torch.allclose(ref_loss, dense_loss, **LOSS_TOL)  # the mask changes the model's output
    for backend in ("sdpa", "flash"):
        loss, grads = loss_and_grads(tiny_gpt(att, backend), tokens, doc_mask)
        torch.testing.assert_close(loss, ref_loss, **LOSS_TOL, msg=f"{backend} loss")
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], **GRAD_TOL, msg=f"{backend} grad of {name}")


@pytest.fixture
def schedule_builds(monkeypatch) -> list[int]:
    """One entry per build of the flash kernel's tile schedules (FlashMask.build)."""
    from flashgpt.kernels import FlashMask

    builds: list[int] = []
    build = FlashMask.build.__func__
    monkeypatch.setattr(FlashMask, "build", classmethod(lambda cls, *a, **kw: builds.append(1) or build(cls, *a, **kw)))
    return builds


def test_one_forward_builds_the_flash_schedule_once_for_every_layer(schedule_builds, monkeypatch):
    """The model builds the kernel's tile schedules once per forward, and every layer's forward and backward reuse
    them; loss and gradients equal, bit for bit, those of building them in every layer's call."""
    from flashgpt.model.attention import InnerAttention
    from flashgpt.model.backends.flash import FlashAttention

    tokens = packed_tokens(2, 78, seed=1)
    loss, grads = loss_and_grads(tiny_gpt(MASKS["strided"], "flash"), tokens, doc_mask=True)
    assert len(schedule_builds) == 1
    monkeypatch.setattr(FlashAttention, "prepare", InnerAttention.prepare)  # each call builds its own
    per_call_loss, per_call_grads = loss_and_grads(tiny_gpt(MASKS["strided"], "flash"), tokens, doc_mask=True)
    assert len(schedule_builds) == 1 + TINY.n_layer
    assert torch.equal(loss, per_call_loss)
    for name, grad in grads.items():
        assert torch.equal(grad, per_call_grads[name]), name


def test_compiled_model_builds_the_flash_schedule_once_per_forward(schedule_builds):
    """torch.compile (fullgraph) traces the schedule's build into the graph once per forward, not per layer, with
    eager's loss and gradients."""
    tokens = packed_tokens(2, 78, seed=1)
    eager_loss, eager_grads = loss_and_grads(tiny_gpt(MASKS["strided"], "flash"), tokens, doc_mask=True)
    torch._dynamo.reset()
    model = tiny_gpt(MASKS["strided"], "flash")
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=False)
    x, y = tokens[:, :-1], tokens[:, 1:]
    for step in range(2):
        model.zero_grad()
        logits = compiled(x, document_ids=document_ids(x))
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        assert len(schedule_builds) == 1 + (step + 1), "one build per compiled forward"
        torch.testing.assert_close(loss.detach(), eager_loss, **LOSS_TOL)
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, eager_grads[name], **GRAD_TOL, msg=name)


@pytest.mark.parametrize("backend", ["naive", "sdpa"])
def test_document_mask_cuts_every_path_between_documents(backend):
    """Changing one document's tokens leaves every other document's logits exactly as they were."""
    model = tiny_gpt(AttentionConfig("naive"), backend).eval()
    x = torch.randint(0, 50000, (1, 60), generator=torch.Generator().manual_seed(3))
    x[0, [0, 20, 41]] = EOT_ID  # documents [0, 20), [20, 41), [41, 60)
    edited = x.clone()
    edited[0, 25:35] = torch.randint(0, 50000, (10,), generator=torch.Generator().manual_seed(4))
    logits, logits_edited = (model(t, document_ids=document_ids(t)) for t in (x, edited))
    torch.testing.assert_close(logits[0, :20], logits_edited[0, :20], rtol=0, atol=0)
    torch.testing.assert_close(logits[0, 41:], logits_edited[0, 41:], rtol=0, atol=0)
    assert not torch.allclose(logits[0, 25:41], logits_edited[0, 25:41])
    unmasked, unmasked_edited = model(x), model(edited)  # without document masking the edit reaches document 3
    assert not torch.allclose(unmasked[0, 41:], unmasked_edited[0, 41:])


def test_window_bounds_how_far_back_a_token_reaches():
    """With window W, a token sees W - 1 tokens back per layer: L layers reach L·(W - 1) back, no further."""
    window = 5
    model = tiny_gpt(AttentionConfig("naive", window_size=window), "sdpa").eval()
    x = torch.randint(0, 50000, (1, 30), generator=torch.Generator().manual_seed(5))
    edited = x.clone()
    edited[0, 0] += 1
    delta = (model(x) - model(edited)).abs().amax(dim=-1)[0]  # (T,)
    reach = TINY.n_layer * (window - 1)
    assert torch.all(delta[: reach + 1] > 0) and torch.all(delta[reach + 1 :] == 0)


def test_document_ids_of_a_hand_built_window():
    """<|endoftext|> starts the document it belongs to (as in the shards); tokens before the first are document 0."""
    text = "tail of a poem<|endoftext|>Second doc.<|endoftext|><|endoftext|>Fourth"
    row = get_tokenizer().encode(text, allowed_special="all")
    words = ["tail", " of", " a", " poem", "<|endoftext|>", "Second", " doc", ".", "<|endoftext|>", "<|endoftext|>"]
    assert [get_tokenizer().decode([t]) for t in row] == [*words, "Fourth"]
    starts_on_boundary = [EOT_ID, *row[1:]]  # a window cut right at a document's start
    ids = document_ids(torch.tensor([row, starts_on_boundary]))
    assert ids.dtype == torch.int32
    expected = [[0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3], [1, 1, 1, 1, 2, 2, 2, 2, 3, 4, 4]]
    assert ids.tolist() == expected


def test_sdpa_and_naive_apply_bottom_right_causal_for_fewer_queries():
    """Tq < Tk: query i sits at position Tk - Tq + i (sdpa's own is_causal would align it top-left)."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, t, 64, generator=gen, dtype=torch.float64) for t in (3, 20, 20))
    scores = (q @ k.transpose(-1, -2)) * 0.125
    visible = dense_mask(3, 20, causal=True)
    expected = scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v
    assert visible[0, 0, 0].sum() == 18  # the first query sees 18 keys, not 1
    for name in ("naive", "sdpa"):
        out = build_attention(name)(q, k, v, mask=AttentionMask(), dropout_p=0.0, scale=0.125)
        torch.testing.assert_close(out, expected, msg=name)


def test_a_row_with_no_visible_key_returns_zeros_not_nan():
    q, k, v = torch.randn(3, 1, 1, 32, 64, requires_grad=True).unbind(0)
    blocks = torch.ones(1, 2, 2, dtype=torch.bool)
    blocks[0, 1, :] = False  # the second query block sees nothing
    mask = AttentionMask(block_mask=blocks, block_size=16)
    for name in ("naive", "sdpa"):
        out = build_attention(name)(q, k, v, mask=mask, dropout_p=0.0, scale=0.125)
        assert torch.all(out[:, :, 16:] == 0) and torch.isfinite(out).all(), name
        (grad_q,) = torch.autograd.grad(out.sum(), q)
        assert torch.isfinite(grad_q).all() and torch.all(grad_q[:, :, 16:] == 0), name


# --- the named patterns -------------------------------------------------------------------------------------------


def lower(rows: list[str]) -> torch.Tensor:
    """A (1, n, n) block mask drawn as strings of '#' (kept) and '.'."""
    return torch.tensor([[c == "#" for c in row] for row in rows]).unsqueeze(0)


def test_local_global_structure():
    expected = lower(["#.....", "##....", "###...", "#.##..", "#..##.", "#...##"])
    torch.testing.assert_close(local_global_blocks(6, local_blocks=2, global_blocks=1), expected, rtol=0, atol=0)
    both_ways = local_global_blocks(6, local_blocks=2, global_blocks=1, causal=False)
    assert torch.equal(both_ways[0], both_ways[0].T) and both_ways[0, 0].all()  # a global row sees every key


def test_strided_structure():
    # stride 3, no band beyond the diagonal: (i - j) % 3 == 0
    expected = lower(["#......", ".#.....", "..#....", "#..#...", ".#..#..", "..#..#.", "#..#..#"])
    torch.testing.assert_close(strided_blocks(7, stride=3, local_blocks=1), expected, rtol=0, atol=0)
    banded = strided_blocks(7, stride=3, local_blocks=2)  # plus the block just before the diagonal
    assert torch.equal(banded[0], (expected[0] | torch.eye(7, dtype=torch.bool).roll(-1, dims=1).tril()))


def test_butterfly_structure():
    """Flat butterfly: blocks i, j connected when i XOR j has at most one bit set (a butterfly factor's support)."""
    expected = torch.tensor([[bin(i ^ j).count("1") <= 1 for j in range(8)] for i in range(8)]).tril().unsqueeze(0)
    torch.testing.assert_close(butterfly_blocks(8, unit_blocks=1), expected, rtol=0, atol=0)
    assert butterfly_blocks(8, unit_blocks=1)[0, 5].nonzero().flatten().tolist() == [1, 4, 5]  # 5^4, 5^1, 5
    coarse = butterfly_blocks(8, unit_blocks=2, causal=False)[0]  # units of 2 blocks: a 4-unit butterfly, blown up
    unit = torch.tensor([[bin(a ^ b).count("1") <= 1 for b in range(4)] for a in range(4)])
    assert torch.equal(coarse, unit.repeat_interleave(2, 0).repeat_interleave(2, 1))


@pytest.mark.parametrize("pattern", ["local_global", "strided", "butterfly"])
@pytest.mark.parametrize("n_blocks", [1, 7, 64])
def test_every_pattern_keeps_the_diagonal_and_nothing_above_it(pattern, n_blocks):
    size = {"local_global": "local_blocks", "strided": "stride", "butterfly": "unit_blocks"}[pattern]
    for value in (1, 2, 4):
        layout = build_block_mask(BlockSparseConfig(pattern, **{size: value}), n_blocks)
        assert layout.shape == (1, n_blocks, n_blocks) and layout.dtype == torch.bool
        assert layout[0].diagonal().all() and not layout[0].triu(1).any()


@pytest.mark.parametrize(("pattern", "target"), [("local_global", 0.1), ("strided", 0.1), ("strided", 0.25)])
def test_density_target_picks_the_nearest_size(pattern, target):
    n_blocks = 128  # 16K tokens in blocks of 128
    cfg = BlockSparseConfig(pattern, density=target)
    chosen = resolve_parameters(cfg, n_blocks)
    size = "local_blocks" if pattern == "local_global" else "stride"
    density = block_density(build_block_mask(cfg, n_blocks))
    assert abs(density - target) < 0.03
    for neighbour in (chosen[size] - 1, chosen[size] + 1):  # no other size is nearer
        other = build_block_mask(BlockSparseConfig(pattern, **{**chosen, size: neighbour}), n_blocks)
        assert abs(block_density(other) - target) >= abs(density - target)


def test_a_density_too_few_blocks_cannot_reach_is_warned_about(caplog):
    """seq_len <= block_size is one block: any pattern keeps it all, so density=0.1 would silently train dense."""
    cfg = BlockSparseConfig(pattern="strided", density=0.1)
    resolve_parameters(cfg, n_blocks=1)
    assert "density=0.1: over 1 blocks the nearest strided pattern keeps 1.00 of the blocks" in caplog.text
    caplog.clear()
    resolve_parameters(cfg, n_blocks=64)  # enough blocks to come near it
    assert caplog.text == ""


def test_block_density_counts_the_causal_triangle():
    assert block_density(torch.ones(1, 4, 4, dtype=torch.bool)) == 1.0
    assert block_density(torch.eye(4, dtype=torch.bool)[None]) == 4 / 10
    assert block_density(torch.eye(4, dtype=torch.bool)[None], causal=False) == 4 / 16


def test_block_mask_rows_for_decoding_and_prefill():
    layout = strided_blocks(6, stride=2)
    assert torch.equal(block_mask_for(layout, 96, 96, 16), layout)
    assert torch.equal(block_mask_for(layout, 50, 50, 16), layout[:, :4, :4])
    assert torch.equal(block_mask_for(layout, 1, 70, 16), layout[:, 4:5, :5])  # position 69 is in block 4
    assert torch.equal(block_mask_for(layout, 32, 80, 16), layout[:, 3:5, :5])  # queries from position 48
    with pytest.raises(ValueError, match="must start on a block boundary"):
        block_mask_for(layout, 10, 80, 16)


@pytest.mark.parametrize(
    ("window", "sparse"),
    [
        (7, BlockSparseConfig()),
        (None, BlockSparseConfig("strided", stride=3)),
        (20, BlockSparseConfig("butterfly", unit_blocks=1)),
    ],
)
def test_visible_fraction_counts_the_dense_mask(window, sparse):
    seq_len, block = 77, 16
    layout = build_block_mask(sparse, math.ceil(seq_len / block))
    visible = dense_mask(seq_len, seq_len, causal=True, window_size=window, block_mask=layout, block_size=block)
    fraction = visible_fraction(seq_len, window_size=window, layout=layout, block_size=block)
    assert fraction == visible.sum().item() / (seq_len * (seq_len + 1) / 2)
    model = GPT(TINY, seq_len, AttentionConfig("naive", window_size=window, block_sparse=sparse, block_size=block))
    dense = GPT(TINY, seq_len, "naive")
    attention = dense.flops_per_token(seq_len) - 6 * dense.num_params()
    assert model.flops_per_token(seq_len) == 6 * dense.num_params() + round(attention * fraction)


# --- config -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hydra_configs():
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        yield


def test_mask_settings_compose_from_the_command_line(hydra_configs):
    cfg = typed_config(
        compose(
            "config",
            overrides=[
                "attention.window_size=4096",
                "attention.block_sparse.pattern=strided",
                "attention.block_sparse.density=0.1",
                "attention.block_size=64",
                "data.document_mask=true",
            ],
        )
    )
    validate(cfg)
    assert cfg.attention.window_size == 4096 and cfg.attention.block_size == 64 and cfg.data.document_mask
    assert cfg.attention.block_sparse == BlockSparseConfig("strided", density=0.1)
    plain = typed_config(compose("config"))
    assert plain.attention.window_size is None and plain.attention.block_sparse == BlockSparseConfig()
    assert not plain.data.document_mask


def sparse(**fields: object) -> list[str]:
    """Command-line overrides of attention.block_sparse."""
    return [f"attention.block_sparse.{key}={value}" for key, value in fields.items()]


@pytest.mark.parametrize(
    "masks",
    [
        [],
        ["attention.window_size=4096"],
        ["attention.block_sparse.pattern=butterfly", "attention.block_sparse.density=0.1"],
        ["data.document_mask=true"],
    ],
)
def test_the_64k_preset_composes_with_each_mask(hydra_configs, masks):
    cfg = typed_config(compose("config", overrides=["experiment=long_context_masks", *masks]))
    validate(cfg)
    assert (cfg.model.name, cfg.seq_len, cfg.train.batch_size, cfg.attention.name) == ("gpt2", 65536, 1, "flash")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["attention.window_size=0"], r"attention.window_size=0 must be >= 1 \(null: no window\)"),
        (["attention.block_size=0"], r"attention.block_size=0 must be >= 1"),
        (sparse(pattern="dense"), r"pattern='dense'; choose one of: local_global, strided, butterfly"),
        (sparse(density=0.1), r"block_sparse.density is set but attention.block_sparse.pattern is null \(dense"),
        (sparse(pattern="strided"), r"give exactly one of attention.block_sparse.stride \(its size\) and .*density"),
        (sparse(pattern="strided", stride=4, density=0.1), r"give exactly one of attention.block_sparse.stride"),
        (
            sparse(pattern="strided", unit_blocks=4, density=0.1),
            r"strided does not read attention.block_sparse.unit_blocks; its parameters are: stride, local_blocks",
        ),
        (sparse(pattern="butterfly", unit_blocks=3), r"unit_blocks=3 must be a power of two"),
        (sparse(pattern="local_global", density=1.5), r"density=1.5 must be in \(0, 1\]"),
        (sparse(pattern="local_global", local_blocks=0), r"local_blocks=0 must be >= 1"),
    ],
)
def test_bad_mask_settings_fail_at_start_up_naming_the_setting(hydra_configs, overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(typed_config(compose("config", overrides=overrides)))


@pytest.mark.parametrize("override", ["attention.window=64", "attention.block_sparse.densty=0.1", "data.doc_mask=true"])
def test_misspelt_mask_keys_fail_at_composition(hydra_configs, override):
    with pytest.raises(ConfigCompositionException):
        compose("config", overrides=[override])


def test_a_window_longer_than_the_context_is_plain_causal_attention():
    x = torch.randint(0, 50000, (1, 40), generator=torch.Generator().manual_seed(7))
    wide = tiny_gpt(AttentionConfig("naive", window_size=1000), "sdpa").eval()
    torch.testing.assert_close(wide(x), tiny_gpt(AttentionConfig("naive"), "sdpa").eval()(x), rtol=0, atol=0)


# --- generation ---------------------------------------------------------------------------------------------------


def recompute_greedy(model: GPT, prompt: torch.Tensor, n_new: int, document_mask: bool) -> torch.Tensor:
    """The reference: a full forward of the last block_size tokens at every step, no cache."""
    tokens = prompt
    for _ in range(n_new):
        window = tokens[:, -model.block_size :]
        logits = model(window, document_ids=document_ids(window) if document_mask else None)[:, -1]
        tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
    return tokens


def sharpened(model: GPT) -> GPT:
    """The model with matrices of std 0.15: at GPT-2's init (std 0.02, head tied to the embedding) greedy decoding
    repeats the last token forever, which would leave a cached-vs-recomputed comparison without teeth."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.copy_(0.15 * torch.randn(param.shape, generator=gen))
    return model


def generating_gpt(att: AttentionConfig, backend: str) -> GPT:
    """A tiny GPT with a context of 16, `sharpened` for generation tests."""
    return sharpened(tiny_gpt(att, backend, seq_len=16).eval())


GENERATION_CASES = {
    "causal": AttentionConfig("naive"),
    "window": AttentionConfig("naive", window_size=5),
    "strided": AttentionConfig(
        "naive", block_sparse=BlockSparseConfig("strided", stride=2, local_blocks=1), block_size=4
    ),
    "document_mask": AttentionConfig("naive"),
}


@pytest.mark.parametrize("backend", ["sdpa", "flash"])  # the reference runs naive
@pytest.mark.parametrize("case", list(GENERATION_CASES))
def test_cached_generation_matches_recomputing_every_step(backend, case):
    """Greedy, fp32: 5 prompt tokens, then 20 new ones through a context of 16, so the cache fills and the window
    then moves; document masking with <|endoftext|> in the prompts."""
    model = generating_gpt(GENERATION_CASES[case], backend)
    document_mask = case == "document_mask"
    prompt = torch.tensor([[464, EOT_ID, 3290, 318, 257], [40, 1101, 257, EOT_ID, 11]])
    reference = recompute_greedy(generating_gpt(GENERATION_CASES[case], "naive"), prompt, 20, document_mask)
    fed = []  # tokens fed per call: the prompt, then one at a time until the context is full, then whole windows
    model.blocks[0].attn.register_forward_pre_hook(lambda _, args: fed.append(args[0].size(1)))
    cached = generate(model, prompt, 20, temperature=0.0, document_mask=document_mask)
    assert fed == [5] + [1] * 11 + [16] * 8
    assert cached.shape == (2, 25) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, reference)
    assert len(set(cached[0, 5:].tolist())) > 12  # varied tokens: every step's argmax is checked


def test_sampling_is_reproducible_and_top_k_1_is_greedy():
    model = generating_gpt(AttentionConfig("naive"), "sdpa")
    prompt = torch.tensor([[464, 3290]])

    def draw(seed: int, **kwargs) -> torch.Tensor:
        return generate(model, prompt, 12, generator=torch.Generator().manual_seed(seed), **kwargs)

    assert torch.equal(draw(0, temperature=1.0), draw(0, temperature=1.0))
    assert not torch.equal(draw(0, temperature=1.0), draw(1, temperature=1.0))
    assert torch.equal(draw(0, temperature=1.0, top_k=1), generate(model, prompt, 12, temperature=0.0))
    assert draw(2, temperature=2.0, n_vocab=100)[:, 2:].max() < 100  # never a padded or excluded id
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    for seed in range(20):
        token = sample_next(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(seed))
        assert token.item() in (1, 2)


# --- the trainer and the sampling script ---------------------------------------------------------------------------

CPU = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def document_ids_seen(model: GPT) -> list:
    """Record the document_ids the model is called with."""
    seen = []
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs.get("document_ids")), with_kwargs=True)
    return seen


@pytest.mark.parametrize("document_mask", [False, True])
def test_train_step_and_evaluator_hand_the_batch_document_ids_to_the_model(document_mask):
    model = tiny_gpt(AttentionConfig("naive"), "sdpa", seq_len=16)
    seen = document_ids_seen(model)
    optimizer = model.configure_optimizer(1e-3, 0.1, (0.9, 0.95), "cpu")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda index: 1.0)
    step = TrainStep(model, optimizer, scheduler, grad_accum=1, grad_clip=1.0, ctx=CPU, document_mask=document_mask)
    window = packed_tokens(2, 17, seed=8)
    step(lambda: (window[:, :-1], window[:, 1:]))
    tokens = packed_tokens(1, 200, seed=9)[0].numpy().astype(np.uint16)
    evaluator = Evaluator(
        tokens, np.array([0]), 16, EvalConfig(steps=1, batch_size=2), CPU, document_mask=document_mask
    )
    evaluator.evaluate(model)
    assert len(seen) == 2
    if document_mask:
        torch.testing.assert_close(seen[0], document_ids(window[:, :-1]), rtol=0, atol=0)
        torch.testing.assert_close(seen[1], document_ids(evaluator.windows[:, :-1]), rtol=0, atol=0)
    else:
        assert seen == [None, None]


def test_a_short_masked_run_trains_and_its_checkpoint_writes_text(tmp_path):
    """train.py with a window, a block-sparse pattern and document masking; then scripts/sample.py on its checkpoint
    (another backend) writes exactly the tokens that generate() gives in-process."""
    run_dir = tmp_path / "run"
    masks = [
        "attention.window_size=24", "attention.block_sparse.pattern=strided", "attention.block_sparse.stride=2",
        "attention.block_size=16", "data.document_mask=true",
    ]  # fmt: skip
    proc = train(run_dir, "train.max_steps=3", "eval.every=3", "checkpoint.every=3", *masks)
    assert_ok(proc)
    log = proc.stdout + proc.stderr
    expected_log = "attention masks: causal, window 24, block-sparse strided(stride=2, local_blocks=2), blocks of 16"
    assert expected_log in log and "documents (data.document_mask)" in log
    result = read_result(run_dir)
    assert result["status"] == "ok" and result["attention_masks"] in log

    checkpoint = run_dir / "checkpoints" / "latest.pt"
    model, config, _ = model_from_checkpoint(checkpoint, attention="naive")
    model.eval()
    assert config.data.document_mask and model.attention.window_size == 24
    assert torch.equal(model.block_layout, strided_blocks(4, stride=2))
    prompt = torch.tensor([get_tokenizer().encode("ROMEO:")])
    tokens = generate(model, prompt, 12, temperature=0.0, n_vocab=VOCAB_SIZE, document_mask=True)
    command = [sys.executable, "scripts/sample.py", str(checkpoint), "--prompt", "ROMEO:", "--max-new-tokens", "12"]
    out = subprocess.run(
        [*command, "--temperature", "0", "--attention", "sdpa"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"--- sample 0 ---\n{get_tokenizer().decode(tokens[0].tolist())}\n"
    assert "12 tokens in" in out.stderr and "attention=sdpa, context 64" in out.stderr
