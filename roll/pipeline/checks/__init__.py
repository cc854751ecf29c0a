"""Checks before start: what a validated config cannot tell, run before Ray, torch or a model is
touched, each failure a `ConfigError` naming the key (one line, exit 2): the config's values that
need envs, files or planning (`config`), the files and directories it points to (`resources`,
`run_dirs`), and a vision-language config's model, envs and engine (`vision`).

The top room below the pipelines: checks read the env specs and sampling parameters the rollout
side is built from (`setup.rollout_builders`), so they sit above `setup`.
"""
