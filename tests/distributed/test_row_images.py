"""Rows' images in the trainer: hashes equal for equal images, and forwards shared only between
rows whose ids and images are both equal."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from roll.core.fields import Batch
from roll.core.records import ImageInputs
from roll.distributed.micro_batches import distinct_rows
from roll.distributed.row_images import RowImages, image_hashes, row_images, vision_inputs
from roll.pipeline.phases.batch import image_batch


def pixels(*rows: list[float]) -> torch.Tensor:
    """One image of 4 patches of 2 values per row."""
    return torch.tensor(rows, dtype=torch.float32).view(len(rows), 4, 2)


def images(*rows: list[float]) -> RowImages:
    grids = torch.tensor([[[1, 2, 2]]] * len(rows))
    return RowImages(pixels(*rows), grids, image_hashes(pixels(*rows), grids))


A, B = [0.5, 1, 2, 3, 4, 5, 6, 7], [0.5, 1, 2, 3, 4, 5, 6, 7.0000005]  # B: one float bit apart


def groups(hashes: torch.Tensor) -> list[int]:
    """Each row's group, numbered in the order of first appearance."""
    seen: dict[tuple[int, ...], int] = {}
    return [seen.setdefault(tuple(row.tolist()), len(seen)) for row in hashes]


def test_hashes_are_equal_for_equal_images_only():
    assert groups(images(A, B, A, B).hashes) == [0, 1, 0, 1]
    other_grid = torch.tensor([[[1, 2, 2]], [[1, 4, 1]]])
    assert groups(image_hashes(pixels(A, A), other_grid)) == [0, 1]  # same pixels, another layout


def test_a_batch_carries_its_hashes_and_a_batch_without_gets_them():
    frames = [ImageInputs(pixels(A)[0], [[1, 2, 2]]), ImageInputs(pixels(B)[0], [[1, 2, 2]])]
    built = image_batch(frames * 2)
    assert groups(built[Batch.IMAGE_HASH]) == [0, 1, 0, 1]
    batch = TensorDict(built, batch_size=[4])
    assert torch.equal(row_images(batch).hashes, built[Batch.IMAGE_HASH])
    bare = batch.exclude(Batch.IMAGE_HASH)
    assert torch.equal(row_images(bare).hashes, built[Batch.IMAGE_HASH])
    assert row_images(bare.exclude(*Batch.IMAGE_KEYS)) is None


def test_rows_share_a_forward_only_with_equal_ids_and_images():
    ids = torch.tensor([[1, 2, 3, 9], [1, 2, 3, 8], [1, 2, 3, 7], [1, 2, 4, 7]])
    mask = torch.ones_like(ids)
    assert distinct_rows(ids, mask).inverse.tolist() == [0, 0, 0, 1]  # text: the last id is a label
    rows = distinct_rows(ids, mask, images(A, B, A, A))
    assert rows.inverse.tolist() == [0, 1, 0, 2] and rows.index.tolist() == [0, 1, 3]


def test_vision_inputs_cut_each_rows_padding():
    padded = images(A, B)
    padded.grids[1, 0] = torch.tensor([1, 1, 2])  # row 1: one image of 2 patches, 2 padding patches
    vision = vision_inputs(padded)
    assert vision["image_grid_thw"].tolist() == [[1, 2, 2], [1, 1, 2]]
    assert torch.equal(vision["pixel_values"], torch.cat([padded.pixels[0], padded.pixels[1, :2]]))
