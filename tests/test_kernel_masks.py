"""The kernel under masks (Tq < Tk, sliding window, document ids, block-sparse) against a float64 reference that
applies `dense_mask`, through the Triton interpreter; plus the tile skipping itself and the argument checks.

Shapes are small and odd (1, 50, 77, 200: not multiples of any tile or block) because the interpreter is slow.
"""

import json
import math
import os

import pytest
import torch

from flashgpt.attention_masks import dense_mask
from flashgpt.attention_reference import lse_err, reference_attention, rel_err
from flashgpt.attention_reference import recover_keep_mask as recover_dropout_mask
from flashgpt.kernels import FlashMask, flash_attention, flash_mask, launch
from flashgpt.kernels.attention_op import flash_attention_backward, flash_attention_forward
from flashgpt.kernels.dropout import keep_scale
from flashgpt.kernels.launch import AttentionParams, tuned_config
from flashgpt.kernels.tuning import LaunchConfig
from flashgpt.model.sparsity import local_global_blocks, strided_blocks

FP32_TOL = 1e-5
LOW_PRECISION_TOL = 2e-2


@pytest.fixture
def seed() -> int:
    """A fresh seed for every check, printed on failure so any failure can be replayed."""
    value = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(value)
    return value


def random_documents(batch: int, seq_len: int, mean_len: float) -> torch.Tensor:
    """(B, T) int64 ids of packed documents of random (geometric) lengths: id k+1 starts where a new one does."""
    starts = torch.rand(batch, seq_len) < 1.0 / mean_len
    starts[:, 0] = False
    return starts.cumsum(1)


def random_block_mask(heads: int, seq_len_q: int, seq_len_k: int, block_size: int, density: float) -> torch.Tensor:
    return torch.rand(heads, math.ceil(seq_len_q / block_size), math.ceil(seq_len_k / block_size)) < density


def make_masks(name: str, batch: int, heads: int, seq_len_q: int, seq_len_k: int) -> dict:
    """flash_attention mask kwargs for a named case; `+` combines cases."""
    kwargs: dict = {}
    for part in name.split("+"):
        if part == "window":
            kwargs["window_size"] = 33
        elif part == "docs":
            kwargs["document_ids"] = random_documents(batch, seq_len_k, mean_len=40)
        elif part == "scattered_docs":  # ids that come back: visibility by id, not by contiguous runs
            kwargs["document_ids"] = torch.randint(0, 3, (batch, seq_len_k), dtype=torch.int32)
        elif part == "blocks":
            kwargs.update(block_mask=random_block_mask(heads, seq_len_q, seq_len_k, 32, 0.5), block_size=32)
        elif part == "shared_blocks":
            kwargs.update(block_mask=random_block_mask(1, seq_len_q, seq_len_k, 16, 0.4), block_size=16)
        elif part == "odd_blocks":  # blocks no tile fits in: the kernel also applies the block mask per element
            kwargs.update(block_mask=random_block_mask(heads, seq_len_q, seq_len_k, 24, 0.4), block_size=24)
        elif part != "none":
            raise ValueError(part)
    return kwargs


def visibility(q: torch.Tensor, k: torch.Tensor, causal: bool, masks: dict) -> torch.Tensor:
    return dense_mask(q.shape[2], k.shape[2], causal=causal, **masks)


def make_qkv(batch, heads, seq_len_q, seq_len_k, head_dim, dtype=torch.float32):
    q = torch.randn(batch, heads, seq_len_q, head_dim, dtype=dtype)
    k, v = (torch.randn(batch, heads, seq_len_k, head_dim, dtype=dtype) for _ in range(2))
    return [t.requires_grad_() for t in (q, k, v)]


