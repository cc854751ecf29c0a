"""Rows' images in the trainer: keys equal exactly for equal images, and forwards shared only
between rows whose ids and images are both equal."""

from __future__ import annotations

import torch

from roll.distributed import row_images
from roll.distributed.micro_batches import distinct_rows
from roll.distributed.row_images import RowImages, image_row_keys, vision_inputs


def images(*rows: list[float], grid=(1, 2, 2)) -> RowImages:
    """One image of 4 patches of 2 values per row."""
    pixels = torch.tensor(rows, dtype=torch.float32).view(len(rows), 4, 2)
    return RowImages(pixels, torch.tensor([[grid]] * len(rows)))


A, B = [0.5, 1, 2, 3, 4, 5, 6, 7], [0.5, 1, 2, 3, 4, 5, 6, 7.0000005]  # B: one float bit apart


def groups(keys: torch.Tensor) -> list[int]:
    return torch.unique(keys, dim=0, return_inverse=True)[1].tolist()


def test_keys_are_equal_exactly_when_the_images_are():
    assert groups(image_row_keys(images(A, B, A, B))) == [0, 1, 0, 1]
    other_grid = RowImages(images(A, A).pixels, torch.tensor([[[1, 2, 2]], [[1, 4, 1]]]))
    assert groups(image_row_keys(other_grid)) == [0, 1]  # same pixels, another layout


def test_hashing_in_chunks_gives_the_same_keys(monkeypatch):
    whole = image_row_keys(images(A, B, A, A, B))
    monkeypatch.setattr(row_images, "HASH_CHUNK_ELEMENTS", 8)  # one row a chunk
    assert torch.equal(image_row_keys(images(A, B, A, A, B)), whole)


def test_a_hash_collision_shares_nothing(monkeypatch):
    """With every multiplier 1 the hash is the sum of the bits: [x, y] and [y, x] collide. The
    exact check then gives every row its own key rather than share a forward between them."""
    monkeypatch.setattr(row_images, "hash_weights", lambda width: torch.ones(width, dtype=torch.long))
    swapped = A[1:2] + A[:1] + A[2:]
    assert groups(image_row_keys(images(A, A))) == [0, 0]  # equal rows still share
    assert groups(image_row_keys(images(A, swapped, A))) == [0, 1, 2]


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
