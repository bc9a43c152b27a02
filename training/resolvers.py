"""OmegaConf resolvers the configs use: values computed from other values when a config is composed. With them a
Hydra sweep varies seq_len alone and the batch follows, e.g. in configs/experiment/long_context_speed.yaml:

    train:
      batch_size: ${batch_for:${train.tokens_per_step},${seq_len}}   # 32768 tokens: 32 x 1K, 8 x 4K, 2 x 16K
"""

from omegaconf import OmegaConf


def batch_for(tokens: int, seq_len: int) -> int:
    """The number of seq_len-token sequences that hold exactly `tokens` tokens."""
    tokens, seq_len = int(tokens), int(seq_len)
    if seq_len <= 0 or tokens <= 0 or tokens % seq_len:
        raise ValueError(
            f"batch_for: {tokens} tokens do not split into whole sequences of seq_len={seq_len}; choose a seq_len "
            f"that divides {tokens}, or set train.batch_size (and eval.batch_size) directly"
        )
    return tokens // seq_len


RESOLVERS = {"batch_for": batch_for}


def register_resolvers() -> None:
    """Make the resolvers known to OmegaConf (once per process: registering a name twice is an error)."""
    for name, resolver in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
