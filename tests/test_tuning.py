"""The launch-configuration lookup: the committed H100 table covers what the benchmark and GPT-2 run, and every entry
is a valid configuration."""

import pytest

from flashgpt.kernels.tuning import (
    _DEFAULTS,
    PASSES,
    SEQ_LEN_BUCKETS,
    _tuned_table,
    launch_config,
    seq_len_bucket,
    table_key,
)


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
        for head_dim in (16, 32, 64, 128):
            for dtype in ("float32", "bfloat16"):
                cfg = launch_config(kernel_pass, head_dim, dtype, False, False, 300, interpreting=False, hopper=False)
                cfg.validate(kernel_pass)
