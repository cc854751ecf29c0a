"""ROLL compatibility: what lets a config written for ROLL's agentic pipeline run here unchanged.

Everything ROLL-specific in the config layer lives in this room, and nothing of roll's own
config depends on more of it than the dialect's fields and vocabularies:
- `dialect`: `RollDialect` (a base of `PipelineConfig`), ROLL's run-level keys without a twin
  among roll's fields, the variables of ROLL's env library, and ROLL's class paths mapped to ours;
- `table`, `table_workers`: every field of ROLL's config dataclasses with roll's answer to it
  (`answers.Answer`: supported, no-op or refused);
- `keys`: applies the table to a composed config before validation (`answer_roll_keys`);
- `unsupported`: ROLL features roll does not run, refused by name before validation.
The loader (`roll.configs.loader`) calls `keys` and `unsupported`; docs/roll_configs.md is the
guide and docs/coming_from_roll.md the table, key by key.
"""
