"""The launch-configuration lookup: the committed H100 table covers what the benchmark and GPT-2 run, and every entry
is a valid configuration."""

import functools
import itertools

import pytest
import torch
import tune_attention  # scripts/tune_attention.py, on pytest's pythonpath

from flashgpt.kernels.tile_schedule import tile_key
from flashgpt.kernels.tuning import (
    _DEFAULTS,
    HOPPER_PASSES,
    NATIVE_HEAD_DIMS,
    PASSES,
    SEQ_LEN_BUCKETS,
    LaunchConfig,
    _tuned_file,
    _tuned_table,
    backward_schedule,
    hopper_config,
    launch_config,
    nearest_hopper_config,
    seq_len_bucket,
    table_key,
)


def _schedule_args(key: str) -> tuple:
    """backward_schedule's positional arguments for a table key, backward/d64/bfloat16/causal/nodrop/T4096."""
    _, d, dtype, mask, drop, bucket = key.split("/")
    return int(d[1:]), dtype, mask == "causal", drop == "drop", int(bucket[1:])


def test_backward_schedule_follows_the_measured_table():
    """On Hopper the tuner's choice for every tuned shape, split where it measured nothing (other GPUs, untuned
    shapes); fused in the interpreter. fp16 shares bf16's measurements."""
    choices = _tuned_file()["backward"]
    assert choices and set(choices.values()) <= {"fused", "split"}
    for key, choice in choices.items():
        args = _schedule_args(key)
        assert backward_schedule(*args, interpreting=False, hopper=True) == choice, key
        assert backward_schedule(*args, interpreting=False, hopper=False) == "split"
        assert backward_schedule(*args, interpreting=True, hopper=False) == "fused"
        if args[1] == "bfloat16":
            assert backward_schedule(args[0], "float16", *args[2:], interpreting=False, hopper=True) == choice
    assert backward_schedule(64, "float32", True, False, 4096, interpreting=False, hopper=True) == "split"


def test_document_masks_take_their_own_measured_backward_where_there_is_one():
    documents = _tuned_file()["backward_documents"]
    assert documents and set(documents.values()) <= {"fused", "split"}
    for key, choice in documents.items():
        args = _schedule_args(key)
        assert backward_schedule(*args, documents=True, interpreting=False, hopper=True) == choice, key
        assert backward_schedule(*args, documents=True, interpreting=False, hopper=False) == "split"
    # Shapes measured without documents only keep that choice.
    plain = _tuned_file()["backward"]
    untouched = [key for key in plain if key not in documents]
    assert untouched
    for key in untouched:
        choice = backward_schedule(*_schedule_args(key), documents=True, interpreting=False, hopper=True)
        assert choice == plain[key], key


def test_non_causal_calls_take_the_causal_entries():
    """The tuner measures causal attention only: a non-causal call takes the causal entry of its shape, for the
    backward's schedule, the Triton passes' configurations and the Gluon passes' (where the causal table has one)."""
    file = _tuned_file()
    for key, choice in file["backward"].items():
        head_dim, dtype, causal, dropout, bucket = _schedule_args(key)
        assert causal and backward_schedule(head_dim, dtype, False, dropout, bucket, interpreting=False, hopper=True)
        assert backward_schedule(head_dim, dtype, False, dropout, bucket, interpreting=False, hopper=True) == choice
    for kernel_pass in HOPPER_PASSES:
        for key in file[kernel_pass]:
            _, d, dtype, _, drop, bucket = key.split("/")
            args = (kernel_pass, int(d[1:]), dtype)
            want = hopper_config(*args, True, drop == "drop", int(bucket[1:]))
            assert want is not None and hopper_config(*args, False, drop == "drop", int(bucket[1:])) == want, key
    for key, cfg in _tuned_table().items():
        kernel_pass, d, dtype, _, drop, bucket = key.split("/")
        args = (kernel_pass, int(d[1:]), dtype, False, drop == "drop", int(bucket[1:]))
        assert launch_config(*args, interpreting=False, hopper=True) == cfg, key
    assert not any("/full/" in key for table in ("backward", *HOPPER_PASSES) for key in file[table])