def check_against_reference(q, k, v, *, causal: bool, masks: dict, tol: float, seed: int):
    o, lse = flash_attention(q, k, v, causal=causal, return_lse=True, **masks)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    visible = visibility(q, k, causal, masks)
    ref_o, ref_lse = reference_attention(q, k, v, visible)
    ref_grads = torch.autograd.grad(ref_o, (q, k, v), do.double())

    where = f"(seed {seed}, q {tuple(q.shape)}, k {tuple(k.shape)}, causal={causal}, masks {sorted(masks)})"
    assert o.shape == q.shape and lse.shape == q.shape[:3]
    empty_rows = ~visible.any(-1).expand(lse.shape)
    assert torch.equal(lse[empty_rows], ref_lse[empty_rows].float()), f"rows that see nothing: lse != -inf {where}"
    assert torch.isfinite(lse[~empty_rows]).all(), f"lse not finite where a row sees keys {where}"
    assert lse_err(lse[~empty_rows], ref_lse[~empty_rows]) < tol, f"lse {where}"
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), (ref_o, *ref_grads), strict=True):
        assert torch.isfinite(got).all(), f"{name} has non-finite values {where}"
        err = rel_err(got, want)
        assert err < tol, f"{name}: relative error {err:.2e} >= {tol} {where}"


# ----------------------------------------------------------------------------------------------------------
# dense_mask: the definition everything else is checked against, on examples small enough to read


def test_the_reference_refuses_a_causal_flag_beside_a_visibility_mask():
    """`visible` is the reference's whole mask; a causal flag beside it would be ignored, so it is refused."""
    q = k = v = torch.zeros(1, 1, 4, 8, dtype=torch.float64)
    visible = dense_mask(4, 4, causal=False)
    with pytest.raises(ValueError, match="causal rule inside `visible`"):
        reference_attention(q, k, v, visible, causal=True)
    o, _ = reference_attention(q, k, v, dense_mask(4, 4, causal=True))
    assert o.shape == q.shape


def test_dense_mask_hand_built_examples():
    rows = lambda m: m[0, 0].int().tolist()
    # Two queries are the last two of four keys: query i sits at position 2 + i.
    assert rows(dense_mask(2, 4, causal=True)) == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert rows(dense_mask(4, 4, causal=True, window_size=2)) == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0],
                                                                   [0, 0, 1, 1]]  # fmt: skip
    assert rows(dense_mask(3, 3, causal=False, window_size=2)) == [[1, 1, 0], [1, 1, 1], [0, 1, 1]]
    docs = torch.tensor([[0, 0, 1, 1, 1], [5, 6, 6, 6, 5]])
    m = dense_mask(3, 5, causal=True, document_ids=docs)
    assert m.shape == (2, 1, 3, 5)
    assert m[0, 0].int().tolist() == [[0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert m[1, 0].int().tolist() == [[0, 1, 1, 0, 0], [0, 1, 1, 1, 0], [1, 0, 0, 0, 1]]
    blocks = torch.tensor([[[True, False], [False, True]], [[False, True], [True, True]]])
    m = dense_mask(3, 3, causal=False, block_mask=blocks, block_size=2)
    assert m.shape == (1, 2, 3, 3)
    assert m[0, 0].int().tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    assert m[0, 1].int().tolist() == [[0, 0, 1], [0, 0, 1], [1, 1, 1]]


# ----------------------------------------------------------------------------------------------------------
# Against float64


@pytest.mark.parametrize(
    ("causal", "seq_len_q", "seq_len_k", "mask"),
    [
        (True, 77, 200, "none"),
        (False, 1, 77, "none"),
        (True, 1, 77, "none"),
        (True, 200, 200, "window"),
        (False, 77, 200, "window"),
        (True, 200, 200, "docs"),
        (False, 50, 77, "scattered_docs"),
        (True, 200, 200, "blocks"),
        (False, 77, 200, "shared_blocks"),
        (True, 77, 200, "odd_blocks"),
        (True, 77, 200, "window+docs+blocks"),
        (False, 200, 200, "window+scattered_docs+shared_blocks"),
    ],
)
def test_masks_match_float64_reference(causal, seq_len_q, seq_len_k, mask, seed):
    q, k, v = make_qkv(2, 2, seq_len_q, seq_len_k, 32)
    masks = make_masks(mask, 2, 2, seq_len_q, seq_len_k)
    check_against_reference(q, k, v, causal=causal, masks=masks, tol=FP32_TOL, seed=seed)


@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.bfloat16, 16), (torch.float16, 128)])
def test_masks_with_low_precision_and_other_head_dims(dtype, head_dim, seed):
    q, k, v = make_qkv(1, 2, 77, 130, head_dim, dtype)
    masks = make_masks("window+docs+blocks", 1, 2, 77, 130)
    check_against_reference(q, k, v, causal=True, masks=masks, tol=LOW_PRECISION_TOL, seed=seed)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")
