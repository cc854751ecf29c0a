"""The images a batch's rows carry, as the trainer's forwards need them.

A vision-language batch holds each row's images beside its ids (`Batch.PIXEL_VALUES` (B, P, D) and
`Batch.IMAGE_GRID_THW` (B, N, 3), zero-padded per row; `roll.pipeline.phases.batch`) and a hash of them
(`Batch.IMAGE_HASH` (B, 2)). Two things are read from them here:

- `vision_inputs`: the model's `pixel_values` and `image_grid_thw` for some rows, every row's
  images in row order with their padding cut, as the processor would have made them for those rows.
- `RowImages.hashes`: equal for two rows when their images are equal. Rows with equal ids may show
  different images (a step-wise prompt is the current frame alone), so a forward may share one
  row's outputs with another's only when both their ids and their image hashes are equal
  (`micro_batches.distinct_rows`). Step-wise samples revisit equal frames often (a group's
  rollouts share their first state), which is where the sharing pays.

`image_hashes` is a 128-bit BLAKE2b of each row's grids and padded pixels (their bytes), made once
when the batch is built and carried with it; a batch without them gets them on first use.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

import numpy as np
import torch
from tensordict import TensorDict

from roll.core.fields import Batch


class RowImages(NamedTuple):
    """The images of a batch's rows: `pixels` (B, P, D), `grids` (B, N, 3), zero-padded per row,
    and `hashes` (B, 2), equal for rows with equal images."""

    pixels: torch.Tensor
    grids: torch.Tensor
    hashes: torch.Tensor

    def select(self, rows: torch.Tensor) -> RowImages:
        return RowImages(*(t.index_select(0, rows.to(t.device)) for t in self))


def image_hashes(pixels: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
    """(B, 2) int64: a 128-bit BLAKE2b of each row's grids and pixels, as padded in this batch."""
    pixels, grids = pixels.detach().cpu().contiguous(), grids.detach().cpu().long().contiguous()
    out = []
    for row_pixels, row_grid in zip(pixels, grids):
        digest = hashlib.blake2b(row_grid.numpy().tobytes(), digest_size=16)
        digest.update(row_pixels.view(torch.uint8).numpy())  # the buffer, not a copy
        out.append(np.frombuffer(digest.digest(), dtype=np.int64))
    return torch.from_numpy(np.stack(out)) if out else torch.zeros((0, 2), dtype=torch.long)


def row_images(batch: TensorDict) -> RowImages | None:
    """The rows' images of `batch` with their hashes (`Batch.IMAGE_HASH`, made here when the batch
    has none); None for a batch without images."""
    if Batch.IMAGE_GRID_THW not in batch.keys():
        return None
    pixels, grids = batch[Batch.PIXEL_VALUES], batch[Batch.IMAGE_GRID_THW]
    hashes = batch[Batch.IMAGE_HASH] if Batch.IMAGE_HASH in batch.keys() else image_hashes(pixels, grids)
    return RowImages(pixels, grids, hashes.to(pixels.device))


def vision_inputs(images: RowImages | None) -> dict[str, torch.Tensor] | None:
    """The model's image inputs of these rows: every row's images in row order, their padding cut;
    None for rows without images."""
    if images is None:
        return None
    pixels, grids = [], []
    for row_pixels, row_grid in zip(images.pixels, images.grids):
        row_grid = row_grid[row_grid.any(dim=1)]
        grids.append(row_grid)
        pixels.append(row_pixels[: int(row_grid.prod(dim=1).sum())])
    return {"pixel_values": torch.cat(pixels), "image_grid_thw": torch.cat(grids)}
