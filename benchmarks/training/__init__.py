"""The training step: our actor against a raw torch step, deduplication, dynamic batching, sequence
packing, gradient checkpointing, the scored output head, the score phase."""