def test_fully_masked_rows_give_zero_output_and_gradients(seed):
    """Query blocks whose block-mask row is empty see no key: o = 0, lse = −inf, dq = 0, and nothing NaN."""
    q, k, v = make_qkv(1, 2, 100, 100, 32)
    block_mask = random_block_mask(2, 100, 100, 32, 0.6)
    block_mask[0, 1] = False
    block_mask[1, 3] = False  # the ragged last block (rows 96..99)
    masks = dict(block_mask=block_mask, block_size=32)
    check_against_reference(q, k, v, causal=False, masks=masks, tol=FP32_TOL, seed=seed)
    o, lse = flash_attention(q, k, v, causal=False, return_lse=True, **masks)
    (dq,) = torch.autograd.grad(o.sum(), q)
    for h, rows in ((0, slice(32, 64)), (1, slice(96, 100))):
        assert (o[0, h, rows] == 0).all() and (dq[0, h, rows] == 0).all(), f"seed {seed}"
        assert (lse[0, h, rows] == float("-inf")).all(), f"seed {seed}"


# ----------------------------------------------------------------------------------------------------------
# Work skipped is real: count the tile products the interpreter executes


@pytest.fixture
def count_dots(monkeypatch):
    """A counter of the interpreter's tl.dot calls (every matrix product of every program)."""
    from triton.runtime import interpreter

    calls = {"n": 0}
    original = interpreter.interpreter_builder.create_dot

    def counted(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(interpreter.interpreter_builder, "create_dot", counted)
    return calls


def tiles_with_visible_pairs(visible: torch.Tensor, rows: int, cols: int, batch: int, heads: int) -> int:
    """Over all (batch, head), the (rows × cols) tiles of the (Tq, Tk) mask that hold at least one visible pair."""
    visible = visible.expand(batch, heads, *visible.shape[2:])
    tq, tk = visible.shape[2:]
    padded = torch.zeros(batch, heads, math.ceil(tq / rows) * rows, math.ceil(tk / cols) * cols, dtype=torch.bool)
    padded[:, :, :tq, :tk] = visible
    tiled = padded.view(batch, heads, padded.shape[2] // rows, rows, padded.shape[3] // cols, cols)
    return int(tiled.any(dim=(3, 5)).sum())


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused", "deterministic"])
@pytest.mark.parametrize(
    ("causal", "seq_len_q", "seq_len_k", "mask"),
    [(True, 160, 256, "window"), (False, 256, 256, "window"), (True, 256, 256, "docs"), (True, 96, 256, "blocks")],
)
def test_only_tiles_with_visible_pairs_are_computed(
    causal, seq_len_q, seq_len_k, mask, deterministic, count_dots, seed
):
    """Each pass runs its products on exactly the tiles that hold a visible pair (2 per tile forward; backward 5
    fused, or 4 for dK/dV and 3 for dQ), so time falls with the kept fraction; and fewer than the dense (causal)
    kernel does."""
    batch, heads = 2, 2
    q, k, v = make_qkv(batch, heads, seq_len_q, seq_len_k, 16)
    masks = make_masks(mask, batch, heads, seq_len_q, seq_len_k)
    visible = visibility(q, k, causal, masks)
    params = AttentionParams(causal, 0.0, 1.0)
    block_size = masks.get("block_size") if "block_mask" in masks else None

    def tiles(kernel_pass: str, visible: torch.Tensor) -> int:
        cfg = tuned_config(kernel_pass, q, params, seq_len_k=seq_len_k, block_size=block_size)
        return tiles_with_visible_pairs(visible, cfg.block_m, cfg.block_n, batch, heads)

    expected_fwd = 2 * tiles("fwd", visible)
    if deterministic:
        expected_bwd = 4 * tiles("bwd_dkdv", visible) + 3 * tiles("bwd_dq", visible)
    else:
        expected_bwd = 5 * tiles("bwd_fused", visible)

    o = flash_attention(q, k, v, causal=causal, deterministic=deterministic, **masks)
    forward_dots = count_dots["n"]
    torch.autograd.grad(o.sum(), (q, k, v))
    backward_dots = count_dots["n"] - forward_dots
    assert (forward_dots, backward_dots) == (expected_fwd, expected_bwd), f"seed {seed}"

    assert forward_dots < 2 * tiles("fwd", visibility(q, k, causal, {})), f"the mask skipped nothing (seed {seed})"


# ----------------------------------------------------------------------------------------------------------
# Dropout under masks


def recover_keep_mask(batch, heads, seq_len_q, seq_len_k, head_dim, causal, masks, p, rng_seed):
    """The kernel's keep-mask (at visible pairs) for the call made right after torch.manual_seed(rng_seed)."""
    return recover_dropout_mask(
        lambda q, k, v: flash_attention(q, k, v, causal=causal, dropout_p=p, **masks),
        (batch, heads, seq_len_q, head_dim), seq_len_k, rng_seed,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("causal", "mask"),
    [(True, "window"), (False, "docs"), (True, "blocks"), (True, "odd_blocks"), (False, "window+docs+shared_blocks")],
)
def test_dropout_under_masks(causal, mask, seed):
    """The keep-mask does not depend on the masks (same seed, same decisions where a pair is visible), and o and
    dq, dk, dv equal the float64 reference under the recovered mask, so forward and backward agree."""
    batch, heads, seq_len_q, seq_len_k, head_dim, p = 1, 2, 50, 100, 128, 0.3
    masks = make_masks(mask, batch, heads, seq_len_q, seq_len_k)
    q, k, v = make_qkv(batch, heads, seq_len_q, seq_len_k, head_dim)
    visible = visibility(q, k, causal, masks).expand(batch, heads, seq_len_q, seq_len_k)
    keep = recover_keep_mask(batch, heads, seq_len_q, seq_len_k, head_dim, causal, masks, p, seed)
    keep_unmasked = recover_keep_mask(batch, heads, seq_len_q, seq_len_k, head_dim, False, {}, p, seed)
    assert not (keep & ~visible).any(), f"dropout kept a masked pair (seed {seed})"
    assert torch.equal(keep, keep_unmasked & visible), f"the masks changed the dropout decisions (seed {seed})"

    torch.manual_seed(seed)
    o = flash_attention(q, k, v, causal=causal, dropout_p=p, **masks)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref_o, _ = reference_attention(q, k, v, visible, keep=keep, keep_scale=keep_scale(p))
    ref_grads = torch.autograd.grad(ref_o, (q, k, v), do.double())
    assert rel_err(o, ref_o) < FP32_TOL, f"seed {seed}"
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True):
        assert rel_err(got, want) < FP32_TOL, f"{name} disagrees with the forward's mask (seed {seed})"


@pytest.mark.parametrize("deterministic", [False, True], ids=["fused", "deterministic"])
def test_both_loop_forms_match_the_reference(monkeypatch, deterministic, seed):
    """A masked pass walks its masked, mask-free and masked runs of tiles in one loop or in three (`launch.one_loop`
    picks by pass, mask and length, so small CPU shapes alone would leave some forms untested): each form, in every
    pass and both backward schedules, matches float64; with dropout the two forms agree to rounding."""
    batch, heads, seq_len_q, seq_len_k = 2, 2, 77, 200
    masks = make_masks("window+docs+blocks", batch, heads, seq_len_q, seq_len_k)
    q, k, v = make_qkv(batch, heads, seq_len_q, seq_len_k, 32)
    do = torch.randn(q.shape)
    ref_o, _ = reference_attention(q, k, v, visibility(q, k, True, masks))
    ref_grads = torch.autograd.grad(ref_o, (q, k, v), do.double())

    def run(one_loop: bool, dropout_p: float) -> list[torch.Tensor]:
        monkeypatch.setattr(launch, "one_loop", lambda kernel_pass, masks, dropout, seq_len_k: one_loop and masks.any)
        torch.manual_seed(seed)
        o = flash_attention(q, k, v, dropout_p=dropout_p, deterministic=deterministic, **masks)
        return [o, *torch.autograd.grad(o, (q, k, v), do)]

    names = ("o", "dq", "dk", "dv")
    for one_loop in (True, False):
        for name, got, want in zip(names, run(one_loop, 0.0), (ref_o, *ref_grads), strict=True):
            assert rel_err(got, want) < FP32_TOL, f"{name}, one_loop={one_loop} (seed {seed})"
    for name, a, b in zip(names, run(True, 0.3), run(False, 0.3), strict=True):
        assert rel_err(a, b) < FP32_TOL, f"{name} with dropout: the loop forms disagree (seed {seed})"


# ----------------------------------------------------------------------------------------------------------
# As a PyTorch operator


def test_masks_through_the_operator_and_torch_compile(seed):
    """opcheck (schema, fake tensors, autograd registration) with every mask given, and a fullgraph compile whose
    output and gradients equal eager's (the masks are operator arguments, Tq < Tk under dynamic shapes)."""
    q, k, v = make_qkv(2, 2, 24, 40, 32)
    masks = make_masks("window+docs+blocks", 2, 2, 24, 40)
    args = flash_mask(24, 40, head_dim=32, dtype=q.dtype, **masks).operator_args()
    torch.library.opcheck(flash_attention_forward, (q, k, v, None, True, 0.0, None, *args))
    o, lse = flash_attention_forward(q, k, v, None, True, 0.0, None, *args)
    detached = [t.detach() for t in (q, k, v, o, lse)]
    torch.library.opcheck(
        flash_attention_backward, (torch.randn_like(o), *detached, None, None, True, 0.0, None, *args)
    )

    def attend(q, k, v, document_ids, block_mask):
        return flash_attention(q, k, v, window_size=33, document_ids=document_ids, block_mask=block_mask, block_size=32)

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True, dynamic=True)
    eager_o = attend(q, k, v, masks["document_ids"], masks["block_mask"])
    compiled_o = compiled(q, k, v, masks["document_ids"], masks["block_mask"])
    do = torch.randn_like(eager_o)
    for got, want in zip(
        torch.autograd.grad(compiled_o, (q, k, v), do), torch.autograd.grad(eager_o, (q, k, v), do), strict=True
    ):
        assert torch.equal(got, want), f"seed {seed}"
    assert torch.equal(compiled_o, eager_o), f"seed {seed}"


