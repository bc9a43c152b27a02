"""GPT-2 weights in and out of Hugging Face transformers' `GPT2LMHeadModel`, with identical logits.

In:  `train.py model=gpt2 model.init_from=hf:gpt2` (a Hub name, or a local directory written by `save_pretrained`),
     or `load_into(model, "hf:<dir or name>")` on a `GPT` built with the source's n_layer, n_head and d_model.
Out: `export(model, out_dir)` writes config.json and model.safetensors, which `GPT2LMHeadModel.from_pretrained`
     loads (the tokenizer is GPT-2's own); `python -m flashgpt.training.export <checkpoint> <out dir>` does it for a
     training checkpoint.

The mapping, per block (transformers' name -> ours). Conv1D computes x @ W with W of shape (in, out); nn.Linear
computes x @ Wᵀ with W of shape (out, in): the four matmul weights are transposed, everything else is copied.
    attn.c_attn (C, 3C) -> attn.qkv (3C, C)      attn.c_proj (C, C) -> attn.proj          (q, k, v in the same order)
    mlp.c_fc (C, 4C)    -> mlp.fc (4C, C)        mlp.c_proj (4C, C) -> mlp.proj           ln_1, ln_2, ln_f as they are

Vocabulary: our table is padded to model.vocab_size (50304, a multiple of 64) past GPT-2's 50257 tokens. Rows
0..50256 are the source's; each padded row is set to the mean of the source's rows, so its logit is the mean of the
real logits, and by Jensen's inequality (exp(mean) <= mean of exp) no padded token is likelier than an average real
one: the loss over the padded vocabulary exceeds the source's by at most log(1 + n_pad / 50257) = 0.00094 nats for
47 rows (Hewitt, "Initializing new word embeddings", 2021; transformers' `resize_token_embeddings` does the same). The
export drops the padded rows.

Positions: GPT-2's are a learned table, so only model.position_embedding=learned goes in or out; a rotary model
(rope) is refused both ways, naming the setting. Our table has seq_len rows (the run's context). Shorter than the
source's (1024 for every GPT-2): its first seq_len rows. Longer: the source's rows, then the source table again and
again, row p = source row (p mod n_positions): the "copy" initialisation of Longformer (Beltagy et al., 2020), which
keeps the first n_positions positions exact and starts every later one from a trained embedding instead of noise.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from flashgpt.model.gpt import GPT, ModelConfig, PositionEmbedding, position_embedding

if TYPE_CHECKING:
    from transformers import GPT2Config, GPT2LMHeadModel

log = logging.getLogger(__name__)

PREFIX = "hf:"
GPT2_VOCAB = 50257  # GPT-2's BPE tokens, <|endoftext|> = 50256 included
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which our model uses; GPT-2's layer_norm_epsilon
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")  # transformers' names for GELU's tanh approximation, our MLP's
# The matmul weights, ours -> transformers' (per block), stored transposed by transformers' Conv1D.
TRANSPOSED = {"attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj", "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
# Causal-mask buffers that older transformers keep in GPT-2's state dict: not weights.
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")


def _transformers() -> tuple[type[GPT2Config], type[GPT2LMHeadModel]]:
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as error:
        raise ImportError(
            'Hugging Face GPT-2 import/export needs transformers: pip install "flashgpt[hf]" (from a checkout: '
            'pip install -e ".[hf]")'
        ) from error
    return GPT2Config, GPT2LMHeadModel


def hf_source(init_from: str) -> str:
    """The directory or Hub name in model.init_from="hf:<source>"."""
    if not init_from.startswith(PREFIX) or not init_from[len(PREFIX) :]:
        raise ValueError(
            f"model.init_from={init_from!r}: expected hf:<directory or Hub name>, e.g. hf:gpt2 or hf:/path/to/model "
            "(a directory written by GPT2LMHeadModel.save_pretrained)"
        )
    return init_from[len(PREFIX) :]


def load_hf_gpt2(source: str) -> GPT2LMHeadModel:
    """transformers' GPT2LMHeadModel from a local directory or a Hub name (the Hub needs the network or its cache)."""
    _, gpt2_lm_head_model = _transformers()
    try:
        model, info = gpt2_lm_head_model.from_pretrained(source, output_loading_info=True)
    except OSError as error:
        raise OSError(
            f"model.init_from=hf:{source}: transformers could not load a GPT-2 from it. Give a directory holding "
            f"config.json and the weights, or a Hub name (e.g. gpt2, gpt2-medium) with the network or a filled "
            f"Hugging Face cache.\n{error}"
        ) from error
    # transformers fills what it could not load with random weights and only logs it: refuse instead.
    if model.config.model_type != "gpt2":
        raise ValueError(f"model.init_from=hf:{source} is a {model.config.model_type!r} model, not GPT-2 ('gpt2')")
    mismatched = [key[0] if isinstance(key, tuple) else key for key in info["mismatched_keys"]]  # (name, shapes)
    absent = [*info["missing_keys"], *mismatched]
    if absent:
        shown = ", ".join(sorted(absent)[:6]) + (f" and {len(absent) - 6} more" if len(absent) > 6 else "")
        raise ValueError(
            f"model.init_from=hf:{source} lacks {len(absent)} of GPT-2's weights or has them in another shape "
            f"({shown}): transformers would start them from random values"
        )
    return model


