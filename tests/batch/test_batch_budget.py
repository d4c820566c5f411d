"""`vitviz export` picks its batch size from a memory budget unless told (issue 25: DINOv2 at 518 px with rollout
took 11.4 GB at the old fixed batch of 8, against 2.8 GB at batch 1)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from _tiny import HEADS


def _spec(depth: int, heads: int, grid: int, patch: int = 14, reg: int = 4):  # noqa: ANN202
    from vitviz.core.spec import ModelSpec

    return ModelSpec(family="timm", source="x", image_size=(grid * patch, grid * patch), patch_size=patch,
                     embed_dim=64 * heads, depth=depth, num_heads=heads, reg_tokens=reg, pos_grid=(grid, grid))


def test_a_large_token_count_with_rollout_gets_a_small_batch() -> None:
    from vitviz.batch.plan import auto_batch_size, parse_maps

    dinov2 = _spec(12, 6, 37)                      # ViT-S/14 at 518 px: 1 + 4 + 1369 tokens
    n, why = auto_batch_size(dinov2, parse_maps("cls,rollout"), free=24 << 30)
    per_image = 12 * 6 * 1374 ** 2 * 4 + 2 * 12 * 1374 ** 2 * 4
    assert n == max(1, min(8, (2 << 30) // (2 * per_image))) and n <= 2
    assert f"batch size {n}" in why and "1374^2" in why and "--batch-size" in why
    small = _spec(2, 2, 4, patch=8, reg=0)
    assert auto_batch_size(small, parse_maps("cls"))[0] == 8
    # float16 halves what an image holds; little free memory shrinks the budget
    assert auto_batch_size(dinov2, parse_maps("cls"), half=True)[0] >= auto_batch_size(dinov2, parse_maps("cls"))[0]
    assert auto_batch_size(dinov2, parse_maps("cls"), free=1 << 30)[0] == 1


def test_a_budget_counts_the_query_rows_the_capture_keeps() -> None:
    """CLS maps keep one query row per layer (and compute one layer's whole matrix at a time): a --memory that two
    images' full maps exceed holds them; maps that read every row are refused, naming what fits."""
    from vitviz.batch.plan import BudgetError, check_budget, image_bytes, parse_maps

    dinov2 = _spec(12, 6, 37)
    t = 1374
    assert image_bytes(dinov2, parse_maps("entropy")) == 12 * 6 * t * t * 4
    assert image_bytes(dinov2, parse_maps("cls")) == 12 * 6 * 1 * t * 4 + 2 * 6 * t * t * 4
    assert image_bytes(dinov2, parse_maps("cls"), npz=True) == 12 * 6 * t * t * 4   # .npz keeps every row
    check_budget(dinov2, parse_maps("cls"), False, 1, 1 << 30)
    with pytest.raises(BudgetError, match="at least"):
        check_budget(dinov2, parse_maps("entropy"), False, 1, 1 << 30)


def test_export_says_the_batch_it_chose(tiny_ckpt: Path, photo: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from vitviz.cli import main

    out = tmp_path / "o"
    assert main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), str(photo), "--out", str(out),
                 "--no-verify"]) == 0
    err = capsys.readouterr().err
    assert "vitviz: batch size 8" in err
    assert json.loads((out / "manifest.json").read_text())["parameters"]["batch_size"] == 8
    assert main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), str(photo), "--out", str(out),
                 "--no-verify", "--batch-size", "3", "--overwrite"]) == 0
    assert "batch size" not in capsys.readouterr().err
