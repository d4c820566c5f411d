"""Vision encoders whose forward takes `(pixel_values, grid_thw)` with the image's patches in raster order, as their
image processor lays them out (`vitviz.core.running.live.packing.RASTER`), run by their own transformers code:
PaddleOCR-VL's (2-D rotary positions on q and k; pixel_values (1, T, C, p, p)), HunYuan-VL's (pixel_values
(T, C * p * p)) and Kimi-K2.5's MoonViT ((T, C, p, p), 2-D rotary positions); HunYuan-VL's and Kimi-K2.5's files are
in their original checkpoints' layouts (`vit.`, `vision_tower.encoder.blocks.` in their own names), which
transformers' own conversion mapping of the whole model renames.

Each is built tiny with random weights as the whole model (a one-layer text model beside it), saved with
`save_pretrained` and opened by file, handed over as the whole model, and as its tower. The reference is
transformers' own: the image packed by the model's own image processor (`patchify`) and every attention weight its
eager attention function returns (recorded through transformers' `AttentionInterface`, not through vitviz's
capture); vitviz's maps equal them at 1e-5 on a non-square grid, and `vitviz.verify` gives its verdict."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from parity_refs import built_once, eager_recorder

import vitviz

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
SIZE = (32, 48)       # 8 x 12 patches of 4 px, whole 2 x 2 merge blocks (the processors' factor)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=4,
              spatial_merge_size=2)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, vocab_size=100)


def _paddleocr_vl() -> Any:
    config = transformers.PaddleOCRVLConfig(vision_config=dict(VISION, image_size=32), text_config=dict(
        TEXT, rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 4]}))
    return transformers.PaddleOCRVLForConditionalGeneration(config)


def _hunyuan_vl() -> Any:
    config = transformers.HunYuanVLConfig(vision_config=dict(VISION, max_image_size=64, text_hidden_size=32),
                                          text_config=TEXT)
    return transformers.HunYuanVLForConditionalGeneration(config)


def _kimi_k25() -> Any:
    vision = dict(VISION, pos_emb_height=8, pos_emb_width=8, merge_kernel_size=[2, 2])
    del vision["spatial_merge_size"]
    text = dict(TEXT, num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                qk_nope_head_dim=8, v_head_dim=8, moe_intermediate_size=32, n_routed_experts=2, num_experts_per_tok=1,
                first_k_dense_replace=1, n_group=1, topk_group=1)
    config = transformers.Kimi_K25Config(vision_config=vision, text_config=text, projection_hidden_size=32)
    return transformers.Kimi_K25ForConditionalGeneration(config)


# model_type: (builder, the tower inside the whole model, its image processor class, its tower class)
MODELS = {
    "paddleocr_vl": (_paddleocr_vl, lambda m: m.model.visual, "PaddleOCRVLImageProcessor", "PaddleOCRVisionModel"),
    "hunyuan_vl": (_hunyuan_vl, lambda m: m.model.vision_tower, "HunYuanVLImageProcessor",
                   "HunYuanVLVisionTransformer"),
    "kimi_k25": (_kimi_k25, lambda m: m.model.vision_tower, "Kimi_K25ImageProcessor", "Kimi_K25VisionModel"),
}


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return {}


def _model(name: str, built: dict[str, Any]) -> Any:
    return built_once(built, name, MODELS[name][0], part=MODELS[name][1])


_RECORDED: list[torch.Tensor] = []


transformers.AttentionInterface.register("raster_recorded_eager", eager_recorder(_RECORDED))


def _reference(name: str, tower: Any, x: torch.Tensor) -> tuple[list[np.ndarray], np.ndarray]:
    """transformers' per-layer (H, T, T) maps (raster order: the processor's) and its tokens' mean."""
    config = tower.config
    processor = getattr(transformers, MODELS[name][2])()
    patches, gh, gw = processor.patchify(x, config.patch_size) if name == "kimi_k25" else \
        processor.patchify(x, config.patch_size, config.spatial_merge_size, 1)
    own = config._attn_implementation
    config._attn_implementation = "raster_recorded_eager"
    _RECORDED.clear()
    try:
        with torch.no_grad():
            out = tower(pixel_values=patches if name == "paddleocr_vl" else patches[0],
                        grid_thw=torch.tensor([[1, gh, gw]]))
    finally:
        config._attn_implementation = own
    hidden = out.last_hidden_state
    return [m.numpy() for m in _RECORDED], (hidden[0] if hidden.dim() == 3 else hidden).mean(dim=0).numpy()