def test_seq_len_buckets():
    assert [seq_len_bucket(t) for t in (1, 1024, 1025, 4096, 16384, 100_000)] == [1024, 1024, 2048, 4096, 16384, 16384]


@pytest.mark.parametrize("kernel_pass", PASSES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dropout", [False, True])
def test_table_covers_the_tuned_shapes(kernel_pass, head_dim, dropout):
    table = _tuned_table()
    for bucket in SEQ_LEN_BUCKETS:
        key = table_key(kernel_pass, head_dim, "bfloat16", True, dropout, bucket)
        assert key in table, f"{key} missing from kernels/tuned_h100.json"
        table[key].validate(kernel_pass)


def test_lookup_uses_the_table_on_hopper_only():
    args = ("fwd", 64, "bfloat16", True, False, 2048)
    tuned = _tuned_table()[table_key(*args[:5], 2048)]
    assert launch_config(*args, interpreting=False, hopper=True) == tuned
    assert launch_config(*args, interpreting=False, hopper=False) == _DEFAULTS[("fwd", 64)]
    # fp16 shares the bf16 measurements; fp32 and untuned shapes fall back to defaults that validate.
    assert launch_config("fwd", 64, "float16", True, False, 2048, interpreting=False, hopper=True) == tuned
    for kernel_pass in PASSES:
        for head_dim in NATIVE_HEAD_DIMS:
            for dtype in ("float32", "bfloat16"):
                cfg = launch_config(kernel_pass, head_dim, dtype, False, False, 300, interpreting=False, hopper=False)
                cfg.validate(kernel_pass)


def test_validate_refuses_tiles_the_kernels_cannot_run():
    LaunchConfig(64, 16, 4, 3).validate("fwd")
    with pytest.raises(ValueError, match="tile 8 must be a power of two >= 16"):
        LaunchConfig(64, 8, 4, 3).validate("fwd")  # tl.dot and a dropout draw need 16 columns
    with pytest.raises(ValueError, match="tile 48 must be a power of two"):
        LaunchConfig(48, 16, 4, 3).validate("fwd")
    with pytest.raises(ValueError, match="tile 64 must divide tile 32"):
        LaunchConfig(64, 32, 4, 3).validate("bwd_dkdv")


def test_configuration_text_and_table_form():
    """The profiling scripts' BLOCK_M,BLOCK_N,WARPS,STAGES[,tma][,maxnreg=N] and the table's dictionaries, which
    carry maxnreg only where it is set (the committed table predates it)."""
    cfg = LaunchConfig.parse("64,128,8,2,tma,maxnreg=168")
    assert cfg == LaunchConfig(64, 128, 8, 2, tma=True, maxnreg=168)
    assert LaunchConfig(**cfg.as_dict()) == cfg
    assert LaunchConfig.parse("32,64,4,3").as_dict() == dict(
        block_m=32, block_n=64, num_warps=4, num_stages=3, tma=False
    )
    with pytest.raises(ValueError, match="unknown field 'tme'"):
        LaunchConfig.parse("64,64,4,3,tme")
    with pytest.raises(ValueError, match="expected BLOCK_M,BLOCK_N,WARPS,STAGES"):
        LaunchConfig.parse("64,64,4")


@pytest.mark.parametrize("kernel_pass", PASSES)
def test_tuning_candidates_cover_every_native_head_dim(kernel_pass):
    """scripts/tune_attention.py tries valid configurations at every native head dim, the default among them, so
    a tuned entry is never slower than what an untuned shape gets."""
    for head_dim in NATIVE_HEAD_DIMS:
        tried = tune_attention.candidates(kernel_pass, head_dim)
        for cfg in tried:
            cfg.validate(kernel_pass)
        default = launch_config(kernel_pass, head_dim, "bfloat16", True, False, 4096, interpreting=False, hopper=False)
        assert default in tried, f"{kernel_pass} D={head_dim}: default {default} is not a candidate"


# What each Gluon pass's tiles must divide: the forward's math warpgroups own 64 query rows each, and the dK/dV
# pass's 64 keys each (one to three warpgroups, so at most 192 rows); the dK/dV pass's producer warp loads a query
# tile's LSE and δ 32 lanes wide; the dQ pass's warps split the query rows. The fused pass has one or two
# warpgroups of 64 keys, and at D = 64 its fifth product has a query tile as its rows (a warpgroup product's 64).
_TILE_UNITS = {
    "fwd_hopper": lambda cfg: (64, 16),
    "bwd_dkdv_hopper": lambda cfg: (32, 64),
    "bwd_dq_hopper": lambda cfg: (16 * cfg["num_warps"], 16),
    "bwd_fused_hopper": lambda cfg: (32, 64),
}
_WARPGROUP_ROWS = {"fwd_hopper": "block_m", "bwd_dkdv_hopper": "block_n", "bwd_fused_hopper": "block_n"}
# The dropout at which these tests run each pass at GPT-2's head dim and 16K: the fused Gluon backward with dropout,
# the call whose tiles masks change most (without dropout it takes dense calls too, with a dQ warpgroup).
_GPT2_DROPOUT = {"bwd_fused_hopper": 0.1}


@pytest.mark.parametrize("kernel_pass", HOPPER_PASSES)
def test_a_gluon_pass_is_taken_only_where_the_table_measured_it_faster(kernel_pass):
    """Dense, with or without dropout (each pass draws its own mask), at the T buckets and head dims of the table's
    section for the pass (bf16, and fp16 with the same tiles; non-causal calls take the causal entries); never at a
    shape it does not list (where the Triton pass measured faster or even), nor in fp32."""
    entries = _tuned_file()[kernel_pass]
    assert entries
    for key, cfg in entries.items():
        name, d, dtype, mask, drop, bucket = key.split("/")
        assert (name, dtype, mask) == (kernel_pass, "bfloat16", "causal"), key
        assert cfg["maxnreg"] and cfg["tma"], key  # the program's register cap (programs an SM); descriptor tiles
        unit_m, unit_n = _TILE_UNITS[kernel_pass](cfg)
        assert cfg["block_m"] % unit_m == 0 and cfg["block_n"] % unit_n == 0, key
        if kernel_pass in _WARPGROUP_ROWS:
            assert cfg[_WARPGROUP_ROWS[kernel_pass]] <= 3 * 64, key
        if kernel_pass == "bwd_fused_hopper":
            assert cfg["block_n"] <= 2 * 64, key
            assert int(d[1:]) > 64 or cfg["block_m"] % 64 == 0, key
        head_dim, dropout, seq_len = int(d[1:]), drop == "drop", int(bucket[1:])
        expected = LaunchConfig(**cfg)
        assert hopper_config(kernel_pass, head_dim, "bfloat16", True, dropout, seq_len) == expected, key
        assert hopper_config(kernel_pass, head_dim, "float16", True, dropout, seq_len) == expected, key
        assert hopper_config(kernel_pass, head_dim, "bfloat16", False, dropout, seq_len) == expected, key  # shared
        assert hopper_config(kernel_pass, head_dim, "float32", True, dropout, seq_len) is None
    for head_dim, dropout, seq_len in itertools.product((64, 128), (False, True), SEQ_LEN_BUCKETS):
        listed = table_key(kernel_pass, head_dim, "bfloat16", True, dropout, seq_len) in entries
        assert (hopper_config(kernel_pass, head_dim, "bfloat16", True, dropout, seq_len) is not None) == listed
    gpt2_dropout = kernel_pass in _GPT2_DROPOUT
    assert hopper_config(kernel_pass, 64, "bfloat16", True, gpt2_dropout, 16384) is not None  # GPT-2's at long T


@pytest.mark.parametrize("kernel_pass", HOPPER_PASSES)
def test_a_call_takes_a_gluon_pass_only_for_the_masks_it_holds_a_schedule_for_and_when_descriptors_fit(
    monkeypatch, kernel_pass
):
    """`launch.hopper_launch_config` on a Hopper GPU outside the interpreter (both simulated: CPU tensors stand in,
    the decision reads only shapes, strides, addresses, dtype and options): the table's configuration for a dense
    causal bf16 or fp16 call at 16K (for the fused backward, with dropout); also under a causal sliding window, and
    under document ids and a block mask where the mask holds a schedule for the pass's tiling (fitted to the blocks:
    `launch.fit_gluon_to_blocks`); None for masks without causal, fp32, a T the table does not list, or tensors a
    tensor descriptor cannot address (O included: the forward stores it, the backward reads it); None on other GPUs,
    in the interpreter, and with a Triton release other than the tested one (which imports no Gluon kernel)."""
    from dataclasses import replace

    from flashgpt.kernels import launch

    monkeypatch.setattr(launch, "is_hopper", lambda device: True)
    monkeypatch.setattr(launch, "interpreting", lambda: False)

    gpt2_dropout = _GPT2_DROPOUT.get(kernel_pass, 0.0)

    def decide(
        seq_len=16384,
        dtype=torch.bfloat16,
        dropout=gpt2_dropout,
        masks=launch.NO_MASKS,
        layout=None,
        o_layout=None,
        causal=True,
    ):
        q, k, v, o, do = (torch.zeros(1, 2, seq_len, 64, dtype=dtype) for _ in range(5))
        if layout is not None:
            q = layout(q)
        if o_layout is not None:
            o = o_layout(o)
        params = launch.AttentionParams(causal, dropout, 0.125)
        if kernel_pass == "fwd_hopper":
            do = None
        return launch.hopper_launch_config(kernel_pass, q, k, v, o, do, params, masks)

    expected = hopper_config(kernel_pass, 64, "bfloat16", True, gpt2_dropout > 0, 16384)
    assert expected is not None and decide() == expected
    assert decide(dtype=torch.float16) == expected
    assert decide(dtype=torch.float32) is None
    for dropout in (0.0, 0.1):  # the table decides the T (it lists some buckets and not others) and the dropout
        listed = [hopper_config(kernel_pass, 64, "bfloat16", True, dropout > 0, seq_len) for seq_len in SEQ_LEN_BUCKETS]
        assert [decide(seq_len=seq_len, dropout=dropout) for seq_len in SEQ_LEN_BUCKETS] == listed
    window = replace(launch.NO_MASKS, window_size=256)
    assert decide(masks=window, causal=False) is None
    documents = replace(launch.NO_MASKS, document_ids=torch.zeros(1, 16384, dtype=torch.int32))
    assert decide(masks=documents) is None  # no schedule for the pass's tiling
    if expected is not None and kernel_pass in launch.GLUON_PASSES.values():
        # Under masks programs of three math warpgroups drop to one (the forward's 192 rows to 64, the dK/dV
        # pass's 32 x 192 tiles to 64 x 64); under documents the dQ pass takes 64-key tiles; a forward of one
        # math warpgroup takes 64 x 64 tiles at maxnreg 80 (three programs an SM).
        dropout = gpt2_dropout > 0
        fit = functools.partial(launch.fit_gluon_to_masks, kernel_pass, expected, 64, 16384, dropout=dropout)
        for_documents, for_window = fit(None, documents=True), fit(None, documents=False)
        # The fused backward takes 32-query tiles with four stages under masks with dropout (on 64 it spills), with
        # a dQ warpgroup at 16K (128 keys).
        rows, keys, maxnreg = expected.block_m, expected.block_n, expected.maxnreg
        stages = expected.num_stages
        if kernel_pass == "fwd_hopper":
            rows, keys, maxnreg = 64, 64, 80
        if kernel_pass == "bwd_dkdv_hopper" and keys == 192:
            rows, keys = 64, 64
        if kernel_pass == "bwd_fused_hopper" and (keys == 64 or dropout):
            rows, stages = 32, 4
        fitted = dict(block_m=rows, block_n=keys, maxnreg=maxnreg, num_stages=stages)
        assert for_window == replace(expected, **fitted)
        fitted["block_n"] = 64 if kernel_pass == "bwd_dq_hopper" else keys
        assert for_documents == replace(expected, **fitted)
        assert decide(masks=window) == for_window
        scheduled = replace(documents, tiles=(tile_key(kernel_pass, for_documents),))
        assert decide(masks=scheduled) == for_documents
        assert decide(masks=replace(scheduled, window_size=256)) == for_documents
        assert decide(masks=scheduled, causal=False) is None
        assert decide(masks=replace(documents, tiles=(tile_key(kernel_pass, expected),))) == (
            expected if for_documents == expected else None
        )  # a schedule for other tiles does not serve
        blocks = replace(launch.NO_MASKS, block_mask=torch.ones(1, 128, 128, dtype=torch.bool))
        fitted = fit(128, documents=False)  # blocks hold them whole
        assert fitted is not None and 128 % fitted.block_m == 0 and 128 % fitted.block_n == 0
        assert decide(masks=blocks) is None  # no schedule for the pass's tiling
        assert decide(masks=replace(blocks, tiles=(tile_key(kernel_pass, fitted),))) == fitted
        assert decide(masks=replace(blocks, block_size=96, tiles=(tile_key(kernel_pass, fitted),))) is None
    # D not contiguous; rows 136 bytes apart from an address 4 bytes off: no tensor descriptor addresses them.
    transposed = lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert decide(layout=transposed) is None
    assert decide(o_layout=transposed) is None
    assert decide(layout=lambda t: torch.zeros(1, 2, t.shape[2], 68, dtype=t.dtype)[..., 2:66]) is None
    monkeypatch.setattr(launch, "is_hopper", lambda device: False)
    assert decide() is None
    monkeypatch.setattr(launch, "is_hopper", lambda device: True)
    monkeypatch.setattr(launch, f"flash_{kernel_pass}_kernel", None)  # another Triton release: no Gluon pass
    assert decide() is None
    monkeypatch.undo()
    monkeypatch.setattr(launch, "is_hopper", lambda device: True)
    monkeypatch.setattr(launch, "interpreting", lambda: True)
    assert decide() is None


@pytest.mark.parametrize("dropout", [False, True])
def test_a_mask_built_for_hopper_holds_the_tilings_of_the_gluon_passes_that_may_take_it(dropout):
    """`launch.gluon_tiles`, which `flash_mask` adds to the tilings it builds schedules for on a Hopper GPU (for
    document ids or a block mask): the tiling of each Gluon pass that the table lists for the shape, with dropout
    also those it lists only without dropout, without dropout also those it lists only at another T
    (`launch.gluon_config`), as masks fit them (the forward's 192 rows drop
    to 64, and its 64-row programs take 64 keys; the dK/dV pass's 192 keys drop to 64 x 64; under documents or with
    dropout the dQ pass takes 64-key tiles; with dropout the fused pass takes 32 × 64 tiles up to 8K and 32 × 128
    from 16K, and without it the table's 64 × 128 from 16K under documents and past 16K under a block mask, both
    with a dQ warpgroup), and none for a call the Gluon passes never take (not causal, fp32) or that has no schedule to
    build."""
    from dataclasses import replace

    from flashgpt.kernels import launch

    def expected(seq_len: int) -> tuple:
        tiles = []
        for kernel_pass in PASSES:
            name = launch.GLUON_PASSES.get(kernel_pass)
            cfg = hopper_config(name, 64, "bfloat16", True, dropout, seq_len) if name else None
            if name and cfg is None and dropout:
                cfg = hopper_config(name, 64, "bfloat16", True, False, seq_len)
            if name and cfg is None and not dropout:
                cfg = nearest_hopper_config(name, 64, "bfloat16", True, False, seq_len)
            if name == "bwd_fused_hopper" and not dropout and seq_len <= 8192:
                cfg = None  # under documents, the split passes up to 8K
            if cfg is not None:
                rows = 64 if name == "fwd_hopper" else cfg.block_m
                keys = 64 if name == "fwd_hopper" or name == "bwd_dq_hopper" else cfg.block_n
                if name == "bwd_dkdv_hopper" and keys == 192:
                    rows, keys = 64, 64
                if name == "bwd_fused_hopper" and dropout:
                    rows, keys = 32, (128 if seq_len > 8192 and keys == 128 else 64)
                tiles.append(tile_key(name, replace(cfg, block_m=rows, block_n=keys)))
        return tuple(tiles)

    for seq_len in SEQ_LEN_BUCKETS:
        with_documents = launch.gluon_tiles(PASSES, 64, torch.bfloat16, True, dropout, seq_len, documents=True)
        assert with_documents == expected(seq_len)
        assert launch.gluon_tiles(PASSES, 64, torch.float16, True, dropout, seq_len, documents=True) == with_documents
        assert launch.gluon_tiles(PASSES, 64, torch.bfloat16, False, dropout, seq_len, documents=True) == ()
        assert launch.gluon_tiles(PASSES, 64, torch.float32, True, dropout, seq_len, documents=True) == ()
        assert launch.gluon_tiles(PASSES, 64, torch.bfloat16, True, dropout, seq_len) == ()  # nothing to schedule
    assert launch.gluon_tiles(PASSES, 64, torch.bfloat16, True, dropout, 16384, documents=True)  # D = 64 at 16K
    # Under a block mask, the tilings fitted to its blocks (`fit_gluon_to_blocks`), none where no tile fits.
    fitted = launch.gluon_tiles(PASSES, 64, torch.bfloat16, True, dropout, 16384, block_size=128)
    assert fitted and all(128 % row_tile == 0 and 128 % col_tile == 0 for _, row_tile, col_tile in fitted)
    assert launch.gluon_tiles(PASSES, 64, torch.bfloat16, True, dropout, 16384, block_size=40) == ()
    # The fused backward under a block mask: with dropout at every T, without it past 16K (the split passes up to 16K).
    at_16k, at_32k = (launch.gluon_config("bwd_fused_hopper", 64, "bfloat16", True, dropout, seq_len, block_size=128)
                      for seq_len in (16384, 32768))  # fmt: skip
    assert (at_16k is not None) == dropout and at_32k is not None
    assert (tile_key("bwd_fused_hopper", at_16k) in fitted) if dropout else at_16k is None
    fitted_32k = launch.gluon_tiles(PASSES, 64, torch.bfloat16, True, dropout, 32768, block_size=128)
    assert tile_key("bwd_fused_hopper", at_32k) in fitted_32k


def test_masked_calls_with_dropout_take_the_gluon_passes_the_table_lists_without_dropout():
    """At D = 64 the table lists no Gluon forward with dropout and no Gluon dQ pass with dropout at 16K (dense, the
    Triton forward and the fused backward win). Under documents or a block mask both take their configuration
    without dropout, fitted to the masks (the forward on 64 x 64 tiles at maxnreg 80, the dQ pass on 64-key tiles:
    with dropout 64 x 128 spills); under a window alone only the dQ pass does. Dense calls, and D = 128, whose
    table lists the passes with dropout, keep the table's choice."""
    from flashgpt.kernels import launch

    def config(kernel_pass, head_dim=64, dropout=True, **masks):
        return launch.gluon_config(kernel_pass, head_dim, "bfloat16", True, dropout, 16384, **masks)

    forward, dq = LaunchConfig(64, 64, 4, 2, True, 80), LaunchConfig(64, 64, 4, 2, True, 128)
    for masks in ({"documents": True}, {"block_size": 128}, {"documents": True, "window": True}):
        assert config("fwd_hopper", **masks) == forward
        assert config("bwd_dq_hopper", **masks) == dq
        assert config("bwd_dkdv_hopper", **masks) == hopper_config("bwd_dkdv_hopper", 64, "bfloat16", True, True, 16384)
    assert config("fwd_hopper", window=True) is None
    assert config("bwd_dq_hopper", window=True) == dq
    assert config("fwd_hopper") is None and config("bwd_dq_hopper") is None  # dense
    assert config("fwd_hopper", dropout=False, documents=True) == forward
    assert config("bwd_dq_hopper", dropout=False, window=True).block_n == 128  # 64 x 128 without dropout
    d128 = hopper_config("fwd_hopper", 128, "bfloat16", True, True, 16384)
    assert d128 is not None and config("fwd_hopper", head_dim=128, documents=True) == d128


def test_masked_calls_without_dropout_take_a_gluon_pass_the_table_lists_only_at_another_length():
    """Where the table lists a Gluon pass at D = 64 without dropout for other lengths only (the Triton pass won
    dense calls there), calls under documents or a window take the nearest length's configuration, fitted to the
    masks (documents at 1K: fwd+bwd 1.19x with the Gluon forward); block masks and calls with dropout keep the
    table's choice (under block masks the Gluon forward ran 0.75-0.79x at 1K:
    `results/tuning/h200-2026-11-28-nearest-bucket/`)."""
    from flashgpt.kernels import launch

    for name in ("fwd_hopper", "bwd_dq_hopper"):  # listed from 2K, not at 1K
        assert hopper_config(name, 64, "bfloat16", True, False, 1024) is None
        nearest = nearest_hopper_config(name, 64, "bfloat16", True, False, 1024)
        assert nearest is not None and nearest == hopper_config(name, 64, "bfloat16", True, False, 2048)
        for masks in ({"documents": True}, {"window": True}):
            want = launch.fit_gluon_to_masks(name, nearest, 64, 1024, None, masks.get("documents", False), False)
            assert launch.gluon_config(name, 64, "bfloat16", True, False, 1024, **masks) == want
        assert launch.gluon_config(name, 64, "bfloat16", True, False, 1024) is None  # dense
        assert launch.gluon_config(name, 64, "bfloat16", True, False, 1024, block_size=128) is None
        assert launch.gluon_config(name, 64, "bfloat16", True, False, 1024, documents=True, block_size=128) is None
    assert launch.gluon_config("fwd_hopper", 64, "bfloat16", True, True, 1024, documents=True) is None  # dropout
    assert nearest_hopper_config("fwd_hopper", 64, "float32", True, False, 1024) is None


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_masked_calls_take_the_gluon_backward_that_the_table_lists_for_dense_ones(monkeypatch, dropout):
    """`attention_op._backward_schedule` on a simulated Hopper GPU, D = 64, under a sliding window (which the Gluon
    passes take without a schedule) and without masks: the Gluon fused backward on the table's 64 x 128 tiles for the
    dense call, with or without dropout; under the window with dropout on 32 x 64 tiles at 4K and 32 x 128 at 16K,
    without dropout on the table's tiles from 8K and the split passes up to 4K (`launch.gluon_config`);
    deterministic calls the split passes."""
    from dataclasses import replace

    from flashgpt.kernels import attention_op, launch

    monkeypatch.setattr(launch, "is_hopper", lambda device: True)
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    params = launch.AttentionParams(True, dropout, 0.125)
    window = replace(launch.NO_MASKS, window_size=1024)
    for seq_len in (4096, 16384):
        q, k, v, o, do = (torch.zeros(1, 2, seq_len, 64, dtype=torch.bfloat16) for _ in range(5))
        fused_hopper = hopper_config("bwd_fused_hopper", 64, "bfloat16", True, dropout > 0, seq_len)
        assert (fused_hopper.block_m, fused_hopper.block_n) == (64, 128)
        masked, dense = (attention_op._backward_schedule(q, k, v, o, do, params, masks, False)
                         for masks in (window, launch.NO_MASKS))  # fmt: skip
        assert dense == (fused_hopper, True)
        if dropout:  # 32-query tiles (`launch.fit_gluon_to_masks`): one math warpgroup's, two and a dQ one past 8K
            keys = 128 if seq_len > 8192 else 64
            assert masked == (replace(fused_hopper, block_m=32, block_n=keys, num_stages=4), True)
        else:
            assert masked == ((fused_hopper, True) if seq_len > 4096 else (None, False))
        assert attention_op._backward_schedule(q, k, v, o, do, params, window, True) == (None, False)


def test_the_fused_backward_runs_a_dq_warpgroup_for_the_calls_it_was_measured_faster_for():
    """`launch.has_dq_warpgroup`: at D = 64 on 64 x 128 tiles for dense calls with or without dropout and masked
    calls without dropout, on 32 x 128 tiles for masked calls with dropout; at D = 128 on 32 x 128 tiles for dense
    calls without dropout; never on other tiles. Every configuration the table lists for the fused pass on those
    tiles (dense) gets one, except D = 128 with dropout."""
    from dataclasses import replace

    from flashgpt.kernels import launch

    d64, d128 = LaunchConfig(64, 128, 4, 2, True, 128), LaunchConfig(32, 128, 4, 4, True, 128)
    window = replace(launch.NO_MASKS, window_size=1024)
    documents = replace(launch.NO_MASKS, document_ids=torch.zeros(1, 4096, dtype=torch.int32))
    blocks = replace(launch.NO_MASKS, block_mask=torch.ones(1, 32, 32, dtype=torch.bool), block_size=128)
    expected = {  # (tiles, head dim, masks, dropout): has one
        (d64, 64, launch.NO_MASKS, False): True,
        (d64, 64, launch.NO_MASKS, True): True,
        (d64, 64, window, False): True,
        (d64, 64, documents, False): True,
        (d64, 64, window, True): False,
        (d64, 64, documents, True): False,
        (d64, 64, blocks, False): True,
        (d64, 64, blocks, True): False,
        (replace(d64, block_m=32), 64, window, True): True,
        (replace(d64, block_m=32), 64, documents, True): True,
        (replace(d64, block_m=32), 64, blocks, True): True,
        (replace(d64, block_m=32), 64, launch.NO_MASKS, True): False,
        (replace(d64, block_m=32), 64, window, False): False,
        (replace(d64, block_n=64), 64, launch.NO_MASKS, False): False,
        (replace(d64, block_m=32, block_n=64), 64, window, True): False,
        (d128, 128, launch.NO_MASKS, False): True,
        (d128, 128, launch.NO_MASKS, True): False,
        (d128, 128, window, False): False,
        (d64, 128, launch.NO_MASKS, False): False,
    }
    for (cfg, head_dim, masks, dropout), has_one in expected.items():
        assert launch.has_dq_warpgroup(cfg, head_dim, masks, dropout) == has_one, (cfg, head_dim, masks, dropout)
    for key, cfg in _tuned_file()["bwd_fused_hopper"].items():
        _, d, _, _, drop, _ = key.split("/")
        head_dim, dropout = int(d[1:]), drop == "drop"
        tiles = (cfg["block_m"], cfg["block_n"])
        on_its_tiles = tiles == ((64, 128) if head_dim == 64 else (32, 128))
        assert launch.has_dq_warpgroup(LaunchConfig(**cfg), head_dim, launch.NO_MASKS, dropout) == (
            on_its_tiles and not (head_dim == 128 and dropout)
        ), key


def test_only_a_d64_masked_forward_takes_three_programs_an_sm():
    """Under masks a one-warpgroup forward at D = 64 takes 64 x 64 tiles at maxnreg 80 (three programs an SM);
    at D = 128 its accumulator needs the registers, and the table's 128-row configuration stays."""
    from flashgpt.kernels import launch

    d64 = hopper_config("fwd_hopper", 64, "bfloat16", True, False, 16384)
    d128 = hopper_config("fwd_hopper", 128, "bfloat16", True, False, 16384)
    fit = launch.fit_gluon_to_masks
    assert fit("fwd_hopper", d64, 64, 16384, None, False, False) == LaunchConfig(64, 64, 4, 2, True, 80)
    assert fit("fwd_hopper", d128, 128, 16384, None, False, False) == d128
    assert fit("fwd_hopper", d128, 128, 16384, 128, True, False) == d128
    for kernel_pass in ("bwd_dq_hopper", "bwd_dkdv_hopper"):
        cfg = hopper_config(kernel_pass, 64, "bfloat16", True, False, 16384)
        assert fit(kernel_pass, cfg, 64, 16384, None, False, False).maxnreg == cfg.maxnreg


def test_masked_gluon_grids_put_heads_fastest_only_under_documents():
    """`launch.heads_fastest`: under documents, whose walks differ in length, the Gluon passes' grids are
    (B·H, tiles), so that no head's longest walks start last; dense, windowed and block-masked calls keep
    (tiles, B·H), whose programs of one head share its rows in L2."""
    from dataclasses import replace

    from flashgpt.kernels import launch

    documents = replace(launch.NO_MASKS, document_ids=torch.zeros(1, 256, dtype=torch.int32))
    blocks = replace(launch.NO_MASKS, block_mask=torch.ones(1, 2, 2, dtype=torch.bool))
    window = replace(launch.NO_MASKS, window_size=64)
    for kernel_pass in ("fwd_hopper", "bwd_dq_hopper", "bwd_dkdv_hopper"):
        assert launch.heads_fastest(kernel_pass, documents)
        assert launch.heads_fastest(kernel_pass, replace(documents, window_size=64, block_mask=blocks.block_mask))
        for masks in (launch.NO_MASKS, blocks, window):
            assert not launch.heads_fastest(kernel_pass, masks)
    assert launch.gluon_grid(32, 12, heads_first=False) == (32, 12)
    assert launch.gluon_grid(32, 12, heads_first=True) == (12, 32)