# ----------------------------------------------------------------------------------------------------------
# Masks built once (flash_mask) and handed to every call


@pytest.mark.parametrize(
    ("causal", "seq_len_q", "seq_len_k", "mask", "dropout_p"),
    [
        (True, 77, 200, "window+docs+blocks", 0.0),
        (False, 50, 77, "scattered_docs+odd_blocks", 0.0),
        (True, 100, 100, "docs+shared_blocks", 0.25),
    ],
)
def test_prebuilt_mask_gives_the_keyword_masks_results_bit_for_bit(causal, seq_len_q, seq_len_k, mask, dropout_p, seed):
    """o, lse, dq, dk and dv of calls with one flash_mask equal those of the same call with the masks as keyword
    arguments exactly: the same tiles read the same schedules. Two calls reuse the mask, as a model's layers do."""
    batch, heads, head_dim = 2, 2, 32
    q, k, v = make_qkv(batch, heads, seq_len_q, seq_len_k, head_dim)
    masks = make_masks(mask, batch, heads, seq_len_q, seq_len_k)
    built = flash_mask(seq_len_q, seq_len_k, head_dim=head_dim, dtype=q.dtype, causal=causal, dropout_p=dropout_p,
                       **masks)  # fmt: skip
    do = torch.randn(q.shape)

    def run(**kwargs) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(seed)
        o, lse = flash_attention(q, k, v, causal=causal, dropout_p=dropout_p, return_lse=True, **kwargs)
        return (o, lse, *torch.autograd.grad(o, (q, k, v), do))

    want = run(**masks)
    for call in range(2):
        for name, got, expected in zip(("o", "lse", "dq", "dk", "dv"), run(mask=built), want, strict=True):
            assert torch.equal(got, expected), f"{name} differs in call {call} (seed {seed}, {mask})"


