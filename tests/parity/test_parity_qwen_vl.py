"""The Qwen-VL family's vision transformers -- Qwen2-VL, Qwen2.5-VL (windowed and full-attention blocks), Qwen3-VL,
GLM-4V, GLM-GA, HyperCLOVA X (a Qwen2.5-VL tower under `vision_model`), Cosmos 3 Omni (a Qwen3-VL whose files keep
the tower at their root), Ovis 2.5 (windowed blocks named by `layer_types`, `pixel_values`), which take packed
patches and `grid_thw` -- and Pixtral (Mistral 3, Mistral Large 4: its files in Mistral's own names under
`vision_encoder.`), run by their own transformers code.

Each is built tiny with random weights as its whole vision-language model (a one-layer text model beside it), saved
with `save_pretrained` (what `hf:ORG/NAME` downloads) and opened by file, `vitviz.load(folder)`, and handed over as
a live object, `vitviz.load(model)`. The reference is transformers' own: the image packed by the model's own image
processor class (`patchify`), every attention weight its eager attention function returns (recorded through
transformers' `AttentionInterface`, not through vitviz's capture), a windowed layer's windows placed on the
diagonal, and each token put on the image's grid by where the processor put its pixels (an image of patch
coordinates, packed the same way) and where the tower moves it (its first block's input matched to its patch
embedding). vitviz's maps equal them at 1e-5, on a non-square grid; `vitviz.verify` gives a verdict.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from parity_refs import built_once

import vitviz

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
SIZE = (32, 48)       # a non-square grid of 8 x 12 patches of 4 px (4 x 6 merge blocks)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=100)
MROPE = {"rope_type": "default", "mrope_section": [2, 2, 4]}
PACKED = dict(patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_heads=4)


def _qwen2_vl() -> Any:
    cfg = transformers.Qwen2VLConfig(text_config=dict(TEXT, rope_parameters=MROPE),
                                     vision_config=dict(PACKED, depth=2, embed_dim=32, hidden_size=32))
    return transformers.Qwen2VLForConditionalGeneration(cfg)


def _qwen2_5_vl() -> Any:
    # windows of 24 px = 3 x 3 merge blocks: the 4 x 6 blocks make full and partial windows
    cfg = transformers.Qwen2_5_VLConfig(text_config=dict(TEXT, rope_parameters=MROPE), vision_config=dict(
        PACKED, depth=4, hidden_size=32, intermediate_size=64, window_size=24, fullatt_block_indexes=[1, 3],
        out_hidden_size=32))
    return transformers.Qwen2_5_VLForConditionalGeneration(cfg)


def _qwen3_vl() -> Any:
    cfg = transformers.Qwen3VLConfig(text_config=dict(TEXT, rope_parameters=MROPE), vision_config=dict(
        PACKED, depth=3, hidden_size=32, intermediate_size=64, out_hidden_size=32, num_position_embeddings=64,
        deepstack_visual_indexes=[1]))
    return transformers.Qwen3VLForConditionalGeneration(cfg)


def _glm4v() -> Any:
    cfg = transformers.Glm4vConfig(text_config=dict(TEXT), vision_config=dict(
        PACKED, depth=2, hidden_size=32, intermediate_size=64, image_size=32, out_hidden_size=32))
    return transformers.Glm4vForConditionalGeneration(cfg)


def _glmga() -> Any:
    # GLM-GA: GLM-4.6V's model and processor (transformers wires glmga to them), its own config and image processor
    cfg = transformers.GlmgaConfig(text_config=dict(TEXT), vision_config=dict(
        PACKED, depth=2, hidden_size=32, intermediate_size=64, image_size=32, out_hidden_size=32))
    return transformers.Glm46VForConditionalGeneration(cfg)


def _hyperclovax() -> Any:
    # HyperCLOVA X SEED vision: a Qwen2.5-VL tower (windows of 3 x 3 merge blocks in blocks 0, 2) under vision_model.
    cfg = transformers.HyperCLOVAXVisionV2Config(text_config=dict(TEXT), vision_config=dict(
        PACKED, depth=4, hidden_size=32, intermediate_size=64, window_size=24, fullatt_block_indexes=[1, 3],
        out_hidden_size=32))
    return transformers.HyperCLOVAXVisionV2ForConditionalGeneration(cfg)


def _mistral3() -> Any:
    vision = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, image_size=48, patch_size=4, head_dim=8)
    cfg = transformers.Mistral3Config(vision_config=vision.to_dict(), image_token_index=99, spatial_merge_size=2,
                                      text_config=transformers.MistralConfig(**TEXT, head_dim=16).to_dict())
    return transformers.Mistral3ForConditionalGeneration(cfg)


def _cosmos3_omni() -> Any:
    """Cosmos 3 Omni: a Qwen3-VL whose files keep the tower at their root (`blocks.`, `merger.` ...)."""
    cfg = transformers.Cosmos3OmniConfig(text_config=dict(TEXT, rope_parameters=MROPE), vision_config=dict(
        PACKED, depth=3, hidden_size=32, intermediate_size=64, out_hidden_size=32, num_position_embeddings=64,
        deepstack_visual_indexes=[1]))
    return transformers.Cosmos3OmniForConditionalGeneration(cfg)


def _mistral_large4() -> Any:
    """Mistral Large 4: a Pixtral tower its files keep under `vision_encoder.` in Mistral's names (wq, wk saved for
    interleaved RoPE)."""
    vision = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, image_size=48, patch_size=4, head_dim=8)
    text = dict(TEXT, moe_intermediate_size=32, num_key_value_heads=2, kv_lora_rank=16, qk_rope_head_dim=8,
                qk_nope_head_dim=8, qk_head_dim=16, v_head_dim=8, head_dim=8, index_n_heads=2, index_head_dim=16,
                index_topk=8, n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1, first_k_dense_replace=1)
    cfg = transformers.MistralLarge4Config(vision_config=vision.to_dict(), text_config=text, image_token_index=99,
                                           spatial_merge_size=2)
    return transformers.MistralLarge4ForConditionalGeneration(cfg)


def _ovis2_5() -> Any:
    """Ovis 2.5: packed as Qwen2.5-VL (merge blocks, windows of 24 px here) with `pixel_values`, its window and
    full-attention layers named by `layer_types`; its files in the original layout (`visual_tokenizer.vit.`)."""
    vision = dict(PACKED, temporal_patch_size=1, num_attention_heads=4, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=3, image_size=32, window_size=24, hidden_stride=2, vocab_size=64,
                  layer_types=["window_attention", "full_attention", "window_attention"])
    del vision["num_heads"]
    cfg = transformers.Ovis2_5Config(vision_config=vision, text_config=dict(TEXT, head_dim=16))
    return transformers.Ovis2_5ForConditionalGeneration(cfg)


# model_type: (builder, the tower inside the whole model, its image processor class (None: Pixtral's raster order),
# whether the tower moves its tokens after the patch embedding into windows)
MODELS = {
    "qwen2_vl": (_qwen2_vl, lambda m: m.model.visual, "Qwen2VLImageProcessor", False),
    "qwen2_5_vl": (_qwen2_5_vl, lambda m: m.model.visual, "Qwen2VLImageProcessor", True),
    "qwen3_vl": (_qwen3_vl, lambda m: m.model.visual, "Qwen2VLImageProcessor", False),
    "glm4v": (_glm4v, lambda m: m.model.visual, "Glm4vImageProcessor", False),
    "mistral3": (_mistral3, lambda m: m.model.vision_tower, None, False),
    "glmga": (_glmga, lambda m: m.model.visual, "GlmgaImageProcessor", False),
    "hyperclovax_vision_v2": (_hyperclovax, lambda m: m.model.vision_model, "Qwen2VLImageProcessor", True),
    "cosmos3_omni": (_cosmos3_omni, lambda m: m.model.visual, "Qwen2VLImageProcessor", False),
    "mistral_large4": (_mistral_large4, lambda m: m.model.vision_tower, None, False),
    "ovis2_5": (_ovis2_5, lambda m: m.model.vision_tower, "Ovis2_5ImageProcessor", True),
}
# Relatives with the same forward, as live tower objects built from their vision config: (modeling module, class,
# image processor class, whether it moves its tokens into windows)
RELATIVES = [
    ("qwen2_5_omni", "Qwen2_5OmniVisionEncoder", "Qwen2VLImageProcessor", True),
    ("qwen3_5", "Qwen3_5VisionModel", "Qwen2VLImageProcessor", False),
    ("qwen3_omni_moe", "Qwen3OmniMoeVisionEncoder", "Qwen2VLImageProcessor", False),
    ("exaone4_5", "Exaone4_5_VisionModel", "Qwen2VLImageProcessor", True),
    ("glm_ocr", "GlmOcrVisionModel", "Glm4vImageProcessor", False),
    ("glm5_next", "Glm5NextVisionModel", "Glm5NextImageProcessor", False),
    ("cohere_compass", "CohereCompassVisionModel", "CohereCompassImageProcessor", False),
]


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return {}


def _model(name: str, built: dict[str, Any]) -> Any:
    return built_once(built, name, MODELS[name][0])


def _saved(name: str, built: dict[str, Any], folder: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _model(name, built).save_pretrained(folder)
    return folder


def _load(what: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(what, image_size=SIZE)


_RECORDED: list[tuple[Any, torch.Tensor]] = []


def _recorded_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """transformers' own eager attention of the module's modeling file, its weights kept."""
    out, weights = sys.modules[type(module).__module__].eager_attention_forward(
        module, query, key, value, attention_mask, **kwargs)
    _RECORDED.append((module, weights.detach().float().clone()))
    return out, weights


transformers.AttentionInterface.register("recorded_eager", _recorded_attention)


def _layers() -> list[torch.Tensor]:
    """The recorded weights as layers: consecutive calls of one attention module (its windows) on the diagonal."""
    layers: list[list[torch.Tensor]] = []
    last = None
    for module, w in _RECORDED:
        if module is not last:
            layers.append([])
            last = module
        layers[-1].append(w[0])
    out = []
    for parts in layers:
        total = sum(p.shape[-1] for p in parts)
        full = torch.zeros(parts[0].shape[0], total, total)
        start = 0
        for p in parts:
            full[:, start:start + p.shape[-1], start:start + p.shape[-1]] = p
            start += p.shape[-1]
        out.append(full)
    return out


def _reference(tower: Any, x: torch.Tensor, processor: str | None, moves: bool) -> tuple[list[np.ndarray], np.ndarray]:
    """transformers' per-layer (H, T, T) maps on the image's grid (row by row), and its tokens' mean."""
    rows, cols = SIZE[0] // 4, SIZE[1] // 4
    tower.config._attn_implementation = "recorded_eager"
    _RECORDED.clear()
    if processor is None:          # Pixtral: the image as it is, its patches in raster order
        with torch.no_grad():
            out = tower(pixel_values=x, image_sizes=[SIZE])
        order = torch.arange(rows * cols)
    else:
        cfg = tower.config
        proc = getattr(transformers, processor)()
        args = (cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size)
        patches, gh, gw = proc.patchify(x, *args)
        # where the processor puts each patch: an image whose first two channels are the patch's row and column
        coords = torch.zeros(1, 3, *SIZE)
        coords[0, 0] = torch.arange(SIZE[0]).div(4, rounding_mode="floor")[:, None].float()
        coords[0, 1] = torch.arange(SIZE[1]).div(4, rounding_mode="floor")[None, :].float()
        where, _, _ = proc.patchify(coords, *args)
        per = cfg.temporal_patch_size * cfg.patch_size ** 2
        cell = (where[0, :, 0] * cols + where[0, :, per]).long()      # sequence position -> raster cell
        seen: dict[str, torch.Tensor] = {}
        embed = getattr(tower, "patch_embed", None) or tower.embeddings     # (Ovis 2.5: embeddings, layers)
        first = (getattr(tower, "blocks", None) or tower.layers)[0]
        hooks = [embed.register_forward_hook(lambda _m, _a, o: seen.setdefault("embed", o)),
                 first.register_forward_pre_hook(lambda _m, a: seen.setdefault("block", a[0]))]
        argument = "pixel_values" if processor == "Ovis2_5ImageProcessor" else "hidden_states"
        try:
            with torch.no_grad():
                out = tower(**{argument: patches[0]}, grid_thw=torch.tensor([[1, gh, gw]]))
        finally:
            for h in hooks:
                h.remove()
        moved = torch.arange(rows * cols)
        if moves:                  # the tower reorders its tokens: each block input row is which embedded patch
            moved = torch.cdist(seen["block"], seen["embed"]).argmin(dim=1)
            assert torch.equal(moved.sort().values, torch.arange(rows * cols))
        order = torch.empty(rows * cols, dtype=torch.long)
        order[cell[moved]] = torch.arange(rows * cols)                # raster cell -> position in the blocks
    tower.config._attn_implementation = "eager"
    maps = [m[:, order][:, :, order].numpy() for m in _layers()]
    hidden = out.last_hidden_state
    return maps, (hidden[0] if hidden.dim() == 3 else hidden).mean(dim=0).numpy()


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("route", ["file", "live"])
def test_parity(tmp_path: Path, built: dict[str, Any], name: str, route: str) -> None:
    model = _model(name, built)
    vm = _load(_saved(name, built, tmp_path) if route == "file" else model)
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    ours, out = vm.forward_captured(x)
    theirs, pooled = _reference(MODELS[name][1](model), x, *MODELS[name][2:])
    assert ours.shape[1] == len(theirs) and vm.spec.pos_grid == (SIZE[0] // 4, SIZE[1] // 4)
    for i, ref in enumerate(theirs):
        np.testing.assert_allclose(ours[0, i], ref, atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(out[0], pooled, atol=ATOL)
    path = vm.spec.source_of("path")
    assert "by its code" in path and "transformers" in path and vm.spec.num_prefix == 0


def test_windowed_layers_said_and_block_sparse(tmp_path: Path, built: dict[str, Any]) -> None:
    """Qwen2.5-VL's windowed blocks are said, and their maps are zero between windows (block-sparse), its
    full-attention blocks' are not."""
    vm = _load(_saved("qwen2_5_vl", built, tmp_path))
    path = vm.spec.source_of("path")
    assert "blocks 0, 2 attend within windows of 24 px" in path
    assert [m for _, m in vm.layers] == ["softmax in 4 windows", "softmax", "softmax in 4 windows", "softmax"]
    maps, _ = vm.forward_captured(torch.randn(1, 3, *SIZE))
    zeros = [(maps[0, i] == 0).mean() for i in range(4)]
    assert zeros[0] > 0.5 and zeros[2] > 0.5 and zeros[1] == 0 and zeros[3] == 0


def test_ovis_windowed_layers_said(built: dict[str, Any]) -> None:
    """Ovis 2.5 names its windowed blocks by `layer_types`: they are said, and shown in windows."""
    vm = _load(MODELS["ovis2_5"][1](_model("ovis2_5", built)))
    assert "blocks 0, 2 attend within windows of 24 px (config.layer_types" in vm.spec.source_of("path")
    assert [m.endswith(" in 4 windows") for _, m in vm.layers] == [True, False, True]


def test_result_is_a_normal_result(built: dict[str, Any]) -> None:
    """A packed tower's run is an ordinary result on the patch grid, with no class token."""
    vm = _load(MODELS["qwen2_vl"][1](_model("qwen2_vl", built)))
    result = vm.run(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8))
    assert result.attentions.shape == (2, 4, 96, 96) and not vm.spec.cls_token
    assert vm.spec.preprocess.mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    assert "Qwen2VLImageProcessor" in vm.spec.source_of("preprocess")


def test_preprocessor_config_read(tmp_path: Path, built: dict[str, Any]) -> None:
    """A folder's preprocessor_config.json states the normalisation (Qwen3-VL's is 0.5, not the class default)."""
    import json

    folder = _saved("qwen3_vl", built, tmp_path)
    (folder / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    vm = _load(folder)
    assert vm.spec.preprocess.mean == (0.5, 0.5, 0.5)
    assert "preprocessor_config.json" in vm.spec.source_of("preprocess")


@pytest.mark.parametrize("name", ["qwen2_5_vl", "mistral3", "hyperclovax_vision_v2", "cosmos3_omni", "mistral_large4",
                                  "ovis2_5"])
def test_verify_gives_a_verdict(tmp_path: Path, built: dict[str, Any], name: str) -> None:
    vm = _load(_saved(name, built, tmp_path))
    check = vitviz.verify(vm)
    assert check.verified, check.summary()
    assert check.max_attention <= ATOL and "transformers" in check.against


@pytest.mark.parametrize("name,root", [("cosmos3_omni", ""), ("mistral_large4", "vision_encoder.")])
def test_original_layout_reads_only_the_tower(tmp_path: Path, built: dict[str, Any], name: str, root: str) -> None:
    """Cosmos 3 Omni and Mistral Large 4 are saved in their original checkpoints' layouts (the tower at the file's
    root, or under `vision_encoder.` in Mistral's names): only the tower's tensors are read, exactly as many as the
    tower has, and transformers' own conversion of the whole model gives them the tower's names (the maps' parity is
    `test_parity`)."""
    from safetensors import safe_open

    from vitviz.core.reading.checkpoint import read_checkpoint

    folder = _saved(name, built, tmp_path)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        saved = list(f.keys())
    tower = MODELS[name][1](_model(name, built))
    assert not any(k.startswith(("model.", "vision_tower.", "visual.")) for k in saved)    # not transformers' names
    raw = read_checkpoint(str(folder))
    assert len(raw.tensors) == len(tower.state_dict()) < len(saved) and raw.tower.prefix == root
    assert "attention.wq.weight" in " ".join(raw.tensors) or name != "mistral_large4"


def test_size_must_be_whole_merge_blocks(built: dict[str, Any]) -> None:
    """A size the model's forward refuses (not whole 8 px merge blocks) is refused saying so."""
    with pytest.raises(vitviz.VitvizError, match="whole multiples of 8 px"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            vitviz.load(MODELS["qwen2_vl"][1](_model("qwen2_vl", built)), image_size=36)


def test_verify_sees_a_wrong_token_order(tmp_path: Path, built: dict[str, Any],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """verify places the original's tokens by transformers' own processor and tower, not by vitviz's order: maps
    shown in the processor's order without Qwen2.5-VL's windows taken back differ."""
    from vitviz.core.running.live.packing import PackedTower

    vm = _load(_saved("qwen2_5_vl", built, tmp_path))
    monkeypatch.setattr(PackedTower, "_window_position", lambda self, rows, cols: None)
    check = vitviz.verify(vm)
    assert check.verdict == "differs" and check.first_differing_layer == 0


@pytest.mark.parametrize("module,name,processor,moves", RELATIVES, ids=[r[0] for r in RELATIVES])
def test_relatives_live(module: str, name: str, processor: str, moves: bool) -> None:
    """The towers with the Qwen-VL forward that transformers 5.25 ships, handed over as live objects."""
    import importlib

    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    given = dict(PACKED, depth=2, num_hidden_layers=2, hidden_size=32, embed_dim=32, intermediate_size=64,
                 num_attention_heads=4, num_key_value_heads=4, out_hidden_size=32, window_size=24,
                 fullatt_block_indexes=[1],
                 deepstack_visual_indexes=[], num_position_embeddings=64, image_size=32, head_dim=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defaults = cls.config_class()
        config = cls.config_class(**{k: v for k, v in given.items() if hasattr(defaults, k)})
        torch.manual_seed(0)
        tower = cls(config).eval()
    vm = _load(tower)
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    ours, out = vm.forward_captured(x)
    theirs, pooled = _reference(tower, x, processor, moves)
    assert ours.shape[1] == len(theirs) == 2
    for i, ref in enumerate(theirs):
        np.testing.assert_allclose(ours[0, i], ref, atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(out[0], pooled, atol=ATOL)
    assert ("windows" in vm.layers[0][1]) == moves


# composite model_type: (modeling module, tower class) -- folders written as the whole model saves its tower
# (`model.visual.`), beside a language-model tensor, with the composite's config (its text side at its defaults)
BY_FILE = {
    "qwen3_5": ("qwen3_5", "Qwen3_5VisionModel"), "qwen3_vl_moe": ("qwen3_vl_moe", "Qwen3VLMoeVisionModel"),
    "glm4v_moe": ("glm4v_moe", "Glm4vMoeVisionModel"), "glm46v": ("glm4v", "Glm4vVisionModel"),
    "glm_ocr": ("glm_ocr", "GlmOcrVisionModel"), "exaone4_5": ("exaone4_5", "Exaone4_5_VisionModel"),
    "glm5_next": ("glm5_next", "Glm5NextVisionModel"), "qwen3_5_moe": ("qwen3_5_moe", "Qwen3_5MoeVisionModel"),
}


@pytest.mark.parametrize("model_type", list(BY_FILE))
def test_relatives_by_file(tmp_path: Path, model_type: str) -> None:
    """The other composites whose tower runs by its code open by file as the tower transformers builds from their
    config.json; the maps equal the live object's (itself exact against transformers above) and verify's verdict
    is given."""
    import importlib
    import json

    from safetensors.torch import save_file
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    module, name = BY_FILE[model_type]
    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    given = dict(PACKED, depth=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                 out_hidden_size=32, deepstack_visual_indexes=[], num_position_embeddings=64, image_size=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defaults = cls.config_class()
        vision = {k: v for k, v in given.items() if hasattr(defaults, k)}
        config = CONFIG_MAPPING[model_type](vision_config=vision)
        torch.manual_seed(0)
        tower = cls(config.vision_config).eval()
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    save_file({**{f"model.visual.{k}": v.contiguous() for k, v in tower.state_dict().items()},
               "model.language_model.embed_tokens.weight": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    vm, live = _load(tmp_path), _load(tower)
    assert "by its code" in vm.spec.source_of("path")
    x = torch.randn(1, 3, *SIZE, generator=torch.Generator().manual_seed(3))
    np.testing.assert_allclose(vm.forward_captured(x)[0], live.forward_captured(x)[0], atol=ATOL)
    check = vitviz.verify(vm)
    assert check.verdict in ("verified", "unverified") and (check.verified or "image processor" in check.reason)
