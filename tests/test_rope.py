"""Rotary position embeddings (model.position_embedding=rope): the rotation against an independent float64 formula,
the relative-position property, every backend and the KV cache, training, extension with a raised base (ABF), and
the refusals (Hugging Face export, config mistakes)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from test_masks_model import sharpened

from flashgpt.attention_reference import reference_rotary_grad
from flashgpt.data.tokenizer import VOCAB_SIZE, get_tokenizer
from flashgpt.kernels.rotary import rotary_qkv_grad as fused_rotary_qkv_grad
from flashgpt.model import hf
from flashgpt.model.generation import generate
from flashgpt.model.gpt import GPT, ModelConfig, PositionEmbedding
from flashgpt.model.rotary import apply_rotary, rotary_qkv, rotary_tables
from flashgpt.training.config import register_configs, typed_config, validate
from flashgpt.training.saved_model import model_from_checkpoint
from training_runs import REPO, assert_ok, read_metrics, read_result, train

ROPE = ModelConfig(name="gpt2-tiny", n_layer=2, n_head=2, d_model=128, position_embedding=PositionEmbedding.rope)
FP32_TABLE_ERROR = 2**-24  # rotary_tables rounds exact float64 values in [-1, 1] to float32: at most half an ulp


def reference_rotation(x: torch.Tensor, positions: range, base: float) -> torch.Tensor:
    """x (..., T, D) float64 with the pair (x[i], x[i + D/2]) of position positions[t] turned by the angle
    positions[t] · base^(-2i / D), as the complex product (x[i] + j·x[i + D/2]) · e^(j·angle)."""
    half = x.size(-1) // 2
    angles = [[p * base ** (-2 * i / x.size(-1)) for i in range(half)] for p in positions]
    angles = torch.tensor(angles, dtype=torch.float64)  # (T, D/2)
    turned = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([turned.real, turned.imag], dim=-1)


def pair_norms(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (..., D/2): the length of each rotated pair, which a rotation keeps."""
    half = x.size(-1) // 2
    return torch.hypot(x[..., :half], x[..., half:])


@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rotary_turns_each_pair_as_a_float64_complex_rotation(base):
    x = torch.randn(2, 3, 17, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = range(1000, 1017)  # far enough that a wrong frequency shows
    cos, sin = rotary_tables(1017, 16, base)
    expected = reference_rotation(x, positions, base)
    got = apply_rotary(x, cos[1000:], sin[1000:])
    # Only the tables are rounded (float32): each output is off by at most (|x_i| + |x_{i+D/2}|) · 2^-24.
    bound = (x[..., :8].abs() + x[..., 8:].abs()).repeat(1, 1, 1, 2) * FP32_TABLE_ERROR
    assert got.dtype == torch.float64 and ((got - expected).abs() <= bound + 1e-12).all()
    # bf16 activations (autocast) are rotated in float32 and rounded once: within one bf16 half-ulp (2^-9).
    x_bf16 = x.bfloat16()
    got_bf16 = apply_rotary(x_bf16, cos[1000:], sin[1000:])
    expected_bf16 = reference_rotation(x_bf16.double(), positions, base)
    assert got_bf16.dtype == torch.bfloat16
    assert ((got_bf16.double() - expected_bf16).abs() <= expected_bf16.abs() * 2**-8 + 2 * bound).all()


def test_rotary_tables_stay_exact_to_float32_at_64k_positions():
    cos, sin = rotary_tables(65536, 64, 10000.0)
    assert cos.shape == sin.shape == (65536, 64) and cos.dtype == sin.dtype == torch.float32
    for p in (0, 1, 4097, 65535):
        angles = torch.tensor([p * 10000.0 ** (-2 * i / 64) for i in range(32)], dtype=torch.float64)
        # cos repeats the 32 cosines; sin is −sin then +sin (the signs of the rotation's two rows)
        for got, want in ((cos[p, :32], angles.cos()), (cos[p, 32:], angles.cos()), (sin[p, 32:], angles.sin())):
            assert (got.double() - want).abs().max() <= FP32_TABLE_ERROR / 2 + 1e-11
        assert torch.equal(sin[p, :32], -sin[p, 32:])


def test_scores_depend_only_on_the_distance_between_positions():
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, 24, 16, dtype=torch.float64, generator=gen) for _ in range(2))
    cos, sin = rotary_tables(1024 + 24, 16, 10000.0)

    def scores(q_start: int, k_start: int) -> torch.Tensor:
        """q at positions q_start.., k at k_start..: (1, 2, 24, 24) dot products."""
        rq = apply_rotary(q, cos[q_start : q_start + 24], sin[q_start : q_start + 24])
        rk = apply_rotary(k, cos[k_start : k_start + 24], sin[k_start : k_start + 24])
        return rq @ rk.transpose(-2, -1)

    # Each rotation matrix's entries are rounded to float32: a score moves by at most 4 · 2^-24 · Σ |q_p| |k_p|
    # over the pairs p (two rotations, two entries per output).
    bound = 4 * FP32_TABLE_ERROR * pair_norms(q) @ pair_norms(k).transpose(-2, -1)
    unshifted = scores(0, 0)
    for shift in (1, 37, 1024):
        assert ((scores(shift, shift) - unshifted).abs() <= bound).all()
    assert ((scores(3, 0) - unshifted).abs() > 100 * bound).any()  # another distance: other scores


