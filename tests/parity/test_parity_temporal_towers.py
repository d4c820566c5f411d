"""Packed-patch vision towers whose configs state no `temporal_patch_size` (their image processors' is for video, or
a default): Cosmos 3 Edge's packed SigLIP 2 (`pixel_values` in 2 x 2 merge blocks, each patch's values laid out
(p, p, C) as SigLIP 2's processor lays them), Dots3 Note's (`pixel_values`, a Conv2d patch embedding, 2-D RoPE; its
files in its original checkpoint's layout, `vision_encoder.`, which its classes' own conversion mappings rename) and
ERNIE 4.5-VL's (`hidden_states`, a Linear patch embedding; its files under `model.vision_model.`) hold one time step
per patch, Muse Glimmer's two (raster patches laid out (t, C, p, p), moved into windows of its position table's size
before its blocks, merged after them), as their patch embeddings say (`vitviz.core.running.live.packing.temporal_size`).

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
SIZE = (32, 48)       # 8 x 12 patches of 4 px, whole 2 x 2 merge blocks
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=4,
              spatial_merge_size=2)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            head_dim=16, vocab_size=100)


def _cosmos3_edge() -> Any:
    text = dict(TEXT, rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 4]})
    config = transformers.Cosmos3EdgeConfig(vision_config=dict(VISION, num_patches=64), text_config=text,
                                            projector_hidden_size=32)
    return transformers.Cosmos3EdgeForConditionalGeneration(config)


def _dots3_note() -> Any:
    vision = dict(VISION, adapter_in_dim=32, adapter_out_dim=32, mlp_layer_types=["dense", "dense"])
    text = dict(TEXT, num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                v_head_dim=8, moe_intermediate_size=32, n_routed_experts=2, num_experts_per_tok=1, index_head_dim=16,
                index_n_heads=2, index_topk=8, shared_experts_intermediate_size=32, pad_token_id=0, bos_token_id=1,
                eos_token_id=2)
    audio = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                 intermediate_size=64, adapter_input_size=32, adapter_out_dim=32)
    config = transformers.Dots3NoteConfig(vision_config=vision, text_config=text, audio_config=audio)
    return transformers.Dots3NoteForConditionalGeneration(config)


def _ernie4_5_vl() -> Any:
    vision = dict(VISION, depth=2, num_heads=4)
    del vision["num_hidden_layers"], vision["num_attention_heads"]
    text = dict(TEXT, num_attention_heads=4, num_key_value_heads=2, head_dim=8, moe_num_experts=2, moe_k=1,
                moe_num_shared_experts=1, moe_intermediate_size=[32, 32],
                rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 500000.0})
    config = transformers.Ernie4_5_VLMoeConfig(vision_config=vision, text_config=text)
    return transformers.Ernie4_5_VLMoeForConditionalGeneration(config)


def _muse_glimmer() -> Any:
    vision = dict(VISION, patch_temporal=2, merge_size=2, pos_emb_height=4, pos_emb_width=4,
                  layer_types=["window_attention", "full_attention"])     # windows of 4 x 4 patches: 2 x 3 of them
    del vision["spatial_merge_size"]
    text = dict(TEXT, moe_intermediate_size=32, num_local_experts=2, num_experts_per_tok=1, moe_hidden_size=32,
                bos_token_id=1, eos_token_id=2)
    config = transformers.MuseGlimmerConfig(vision_config=vision, text_config=text, projector_hidden_size=32,
                                            out_hidden_size=32)
    return transformers.MuseGlimmerForConditionalGeneration(config)


# model_type: (builder, the tower inside the whole model, its image processor class, its tower class, the argument
# its forward takes the packed patches as)
MODELS = {
    "cosmos3_edge": (_cosmos3_edge, lambda m: m.model.visual, "Cosmos3EdgeImageProcessor", "Cosmos3EdgeVisionModel",
                     "pixel_values"),
    "dots3_note": (_dots3_note, lambda m: m.model.vision_tower, "Qwen2VLImageProcessor", "Dots3NoteVisionModel",
                   "pixel_values"),
    "ernie4_5_vl_moe": (_ernie4_5_vl, lambda m: m.model.vision_tower, "Ernie4_5_VLMoeImageProcessor",
                        "Ernie4_5_VLMoeVisionTransformerPretrainedModel", "hidden_states"),
    "muse_glimmer": (_muse_glimmer, lambda m: m.model.vision_tower, "MuseGlimmerImageProcessor",
                     "MuseGlimmerVisionModel", "pixel_values"),
}
STEPS = {"muse_glimmer": 2}     # time steps per patch (the others' patch embeddings take 1)


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return {}


def _model(name: str, built: dict[str, Any]) -> Any:
    return built_once(built, name, MODELS[name][0], part=MODELS[name][1])


_RECORDED: list[torch.Tensor] = []


transformers.AttentionInterface.register("temporal_recorded_eager", eager_recorder(_RECORDED))


def _reference(name: str, tower: Any, x: torch.Tensor) -> tuple[list[np.ndarray], np.ndarray]:
    """transformers' per-layer (H, T, T) maps, each token put on the raster grid by where the model's own image
    processor put its pixels (an image of patch coordinates packed alike) and, where the tower moves its tokens into
    windows (Muse Glimmer), by which row of its first block's input each is (an exact match); and its tokens' mean.
    A windowed layer's windows are laid on the diagonal of the sequence it attends over."""
    config = tower.config
    processor = getattr(transformers, MODELS[name][2])()
    steps = STEPS.get(name, 1)

    def patchify(image: torch.Tensor) -> Any:
        if name == "muse_glimmer":       # raster patches: no merge size
            return processor.patchify(image, config.patch_size, steps)
        return processor.patchify(image, config.patch_size, config.spatial_merge_size, steps)

    patches, gh, gw = patchify(x)
    coords = torch.zeros_like(x)
    coords[0, 0] = (torch.arange(SIZE[0]) // config.patch_size)[:, None].float()
    coords[0, 1] = (torch.arange(SIZE[1]) // config.patch_size)[None, :].float()
    where, _, _ = patchify(coords)
    # a patch's values are (C, t, p, p) (Qwen2-VL, ERNIE), (p, p, C) (Cosmos 3 Edge) or (t, C, p, p) (Muse):
    # channel 1 of its first pixel
    second = {"cosmos3_edge": 1}.get(name, config.patch_size ** 2)
    cell = (where[0, :, 0] * gw + where[0, :, second]).long()          # processor position -> raster cell
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    if name == "muse_glimmer":       # its embeddings (normed) and what its first block takes: the window order
        hooks = [tower.ln_pre.register_forward_hook(lambda _m, _a, o: seen.update(embed=o)),
                 tower.layers[0].register_forward_pre_hook(
                     lambda _m, a, kw: seen.update(block=a[0] if a else kw["hidden_states"]), with_kwargs=True)]
    own = config._attn_implementation
    config._attn_implementation = "temporal_recorded_eager"
    _RECORDED.clear()
    try:
        with torch.no_grad():
            out = tower(**{MODELS[name][4]: patches[0]}, grid_thw=torch.tensor([[1, gh, gw]]))
    finally:
        config._attn_implementation = own
        for h in hooks:
            h.remove()
    n = cell.numel()
    moved = torch.arange(n)                                              # block position -> processor position
    if seen:
        d = torch.cdist(seen["block"].reshape(n, -1), seen["embed"].reshape(n, -1),
                        compute_mode="donot_use_mm_for_euclid_dist")
        assert float(d.min(dim=1).values.max()) == 0.0
        moved = d.argmin(dim=1)
    placed = torch.empty_like(cell)
    placed[cell[moved]] = torch.arange(n)                                # raster cell -> position in the blocks
    maps, i = [], 0
    while i < len(_RECORDED):       # one layer: as many calls as cover the n tokens (its windows)
        parts, covered = [], 0
        while covered < n:
            parts.append(_RECORDED[i])
            covered += int(_RECORDED[i].shape[-1])
            i += 1
        full, at = torch.zeros(parts[0].shape[0], n, n), 0
        for part in parts:
            full[:, at:at + part.shape[-1], at:at + part.shape[-1]] = part
            at += int(part.shape[-1])
        maps.append(full[:, placed][:, :, placed].numpy())
    return maps, out.last_hidden_state.mean(dim=0).numpy()


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
    assert f"{STEPS.get(name, 1)} time step" in path and MODELS[name][3] in path
    assert ("by its code" in path) == (route != "tower")


@pytest.mark.parametrize("name", list(MODELS))
def test_verify_gives_a_verdict(tmp_path: Path, built: dict[str, Any], name: str) -> None:
    check = vitviz.verify(_load(_saved(name, built, tmp_path)))
    assert check.verified, check.summary()
    assert check.max_attention <= ATOL and MODELS[name][3] in check.original


def test_a_patch_laid_out_channels_first_is_seen(tmp_path: Path, built: dict[str, Any]) -> None:
    """Cosmos 3 Edge's patches laid out (C, p, p), as the Qwen-VL processors lay them, instead of its processor's
    (p, p, C): other embeddings, other maps (the parity above can fail), and verify, which packs the probe with the
    model's own processor, says it differs."""
    vm = _load(_saved("cosmos3_edge", built, tmp_path))
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    right = vm.forward_captured(x)[0]
    vm.net.layout = "(C, t, p, p)"
    assert np.abs(vm.forward_captured(x)[0] - right).max() > 1e-3
    check = vitviz.verify(vm)
    assert check.verdict == "differs" and check.first_differing_layer == 0


def test_dots3_file_is_its_original_layout(tmp_path: Path, built: dict[str, Any]) -> None:
    """Dots3 Note's files name its tower as its original checkpoint does (`vision_encoder.`, `norm_1`, `fc3`): only
    those tensors are read, renamed as transformers renames them loading the whole model."""
    from vitviz.core.reading.checkpoint import read_checkpoint

    raw = read_checkpoint(str(_saved("dots3_note", built, tmp_path)))
    tower = MODELS["dots3_note"][1](_model("dots3_note", built))
    assert raw.tower.prefix == "vision_encoder." and len(raw.tensors) == len(tower.state_dict())
    assert any(".norm_1." in k for k in raw.tensors) and not any(".norm1." in k for k in raw.tensors)


def test_muse_windows_are_placed_by_its_own_window_order(built: dict[str, Any],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Muse Glimmer moves its raster patches into windows of 4 x 4 patches before its blocks (its module's
    `get_vision_window_index`); the maps taken in raster order instead differ: the parity above can fail."""
    from vitviz.core.running.live.packing import PackedTower

    vm = _load(MODELS["muse_glimmer"][1](_model("muse_glimmer", built)))
    assert "blocks 0 attend within windows of 16 px" in vm.spec.source_of("path")
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    right = vm.forward_captured(x)[0]
    monkeypatch.setattr(PackedTower, "_window_position", lambda self, rows, cols: None)
    assert np.abs(vm.forward_captured(x)[0] - right).max() > 1e-3