def check_source_config(hf_config: GPT2Config, cfg: ModelConfig, source: str) -> None:
    """The source must be the architecture our GPT computes and the shape the run's model config asks for."""
    where = f"model.init_from=hf:{source}"
    unsupported = {
        "activation_function": (hf_config.activation_function, hf_config.activation_function in TANH_GELUS),
        "layer_norm_epsilon": (hf_config.layer_norm_epsilon, hf_config.layer_norm_epsilon == LAYER_NORM_EPS),
        "scale_attn_weights": (hf_config.scale_attn_weights, hf_config.scale_attn_weights),
        "scale_attn_by_inverse_layer_idx": (
            hf_config.scale_attn_by_inverse_layer_idx,
            not hf_config.scale_attn_by_inverse_layer_idx,
        ),
        "add_cross_attention": (hf_config.add_cross_attention, not hf_config.add_cross_attention),
        "n_inner": (hf_config.n_inner, hf_config.n_inner in (None, 4 * hf_config.n_embd)),
        "tie_word_embeddings": (hf_config.tie_word_embeddings, hf_config.tie_word_embeddings),
    }
    if bad := [f"{key}={value!r}" for key, (value, ok) in unsupported.items() if not ok]:
        raise ValueError(f"{where}: not the GPT-2 architecture this model computes ({', '.join(bad)})")
    ours = (cfg.n_layer, cfg.n_head, cfg.d_model)
    theirs = (hf_config.n_layer, hf_config.n_head, hf_config.n_embd)
    if ours != theirs:
        raise ValueError(
            f"{where} has n_layer, n_head, d_model = {theirs}, but model={cfg.name} has {ours}: choose the model "
            "config of the same shape (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or set model.n_layer/n_head/d_model"
        )
    if hf_config.vocab_size > cfg.vocab_size:
        raise ValueError(f"{where} has {hf_config.vocab_size} tokens, more than model.vocab_size={cfg.vocab_size}")
    if hf_config.vocab_size < GPT2_VOCAB:
        log.warning(
            f"{where} has {hf_config.vocab_size} tokens, fewer than GPT-2's {GPT2_VOCAB}: token ids from "
            f"{hf_config.vocab_size} up start as the mean row, though the data's GPT-2 BPE uses them"
        )
    if not cfg.bias:
        raise ValueError(f"{where}: GPT-2 has biases; set model.bias=true")


def check_learned_positions(cfg: ModelConfig, where: str) -> None:
    """GPT-2 (transformers' GPT2LMHeadModel) adds a learned position table; a rotary model has none to map."""
    if position_embedding(cfg) != PositionEmbedding.learned:
        raise ValueError(
            f"{where}: model.position_embedding={position_embedding(cfg).value}, but GPT-2 in transformers has learned "
            "absolute positions (a wpe table) and no rotary embeddings, so it would compute another model. Import "
            "and export GPT-2 with model.position_embedding=learned"
        )


def resize_positions(table: Tensor, n_positions: int) -> Tensor:
    """The source's (n_source, C) position table as n_positions rows: its first rows, or row p = row p mod n_source."""
    n_source = table.size(0)
    repeats = math.ceil(n_positions / n_source)
    return table.repeat(repeats, 1)[:n_positions]


def pad_vocab(table: Tensor, vocab_size: int) -> Tensor:
    """The (V_source, C) token table with vocab_size - V_source more rows, each the mean of the source's rows."""
    padding = table.mean(dim=0, keepdim=True).expand(vocab_size - table.size(0), -1)
    return torch.cat([table, padding])


def from_hf_state_dict(
    hf_state: dict[str, Tensor], n_layer: int, block_size: int, vocab_size: int
) -> dict[str, Tensor]:
    """transformers' GPT2LMHeadModel state dict -> ours, every source tensor used once (else an error names it)."""
    unused = {key for key in hf_state if not key.endswith(MASK_BUFFERS)}

    def take(key: str) -> Tensor:
        unused.discard(key)
        return hf_state[key]

    state = {
        "wte.weight": pad_vocab(take("transformer.wte.weight"), vocab_size),
        "wpe.weight": resize_positions(take("transformer.wpe.weight"), block_size),
        "ln_f.weight": take("transformer.ln_f.weight"),
        "ln_f.bias": take("transformer.ln_f.bias"),
    }
    for i in range(n_layer):
        theirs, ours = f"transformer.h.{i}.", f"blocks.{i}."
        for norm in ("ln_1", "ln_2"):
            for kind in ("weight", "bias"):
                state[f"{ours}{norm}.{kind}"] = take(f"{theirs}{norm}.{kind}")
        for our_name, their_name in TRANSPOSED.items():
            state[f"{ours}{our_name}.weight"] = take(f"{theirs}{their_name}.weight").t()
            state[f"{ours}{our_name}.bias"] = take(f"{theirs}{their_name}.bias")
    if "lm_head.weight" in hf_state:  # tied to the token table (checked by check_source_config)
        unused.discard("lm_head.weight")
    if unused:
        raise ValueError(f"the GPT-2 state dict has tensors this model has no place for: {sorted(unused)}")
    state["lm_head.weight"] = state["wte.weight"]
    return {key: value.detach().clone().contiguous() for key, value in state.items()}


