"""The training side: typed config, the loop, and what it writes (checkpoints, metrics, result.json)."""