def test_a_rope_model_has_no_position_table_and_every_backend_computes_it_alike():
    torch.manual_seed(0)
    naive = GPT(ROPE, 64, "naive")
    assert naive.wpe is None and not any("wpe" in name or "rope" in name for name in naive.state_dict())
    assert naive.num_params() == sum(p.numel() for p in naive.parameters())
    sdpa = GPT(ROPE, 64, "sdpa")
    sdpa.load_state_dict(naive.state_dict())
    idx = torch.randint(0, 50257, (2, 65), generator=torch.Generator().manual_seed(1))
    grads = []
    for model in (naive, sdpa):
        loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    # Both compute in fp32 and differ only in summation order (as in tests/test_model.py).
    torch.testing.assert_close(sdpa(idx[:, :-1]), naive(idx[:, :-1]), rtol=1e-4, atol=1e-5)
    for name, grad in grads[1].items():
        torch.testing.assert_close(grad, grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


def test_rope_hands_the_attention_q_k_v_token_major_as_learned_positions_do():
    """q and k are turned where the qkv projection lays them out, token-major ((B, T, H, D) in memory), as learned
    positions pass them: the attention output, allocated like q, then reshapes to (B, T, C) without a copy, and the
    gradients of q and k join the projection's gradient without a transposing copy (what the profile in
    results/tuning/h200-2026-11-28-rope-cost/ found these cost when q and k were turned head-major)."""
    layouts = {}
    for positions in PositionEmbedding:
        model = GPT(dataclasses.replace(ROPE, position_embedding=positions), 64, "naive")
        seen: list[tuple] = []
        model.blocks[0].attn.inner.register_forward_pre_hook(lambda module, args, seen=seen: seen.append(args))
        model(torch.zeros(2, 64, dtype=torch.long))
        q, k, v = seen[0]  # 3 x (B, H, T, D)
        assert all(t.stride(3) == 1 and t.stride(2) > t.stride(1) for t in (q, k, v)), positions  # T outer to H
        assert torch.empty_like(q).transpose(1, 2).is_contiguous()  # the output: (B, T, C) as a view
        layouts[positions] = [t.stride() for t in (q, k, v)]
    # rope's q and k are new (B, T, H, D) tensors; v is the projection's slice, as with learned positions
    assert layouts[PositionEmbedding.rope][0] == layouts[PositionEmbedding.rope][1] == (64 * 128, 64, 128, 1)
    assert layouts[PositionEmbedding.rope][2] == layouts[PositionEmbedding.learned][2]


def selected_rotation(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q and k turned by apply_rotary on qkv's slices and v sliced: what rotary_qkv computes, left to autograd."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    return apply_rotary(qkv[:, :, 0], cos, sin), apply_rotary(qkv[:, :, 1], cos, sin), qkv[:, :, 2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rotary_qkv_gives_autograds_values_and_gradient_bit_for_bit(dtype):
    """rotary_qkv's own backward (the CPU path of flashgpt::rotary_qkv_grad) repeats autograd's operations on the
    rotation, so eager CPU runs give the same bits as before it existed."""
    generator = torch.Generator().manual_seed(0)
    cos, sin = (t[100:123] for t in rotary_tables(123, 16, 10000.0))
    qkv = torch.randn(2, 23, 3, 2, 16, generator=generator).to(dtype).requires_grad_()
    grads = [torch.randn(2, 23, 2, 16, generator=generator).to(dtype) for _ in range(3)]
    ours = rotary_qkv(qkv, cos, sin)
    autograds = selected_rotation(qkv, cos, sin)
    for got, expected in zip(ours, autograds, strict=True):
        assert torch.equal(got, expected)
    assert ours[2]._base is qkv  # v stays a view of the projection, as with learned positions
    (ours_grad,) = torch.autograd.grad(ours, qkv, grads)
    (autograd_grad,) = torch.autograd.grad(autograds, qkv, grads)
    assert torch.equal(ours_grad, autograd_grad)
    if dtype == torch.float64:
        small = qkv[:1, :5].detach().requires_grad_()
        assert torch.autograd.gradcheck(lambda x: rotary_qkv(x, cos[:5].double(), sin[:5].double()), (small,))


@pytest.mark.parametrize(("dtype", "head_dim", "seq_len"), [(torch.float32, 16, 37), (torch.bfloat16, 40, 70)])
def test_the_fused_rotary_gradient_kernel_matches_float64(dtype, head_dim, seq_len):
    """kernels/rotary.py (the CUDA path of rotary_qkv_grad), through the Triton interpreter: dq and dk turned back
    by the transposed rotation within float32 rounding (and one bf16 rounding), dv copied exactly, into a contiguous
    (B, T, 3, H, D). Odd lengths and a head dim that is not a power of two leave partial tiles; the gradients come
    as the attention returns them, (B, H, T, D) transposed, dk's rows strided wider than D."""
    generator = torch.Generator().manual_seed(seq_len)
    cos, sin = (t[1000 : 1000 + seq_len] for t in rotary_tables(1000 + seq_len, head_dim, 10000.0))
    dq, dk, dv = (torch.randn(2, 3, seq_len, head_dim + 8 * (i == 1), generator=generator) for i in range(3))
    dq, dk, dv = (g[..., :head_dim].to(dtype).transpose(1, 2) for g in (dq, dk, dv))  # 3 x (B, T, H, D) views
    got = fused_rotary_qkv_grad(dq, dk, dv, cos.contiguous(), sin.contiguous())
    assert got.shape == (2, seq_len, 3, 3, head_dim) and got.is_contiguous() and got.dtype == dtype
    assert torch.equal(got[:, :, 2], dv)
    for slot, grad in enumerate((dq, dk)):
        expected, magnitude = reference_rotary_grad(grad, cos, sin)
        # float32 products and sum: within 2^-23 of the magnitude (2^-22 leaves room for the second-order terms); a
        # bf16 output adds one bf16 ulp of the result (rounded to nearest on the GPU, truncated by the interpreter).
        bound = magnitude * 2**-22
        if dtype == torch.bfloat16:
            bound = bound + expected.abs() * 2**-7
        assert ((got[:, :, slot].double() - expected).abs() <= bound).all(), slot


def generating_rope_gpt(backend: str) -> GPT:
    """A rope model with a context of 16, `sharpened` for generation tests."""
    torch.manual_seed(0)
    return sharpened(GPT(ROPE, 16, backend).eval())


@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_cached_generation_with_rope_equals_recomputing_every_step(backend):
    """Greedy, fp32: 5 prompt tokens then 20 new ones through a context of 16: the cache fills (each new key turned
    at its absolute position), then the window moves and is recomputed. The reference runs every step uncached."""
    model = generating_rope_gpt(backend)
    prompt = torch.tensor([[464, 3290, 318, 257, 11], [40, 1101, 257, 262, 13]])
    recompute, reference, steps = generating_rope_gpt("naive"), prompt, []
    with torch.no_grad():
        for _ in range(20):
            logits = recompute(reference[:, -16:])[:, -1]
            steps.append(logits)
            reference = torch.cat([reference, logits.argmax(-1, keepdim=True)], dim=1)
    cached = generate(model, prompt, 20, temperature=0.0)
    assert torch.equal(cached, reference)
    assert len(set(cached[0, 5:].tolist())) > 12  # varied tokens: every step's argmax is checked
    # The logits of the cached steps themselves: prefill, then one token a call at positions 5..15.
    cache_logits = []
    model.register_forward_hook(lambda _, args, out: cache_logits.append(out[:, -1]))
    generate(model, prompt, 11, temperature=0.0)
    for got, expected in zip(cache_logits, steps, strict=False):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """train.py with rope: gpt2-tiny on Shakespeare, 20 steps of 4 x 64 tokens."""
    run_dir = tmp_path_factory.mktemp("rope") / "run"
    proc = train(run_dir, "model.position_embedding=rope", "train.max_steps=20", "eval.every=10", "checkpoint.every=20")
    assert_ok(proc)
    return run_dir, proc


def test_rope_trains_and_its_checkpoint_writes_the_tokens_generate_gives(rope_run):
    run_dir, _ = rope_run
    metrics = read_metrics(run_dir)
    evals = [m["val/loss"] for m in metrics if "val/loss" in m]
    assert evals[-1] < evals[0] < 10.0  # from ln(50257) = 10.8 at initialisation
    assert metrics[-1]["train/loss"] < metrics[0]["train/loss"] - 2.0
    result = read_result(run_dir)
    assert (result["status"], result["position_embedding"], result["rope_base"]) == ("ok", "rope", 10000.0)

    checkpoint = run_dir / "checkpoints" / "latest.pt"
    model = model_from_checkpoint(checkpoint, attention="naive").model.eval()
    assert model.wpe is None
    prompt = torch.tensor([get_tokenizer().encode("ROMEO:")])
    tokens = generate(model, prompt, 12, temperature=0.0, n_vocab=VOCAB_SIZE)
    command = [sys.executable, "scripts/sample.py", str(checkpoint), "--prompt", "ROMEO:", "--max-new-tokens", "12"]
    out = subprocess.run(
        [*command, "--temperature", "0", "--attention", "sdpa"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"--- sample 0 ---\n{get_tokenizer().decode(tokens[0].tolist())}\n"


def test_rope_is_refused_by_the_hugging_face_export_and_import(rope_run, tmp_path):
    checkpoint = rope_run[0] / "checkpoints" / "latest.pt"
    command = [sys.executable, "-m", "flashgpt.training.export", str(checkpoint), str(tmp_path / "out")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and not (tmp_path / "out").exists()
    message = "model.position_embedding=rope, but GPT-2 in transformers has learned absolute positions"
    assert message in proc.stderr and "model.position_embedding=learned" in proc.stderr
    with pytest.raises(ValueError, match=message):
        hf.export(GPT(ROPE, 16, "naive"), tmp_path / "out")
    with pytest.raises(ValueError, match=r"model.init_from=hf:gpt2: model.position_embedding=rope"):
        hf.load_into(GPT(ROPE, 16, "naive"), "hf:gpt2")  # refused before looking for the source


def test_extension_with_a_raised_rope_base_runs_resumes_and_records_the_base(tmp_path):
    """1K -> 16K with ABF in miniature: 32 tokens to step 4, then 64 tokens with rope_base 10^4 -> 5·10^5, stopped at
    step 6 and resumed to 8, at 256 tokens a step throughout."""
    rope = ["model.position_embedding=rope", "train.tokens_per_step=256", "train.max_steps=8", "eval.every=0"]
    short, long = tmp_path / "short", tmp_path / "long"
    assert_ok(train(short, *rope, "seq_len=32", "train.batch_size=8", "train.stop_at_step=4", "checkpoint.every=4"))
    extension = [*rope, "seq_len=64", "model.rope_base=500000", f"extend_from={short / 'checkpoints' / 'latest.pt'}"]
    first = train(long, *extension, "train.stop_at_step=6", "checkpoint.every=2")
    assert_ok(first)
    assert "rotary positions, model.rope_base 10000 -> 500000 (adjusted base frequency)" in first.stdout + first.stderr
    assert read_result(long)["step"] == 6
    resumed = train(long, *extension, "resume=auto", "checkpoint.every=2")
    assert_ok(resumed)
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert [m["step"] for m in read_metrics(long) if "train/loss" in m] == [5, 6, 7, 8]
    result = read_result(long)
    assert (result["status"], result["step"], result["seq_len"], result["rope_base"]) == ("ok", 8, 64, 500000.0)
    assert result["val/loss"] < 10.0  # the trained weights, not a fresh model (ln(50257) = 10.8)
    assert OmegaConf.load(long / ".hydra" / "config.yaml").model.rope_base == 500000
    assert json.loads((short / "result.json").read_text())["rope_base"] == 10000.0


# --- config ---


@pytest.fixture(scope="module")
def hydra_configs():
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        yield


@pytest.mark.parametrize(
    "override", ["model.position_embedding=rotary", "model.rope_base=high", "extend_positions=stretch"]
)
def test_a_misspelt_position_setting_fails_at_composition(hydra_configs, override):
    with pytest.raises(ConfigCompositionException):
        typed_config(compose("config", overrides=[override]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.rope_base=1"], r"model.rope_base=1.0 must be a finite number > 1"),
        (["model.rope_base=nan"], r"model.rope_base=nan must be a finite number > 1"),
        (["model.position_embedding=rope", "model.d_model=126", "model.n_head=2"], "head dim .* = 63 is odd"),
        (["model.position_embedding=rope", "model.init_from=hf:gpt2"], "use model.position_embedding=learned"),
        (["model.position_embedding=rope", "extend_positions=interpolate"], "change model.rope_base"),
    ],
)
def test_bad_position_settings_fail_at_start_up_naming_the_setting(hydra_configs, overrides, message):
    cfg = typed_config(compose("config", overrides=["model=gpt2-tiny", *overrides]))
    with pytest.raises(ValueError, match=message):
        validate(cfg)


def test_learned_positions_stay_the_default_and_interpolation_is_an_option(hydra_configs):
    cfg = typed_config(compose("config", overrides=["model=gpt2-tiny", "extend_positions=interpolate"]))
    validate(cfg)
    assert cfg.model.position_embedding == PositionEmbedding.learned and cfg.model.rope_base == 10000.0
    assert cfg.extend_positions.value == "interpolate"
