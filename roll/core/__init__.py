"""The ground floor: what every floor of roll uses and that imports nothing of roll above it.

- `records`: the typed records that cross process boundaries (generate requests and outputs,
  trajectories, steps) and the enums they carry (`SampleMode`, `StopReason`).
- `fields`: the names of the batch's tensor and non-tensor fields, one constant each.
- `imports`: `import_object("package.module:Name")`, the one `module:attr` resolver.
- `reward_norm`: ROLL's reward-normalisation vocabulary (methods -> statistics, the asym_clip range),
  shared by the config and the algorithm.
- `seeding`: `derive_seed(*keys)` and `seed_everything(seed)`: seeds are derived, never drawn.
"""