def load_into(model: GPT, init_from: str) -> None:
    """Copy the GPT-2 weights named by model.init_from ("hf:<dir or Hub name>") into `model`, in place."""
    source = hf_source(init_from)
    check_learned_positions(model.cfg, f"model.init_from={init_from}")
    hf_model = load_hf_gpt2(source)
    check_source_config(hf_model.config, model.cfg, source)
    state = from_hf_state_dict(hf_model.state_dict(), model.cfg.n_layer, model.block_size, model.cfg.vocab_size)
    with torch.no_grad():
        model.load_state_dict(state, strict=True)


def hf_config_for(cfg: ModelConfig, block_size: int, vocab_size: int = GPT2_VOCAB) -> GPT2Config:
    """The transformers config of our model, with the token table cut to vocab_size rows."""
    gpt2_config, _ = _transformers()
    return gpt2_config(
        vocab_size=vocab_size,
        n_positions=block_size,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        activation_function="gelu_new",
        layer_norm_epsilon=LAYER_NORM_EPS,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=GPT2_VOCAB - 1,
        eos_token_id=GPT2_VOCAB - 1,
        tie_word_embeddings=True,
    )


def to_hf_state_dict(state: dict[str, Tensor], n_layer: int, vocab_size: int = GPT2_VOCAB) -> dict[str, Tensor]:
    """Our state dict -> transformers' GPT2LMHeadModel's; a model without biases exports zeros in their place."""

    def bias_of(key: str, like: Tensor) -> Tensor:
        return state.get(key, torch.zeros(like.size(0), dtype=like.dtype))

    hf_state = {
        "transformer.wte.weight": state["wte.weight"][:vocab_size],
        "transformer.wpe.weight": state["wpe.weight"],
        "transformer.ln_f.weight": state["ln_f.weight"],
        "transformer.ln_f.bias": bias_of("ln_f.bias", state["ln_f.weight"]),
    }
    for i in range(n_layer):
        theirs, ours = f"transformer.h.{i}.", f"blocks.{i}."
        for norm in ("ln_1", "ln_2"):
            hf_state[f"{theirs}{norm}.weight"] = state[f"{ours}{norm}.weight"]
            hf_state[f"{theirs}{norm}.bias"] = bias_of(f"{ours}{norm}.bias", state[f"{ours}{norm}.weight"])
        for our_name, their_name in TRANSPOSED.items():
            weight = state[f"{ours}{our_name}.weight"]  # (out, in)
            hf_state[f"{theirs}{their_name}.weight"] = weight.t()  # (in, out)
            hf_state[f"{theirs}{their_name}.bias"] = bias_of(f"{ours}{our_name}.bias", weight)
    return {key: value.detach().cpu().clone().contiguous() for key, value in hf_state.items()}


def export(model: GPT, out_dir: Path, vocab_size: int = GPT2_VOCAB, force: bool = False) -> Path:
    """Write `model` as a transformers GPT-2 (config.json, model.safetensors) into out_dir; returns out_dir.
    A non-empty out_dir is refused, or with force=True replaced as a whole once the new model is written (a model
    saved over another would keep the other's stale shards or index)."""
    check_learned_positions(model.cfg, "GPT-2 export")
    if not 1 <= vocab_size <= model.cfg.vocab_size:
        raise ValueError(
            f"vocab_size (--vocab-size) = {vocab_size}: must be in [1, {model.cfg.vocab_size}], the model's token rows "
            f"(GPT-2's vocabulary is {GPT2_VOCAB})"
        )
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not force:
        raise FileExistsError(f"{out_dir} exists and is not empty: pass --force to replace it, or another directory")
    _, gpt2_lm_head_model = _transformers()
    hf_model = gpt2_lm_head_model(hf_config_for(model.cfg, model.block_size, vocab_size))
    state = to_hf_state_dict(model.state_dict(), model.cfg.n_layer, vocab_size)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to transformer.wte
        raise RuntimeError(f"GPT-2 export: missing {missing}, unexpected {unexpected}")
    hf_model.tie_weights()
    staging = out_dir.with_name(f".{out_dir.name}.export")
    shutil.rmtree(staging, ignore_errors=True)
    hf_model.save_pretrained(staging)
    if out_dir.is_dir() and not out_dir.is_symlink():
        shutil.rmtree(out_dir)
    else:
        out_dir.unlink(missing_ok=True)
    staging.rename(out_dir)
    return out_dir
