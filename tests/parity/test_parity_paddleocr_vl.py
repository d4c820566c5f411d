"""PaddleOCR-VL's vision encoder, whose forward takes `(pixel_values, grid_thw)` with the image's patches in raster
order as its image processor lays them out ((1, T, C, p, p)) and 2-D rotary positions on q and k, run by its own
transformers code (`vitviz.core.running.live.packing.RASTER`).

Built tiny with random weights as the whole model (a one-layer text model beside it), saved with `save_pretrained`
and opened by file, handed over as the whole model, and as its tower. The reference is transformers' own: the image
packed by its own image processor (`PaddleOCRVLImageProcessor.patchify`) and the attention weights its eager
attention returns (`output_attentions`); vitviz's maps equal them at 1e-5 on a non-square grid, and `vitviz.verify`
gives its verdict."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import vitviz

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
SIZE = (32, 48)       # 8 x 12 patches of 4 px, whole 2 x 2 merge blocks (the processor's factor)


@pytest.fixture(scope="module")
def model() -> Any:
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=4, spatial_merge_size=2)
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, vocab_size=100,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 4]})
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.PaddleOCRVLConfig(vision_config=vision, text_config=text)
        built = transformers.PaddleOCRVLForConditionalGeneration(config).eval()
    with torch.no_grad():         # weights far from their initialisation: attention that is not near-uniform
        for p in built.model.visual.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.2)
    return built


def _reference(tower: Any, x: torch.Tensor) -> tuple[list[np.ndarray], np.ndarray]:
    """transformers' per-layer (H, T, T) maps (raster order: the processor's) and its tokens' mean."""
    config = tower.config
    patches, gh, gw = transformers.PaddleOCRVLImageProcessor().patchify(x, config.patch_size, config.spatial_merge_size,
                                                                         1)
    own = config._attn_implementation
    tower.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = tower(pixel_values=patches, grid_thw=torch.tensor([[1, gh, gw]]), output_attentions=True)
    finally:
        tower.set_attn_implementation(own)
    maps = [layer[0][0].numpy() for layer in out.attentions]      # each layer: one (1, H, T, T) per image
    return maps, out.last_hidden_state.mean(dim=0).numpy()


def _load(what: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(what, image_size=SIZE)


@pytest.mark.parametrize("route", ["file", "whole model", "tower"])
def test_parity(tmp_path: Path, model: Any, route: str) -> None:
    if route == "file":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.save_pretrained(tmp_path)
    vm = _load({"file": tmp_path, "whole model": model, "tower": model.model.visual}[route])
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    ours, out = vm.forward_captured(x)
    theirs, pooled = _reference(model.model.visual, x)
    assert ours.shape[1] == len(theirs) == 2 and vm.spec.pos_grid == (8, 12) and vm.spec.num_prefix == 0
    for i, ref in enumerate(theirs):
        np.testing.assert_allclose(ours[0, i], ref, atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(out[0], pooled, atol=ATOL)
    path = vm.spec.source_of("path")
    assert "raster order" in path and "PaddleOCRVisionModel" in path
    assert ("by its code" in path) == (route != "tower")


def test_verify_gives_a_verdict(tmp_path: Path, model: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path)
    check = vitviz.verify(_load(tmp_path))
    assert check.verified, check.summary()
    assert check.max_attention <= ATOL and "PaddleOCRVisionModel" in check.original


def test_a_wrong_patch_order_is_seen(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The patches packed in merge blocks (the Qwen-VL processors' order) instead of raster order change the maps:
    the parity above can fail."""
    from vitviz.core.running.live.packing import PackedTower

    vm = _load(model.model.visual)
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    right = vm.forward_captured(x)[0]
    pack = PackedTower.pack

    def merge_blocks(self: PackedTower, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        patches, grid = pack(self, image)
        rows, cols = int(grid[0, 1]), int(grid[0, 2])
        order = torch.arange(rows * cols).reshape(rows // 2, 2, cols // 2, 2).permute(0, 2, 1, 3).reshape(-1)
        return patches[:, order], grid

    monkeypatch.setattr(PackedTower, "pack", merge_blocks)
    assert np.abs(vm.forward_captured(x)[0] - right).max() > 1e-3
