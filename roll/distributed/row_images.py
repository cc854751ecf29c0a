"""The images a batch's rows carry, as the trainer's forwards need them.

A vision-language batch holds each row's images beside its ids (`Batch.PIXEL_VALUES` (B, P, D) and
`Batch.IMAGE_GRID_THW` (B, N, 3), zero-padded per row; `roll.pipeline.samples`). Two things are
read from them here:

- `vision_inputs`: the model's `pixel_values` and `image_grid_thw` for some rows, every row's
  images in row order with their padding cut, as the processor would have made them for those rows.
- `image_row_keys`: an integer key per row that is equal for two rows exactly when their images are
  equal (same grids, same pixels bit for bit). Rows with equal ids may show different images (a
  step-wise prompt is the current frame alone), so a forward may share one row's outputs with
  another's only when both their ids and their image keys are equal
  (`micro_batches.distinct_rows`). Step-wise samples revisit equal frames often (a group's
  rollouts share their first state), which is where the sharing pays.

The key is a 64-bit hash of each row's pixels (their float bits) and grids, made a chunk of rows at
a time; the grouping is exact: rows that share a key are compared pixel for pixel, and should two
different images share a hash, every row gets its own key (no sharing) instead.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from tensordict import TensorDict

from roll.core.fields import Batch

HASH_CHUNK_ELEMENTS = 1 << 22
"""Pixel values hashed per chunk of rows: bounds the int64 copy hashing makes (32 MiB)."""


class RowImages(NamedTuple):
    """The images of a batch's rows: `pixels` (B, P, D), `grids` (B, N, 3), zero-padded per row."""

    pixels: torch.Tensor
    grids: torch.Tensor

    def select(self, rows: torch.Tensor) -> RowImages:
        return RowImages(self.pixels.index_select(0, rows), self.grids.index_select(0, rows))


def row_images(batch: TensorDict) -> RowImages | None:
    """The rows' images of `batch`, None for a batch without images."""
    if Batch.IMAGE_GRID_THW not in batch.keys():
        return None
    return RowImages(batch[Batch.PIXEL_VALUES], batch[Batch.IMAGE_GRID_THW])


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


def image_row_keys(images: RowImages) -> torch.Tensor:
    """(B, 1 + 3N) int64: equal rows exactly when the rows' images are equal (module docstring)."""
    pixels = images.pixels.contiguous()
    bits = pixels.view(torch.int32) if pixels.dtype == torch.float32 else pixels.float().view(torch.int32)
    flat = bits.reshape(len(bits), -1)
    weights = hash_weights(flat.shape[1]).to(flat.device)
    step = max(1, HASH_CHUNK_ELEMENTS // max(flat.shape[1], 1))
    hashes = torch.cat(
        [(flat[i : i + step].long() * weights).sum(dim=1) for i in range(0, len(flat), step)]
        or [torch.zeros(0, dtype=torch.long, device=flat.device)]
    )
    keys = torch.cat([hashes[:, None], images.grids.reshape(len(flat), -1).long()], dim=1)
    if not _hash_groups_are_exact(flat, keys, step):
        return torch.arange(len(flat), device=flat.device)[:, None]  # a collision: no two rows share
    return keys


def hash_weights(width: int) -> torch.Tensor:
    """(width,) fixed odd int64 multipliers of the pixel hash."""
    return torch.randint(-(2**62), 2**62, (width,), generator=torch.Generator().manual_seed(1)) | 1


def _hash_groups_are_exact(flat: torch.Tensor, keys: torch.Tensor, step: int) -> bool:
    """Whether every row's pixels equal those of the first row with its key."""
    if len(flat) == 0:
        return True
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    rows = torch.arange(len(flat), device=flat.device)
    first = torch.full((int(inverse.max()) + 1,), len(flat), dtype=rows.dtype, device=rows.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")[inverse]
    return all(
        torch.equal(flat[i : i + step], flat.index_select(0, first[i : i + step])) for i in range(0, len(flat), step)
    )