def _load(what: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(what, image_size=SIZE)


def _saved(name: str, built: dict[str, Any], folder: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _model(name, built).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("route", ["file", "whole model", "tower"])
def test_parity(tmp_path: Path, built: dict[str, Any], name: str, route: str) -> None:
    model = _model(name, built)
    tower = MODELS[name][1](model)
    vm = _load({"file": lambda: _saved(name, built, tmp_path), "whole model": lambda: model,
                "tower": lambda: tower}[route]())
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    ours, out = vm.forward_captured(x)
    theirs, pooled = _reference(name, tower, x)
    assert ours.shape[1] == len(theirs) == 2 and vm.spec.pos_grid == (8, 12) and vm.spec.num_prefix == 0
    for i, ref in enumerate(theirs):
        np.testing.assert_allclose(ours[0, i], ref, atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(out[0], pooled, atol=ATOL)
    path = vm.spec.source_of("path")
    assert "raster order" in path and MODELS[name][3] in path
    assert ("by its code" in path) == (route != "tower")


@pytest.mark.parametrize("name", list(MODELS))
def test_verify_gives_a_verdict(tmp_path: Path, built: dict[str, Any], name: str) -> None:
    check = vitviz.verify(_load(_saved(name, built, tmp_path)))
    assert check.verified, check.summary()
    assert check.max_attention <= ATOL and MODELS[name][3] in check.original


def test_hunyuan_file_is_its_original_layout(tmp_path: Path, built: dict[str, Any]) -> None:
    """HunYuan-VL's files name its tower as its original checkpoint does (`vit.`, `dense_h_to_4h`): only those
    tensors are read, renamed by transformers' own conversion of the whole model."""
    from vitviz.core.reading.checkpoint import read_checkpoint

    raw = read_checkpoint(str(_saved("hunyuan_vl", built, tmp_path)))
    tower = MODELS["hunyuan_vl"][1](_model("hunyuan_vl", built))
    assert raw.tower.prefix == "vit." and len(raw.tensors) == len(tower.state_dict())
    assert any("dense_h_to_4h" in k for k in raw.tensors)


def test_a_wrong_patch_order_is_seen(built: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The patches packed in merge blocks (the Qwen-VL processors' order) instead of raster order change the maps:
    the parity above can fail."""
    from vitviz.core.running.live.packing import PackedTower

    vm = _load(MODELS["paddleocr_vl"][1](_model("paddleocr_vl", built)))
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


def test_keys_the_whole_model_ignores_are_ignored(tmp_path: Path, built: dict[str, Any]) -> None:
    """PaddleOCR-VL's checkpoints keep tensors its tower has not (a SigLIP head, a packing position table), which
    the whole model's class ignores on loading (`_keys_to_ignore_on_load_unexpected`): so does its tower by file;
    any other stray tower tensor is still refused."""
    from safetensors.torch import load_file, save_file

    folder = _saved("paddleocr_vl", built, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    extra = {"visual.vision_model.head.probe": torch.zeros(1, 1, 32), "visual.packing_position_embedding.weight":
             torch.zeros(4, 32)}
    save_file({**tensors, **extra}, str(folder / "model.safetensors"))
    assert _load(folder).spec.source_of("path").count("by its code") == 1
    save_file({**tensors, "visual.vision_model.stray.weight": torch.zeros(2)}, str(folder / "model.safetensors"))
    with pytest.raises(vitviz.VitvizError, match="not in the tower: vision_model.stray.weight"):
        _load(folder)
