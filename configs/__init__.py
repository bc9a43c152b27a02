"""Hydra's configs (config.yaml and the groups under it), a package so that an installed wheel carries them: the
entry point finds them as pkg://flashgpt.configs from a checkout and from site-packages alike."""