def test_prebuilt_mask_under_torch_compile(seed):
    """A mask built outside the compiled function and passed in: fullgraph, static and dynamic shapes, eager's
    output and gradients exactly."""
    q, k, v = make_qkv(2, 2, 24, 40, 32)
    built = flash_mask(24, 40, head_dim=32, dtype=q.dtype, **make_masks("window+docs+blocks", 2, 2, 24, 40))

    def attend(q, k, v, mask):
        return flash_attention(q, k, v, mask=mask)

    eager_o = attend(q, k, v, built)
    do = torch.randn_like(eager_o)
    eager_grads = torch.autograd.grad(eager_o, (q, k, v), do)
    for dynamic in (False, True):
        torch._dynamo.reset()
        compiled_o = torch.compile(attend, backend="aot_eager", fullgraph=True, dynamic=dynamic)(q, k, v, built)
        assert torch.equal(compiled_o, eager_o), f"dynamic={dynamic} (seed {seed})"
        for got, want in zip(torch.autograd.grad(compiled_o, (q, k, v), do), eager_grads, strict=True):
            assert torch.equal(got, want), f"dynamic={dynamic} (seed {seed})"


@pytest.mark.parametrize("seed", range(3))
def test_document_ids_reach_the_kernels_as_int32_with_the_same_equalities(seed):
    """The kernels compare 32-bit ids: a built mask's ids are int32 and equal exactly where the given ones are,
    for int64 ids beyond int32's range, negative ones, and documents that come back after another."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor([-(2**62), -7, 0, 2**31, 2**40 + 3, 2**62])
    ids = labels[torch.randint(len(labels), (3, 61), generator=generator)]
    mask = FlashMask.build(61, 61, (("queries", 16, 16),), document_ids=ids)
    got = mask.document_ids
    assert got.dtype == torch.int32 and got.is_contiguous()
    assert torch.equal(got[:, :, None] == got[:, None, :], ids[:, :, None] == ids[:, None, :])


def test_schedule_tensors_start_16_byte_aligned():
    """Each tiling's tensors are views into one packed schedule, each starting on a 16-byte boundary as a tensor of
    its own would (Triton specialises on pointer alignment), with the shapes of their tiling."""
    docs = random_documents(2, 77, mean_len=20)
    block_mask = random_block_mask(3, 50, 77, 24, 0.5)
    tiles = (("queries", 16, 32), ("keys", 32, 16), ("queries", 16, 16))
    built = FlashMask.build(50, 77, tiles, document_ids=docs, block_mask=block_mask, block_size=24)
    assert built.schedule.data_ptr() % 16 == 0
    for rows, row_tile, col_tile in tiles:
        cfg = LaunchConfig(row_tile, col_tile, 1, 1) if rows == "queries" else LaunchConfig(col_tile, row_tile, 1, 1)
        schedule = built.tile_schedule("fwd" if rows == "queries" else "bwd_dkdv", cfg)
        n_rows = math.ceil((50 if rows == "queries" else 77) / row_tile)
        n_cols = math.ceil((77 if rows == "queries" else 50) / col_tile)
        assert schedule.ranges.shape == (2, n_rows, 4)
        assert schedule.counts.shape == (3, n_rows) and schedule.indices.shape == (3, n_rows, n_cols)
        # Tiles of keys also carry the order their programs start in.
        assert (schedule.order is None) == (rows == "queries")
        pieces = (schedule.ranges, schedule.counts, schedule.indices)
        if schedule.order is not None:
            assert schedule.order.shape == (n_rows + 1,)
            pieces += (schedule.order,)
        for t in pieces:
            assert t.data_ptr() % 16 == 0 and t.is_contiguous(), (rows, row_tile, col_tile)


def test_long_walks_start_first():
    """A key tile's programs start first, for every head, when its walk over query tiles is more than twice the
    mean: local + global's first key tiles (every query sees them), longest first; the rest keep their order. A
    pattern of even walks (strided) keeps its order; per-head masks take each tile's longest walk; and the order
    is always a permutation of the key tiles."""
    n_blocks = 16  # 128-token blocks, T = 2048, tiles of 64 keys: two tiles a block

    def order(block_mask: torch.Tensor) -> tuple[int, list[int]]:
        built = FlashMask.build(2048, 2048, (("keys", 64, 64),), block_mask=block_mask, block_size=128)
        walk_order = built.tile_schedule("bwd_dkdv", LaunchConfig(64, 64, 1, 1)).order.tolist()
        assert sorted(walk_order[1:]) == list(range(2 * n_blocks))
        return walk_order[0], walk_order[1:]

    assert order(local_global_blocks(n_blocks, local_blocks=2)) == (2, list(range(32)))
    assert order(strided_blocks(n_blocks, stride=4)) == (0, list(range(32)))
    # Per head: in head 1 every query block from 5 on also sees key block 5 (walks of 22 tiles, against 32 for
    # block 0 and 2-4 for the rest).
    per_head = local_global_blocks(n_blocks, local_blocks=2).repeat(2, 1, 1)
    per_head[1, 5:, 5] = True
    assert order(per_head) == (4, [0, 1, 10, 11] + [t for t in range(32) if t not in (0, 1, 10, 11)])
    gen = torch.Generator().manual_seed(0)
    for density in (0.05, 0.3, 1.0):
        order(torch.rand(3, n_blocks, n_blocks, generator=gen) < density)


def test_a_mask_built_for_another_call_raises(monkeypatch):
    """A mask used with other shapes, batch, tiles (another dtype, where the tiles depend on it) or with gradients
    it was not built for fails naming the mismatch, never computes a wrong answer; so do the operators given a
    schedule that lacks their tiles or has the wrong length."""
    q, kv = torch.randn(2, 2, 48, 32, requires_grad=True), torch.randn(2, 2, 64, 32)
    docs = random_documents(2, 64, mean_len=20)
    built = flash_mask(48, 64, head_dim=32, dtype=torch.float32, document_ids=docs)
    flash_attention(q, kv, kv, mask=built)  # a call it fits is remembered; the calls below must still fail
    with pytest.raises(ValueError, match=r"mask was built for Tq=48, Tk=64, but q has Tq=64"):
        flash_attention(kv, kv, kv, mask=built)
    with pytest.raises(ValueError, match=r"document_ids must have shape \(B, Tk\) = \(1, 64\)"):
        flash_attention(q[:1], kv[:1], kv[:1], mask=built)
    with pytest.raises(ValueError, match="either built"):
        flash_attention(q, kv, kv, mask=built, window_size=8)
    with pytest.raises(TypeError, match="mask must be a FlashMask"):
        flash_attention(q, kv, kv, mask=docs)
    forward_only = flash_mask(48, 64, head_dim=32, dtype=torch.float32, document_ids=docs, backward=False)
    with torch.no_grad():
        flash_attention(q, kv, kv, mask=forward_only)
    with pytest.raises(ValueError, match="backward=False"):
        flash_attention(q, kv, kv, mask=forward_only)

    detached = q.detach()
    other_tiles = FlashMask.build(48, 64, (("queries", 16, 16),), document_ids=docs)
    with pytest.raises(
        ValueError, match=r"fwd pass launches with the tiles queries \d+x\d+, but .* holds queries 16x16"
    ):
        flash_attention_forward(detached, kv, kv, None, True, 0.0, None, *other_tiles.operator_args())
    window, ids, block_mask, block_size, schedule, tiles = built.operator_args()
    with pytest.raises(ValueError, match="it was built for other masks or shapes"):
        flash_attention_forward(detached, kv, kv, None, True, 0.0, None, window, ids, block_mask, block_size,
                                schedule[:-4], tiles)  # fmt: skip
    with pytest.raises(ValueError, match="need their tile schedule"):
        flash_attention_forward(detached, kv, kv, None, True, 0.0, None, None, docs)

    # On a GPU the tuned tiles depend on the dtype: a float32 mask cannot serve a bfloat16 call there.
    tuned = launch.launch_config
    bf16_tiles = lambda *args, **kwargs: LaunchConfig(16, 16, 1, 1) if args[2] == "bfloat16" else tuned(*args, **kwargs)
    monkeypatch.setattr(launch, "launch_config", bf16_tiles)
    with pytest.raises(ValueError, match=r"launches with the tiles queries 16x16.*build the mask"):
        flash_attention(detached.bfloat16(), kv.bfloat16(), kv.bfloat16(), mask=built)


# ----------------------------------------------------------------------------------------------------------
# Bad input


def test_mask_errors_name_the_problem():
    q, kv = torch.randn(2, 2, 16, 32), torch.randn(2, 2, 40, 32)
    call = lambda **kw: flash_attention(q, kv, kv, **kw)
    with pytest.raises(ValueError, match="Tq <= Tk"):
        flash_attention(kv, q, q)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="window_size"):
            call(window_size=bad)
    with pytest.raises(TypeError, match="document_ids must be an integer"):
        call(document_ids=torch.zeros(2, 40))
    with pytest.raises(ValueError, match=r"document_ids must have shape \(B, Tk\) = \(2, 40\)"):
        call(document_ids=torch.zeros(2, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"document_ids must have shape"):
        call(document_ids=torch.zeros(1, 40, dtype=torch.long))
    with pytest.raises(TypeError, match="block_mask must be a bool"):
        call(block_mask=torch.ones(1, 1, 3), block_size=16)
    with pytest.raises(ValueError, match=r"block_mask must have shape .* \(2 or 1, 1, 3\)"):
        call(block_mask=torch.ones(1, 1, 2, dtype=torch.bool), block_size=16)
    with pytest.raises(ValueError, match=r"block_mask must have shape"):
        call(block_mask=torch.ones(3, 1, 3, dtype=torch.bool), block_size=16)
    with pytest.raises(ValueError, match="block_size must be an int >= 1"):
        call(block_mask=torch.ones(1, 1, 1, dtype=torch.bool), block_size=0)
    with pytest.raises(ValueError, match="document_ids is on meta"):
        call(document_ids=torch.zeros(2, 40, dtype=torch.long, device="meta"))


# ----------------------------------------------------------------------------------------------------------
# scripts/bench_masks.py on the CPU


def test_bench_masks_check_only_and_visible_pair_count(tmp_path):
    """The benchmark's checks pass through the interpreter, and its chunked count of visible pairs (the FLOPs
    behind every TFLOP/s it reports) equals a plain count over the whole dense mask."""
    import bench_masks  # scripts/bench_masks.py, on pytest's pythonpath; imported here, after the kernels

    profile = bench_masks.Profile("cpu", torch.float32, block_size=32, check_seq_len=160, dropout_check_seq_len=96)
    for name in bench_masks.MASKS:
        case = bench_masks.build_case(name, 300, 2, profile)
        whole = dense_mask(300, 300, causal=True, **case.flash_kwargs).expand(2, bench_masks.HEADS, 300, 300)
        assert bench_masks.visible_pairs(300, 2, bench_masks.HEADS, case.flash_kwargs, "cpu", chunk=64) == int(
            whole.sum()
        ), name

    out = tmp_path / "masks.json"
    assert bench_masks.main(["--check-only", "--masks", "documents,butterfly", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["check"]["passed"] and report["rows"] == []
    checked = [r["check"] for r in report["check"]["results"]]
    assert checked == ["dense T=160", "documents T=160", "butterfly T=160", "documents dropout 0.1 T=96",
                       "butterfly dropout 0.1 T=96"]  # fmt: skip


def test_bench_masks_checks_every_mask_at_each_length_the_profile_names(monkeypatch):
    """On the GPU the checks also run at 16K, without and with dropout (where masked calls take the fused backward's
    dQ warpgroup): each mask at every length its profile names, and one failed check fails the run."""
    import bench_masks

    seen = []
    monkeypatch.setattr(bench_masks, "check_mask", lambda m, t, *_: seen.append((m, t)) or {"passed": True})
    monkeypatch.setattr(bench_masks, "check_dropout", lambda m, t, *_: seen.append((m, "dropout", t)) or {
        "passed": (m, t) != ("strided", 512)})  # fmt: skip
    profile = bench_masks.Profile("cpu", torch.float32, block_size=32, check_seq_len=128, dropout_check_seq_len=96,
                                  long_check_seq_len=256, long_dropout_check_seq_len=512)  # fmt: skip
    report = bench_masks.run_checks(["dense", "documents", "strided"], profile, with_flex=False)
    assert seen == [("dense", 128), ("documents", 128), ("strided", 128), ("dense", 256), ("documents", 256),
                    ("strided", 256), ("documents", "dropout", 96), ("strided", "dropout", 96),
                    ("documents", "dropout", 512), ("strided", "dropout", 512)]  # fmt: skip
    assert [r["check"] for r in report["results"]][-1] == "strided dropout 0.1 T=512"
    assert not report["passed"]
