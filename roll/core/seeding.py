"""Seeds are derived, never drawn: every random choice in a run traces back to `seed` and a name."""

from __future__ import annotations

import hashlib
import random

import numpy as np


def derive_seed(*keys: object) -> int:
    """A 31-bit seed from any sequence of keys, stable across processes and Python versions.

    `derive_seed(cfg.seed, "train", step, group)` gives the same number on every machine;
    Python's `hash()` would not (it is salted per process for strings).
    """
    text = "/".join(str(k) for k in keys).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & 0x7FFFFFFF


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch global RNGs (for code we do not control)."""
    import torch  # here, so that env and config code importing `derive_seed` does not load torch

    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
