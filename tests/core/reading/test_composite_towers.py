"""Composite transformers models opened by file as their vision tower (vitviz.core.reading.towers): LLaVA, LLaVA-NeXT,
VipLLaVA, GIT and Kosmos-2 (CLIP), LLaVA-OneVision, PaliGemma and Gemma 3 (SigLIP), Idefics3 and SmolVLM (SigLIP
with bucketed positions), Depth Anything and DPT (a DINOv2 `backbone_config`), DPT's own ViT, ZoeDepth (a BEiT
backbone), BLIP, BLIP-2 and
InstructBLIP (their ViT), each built tiny with random weights and saved with `save_pretrained`, as `hf:ORG/NAME`
downloads it. Every layer's per-head attention is compared with the tower inside the whole transformers model
(eager `output_attentions`) at 1e-5, at its own size and another; `vitviz.verify` says verified. Only the tower's
tensors are read (a shard holding only the language model is never opened); the models vitviz does not convert
are refused by name, with the route that works.
"""
from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

import vitviz
from vitviz.core.reading.checkpoint import read_checkpoint
from vitviz.core.spec import GuessWarning
from vitviz.errors import CompositeModelError, UnknownLayoutError

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
              patch_size=8)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=300)


def _llava() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.LlavaConfig(vision_config=transformers.CLIPVisionConfig(**VISION),
                                   text_config=transformers.LlamaConfig(**TEXT), image_token_index=299)
    return transformers.LlavaForConditionalGeneration(cfg), lambda m: m.model.vision_tower


def _llava_next() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.LlavaNextConfig(vision_config=transformers.CLIPVisionConfig(**VISION),
                                       text_config=transformers.LlamaConfig(**TEXT), image_token_index=299,
                                       image_grid_pinpoints=[[32, 32]])
    return transformers.LlavaNextForConditionalGeneration(cfg), lambda m: m.model.vision_tower


def _llava_onevision() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.LlavaOnevisionConfig(vision_config=transformers.SiglipVisionConfig(**VISION).to_dict(),
                                            text_config=transformers.Qwen2Config(**TEXT).to_dict(),
                                            image_token_index=299, image_grid_pinpoints=[[32, 32]])
    return transformers.LlavaOnevisionForConditionalGeneration(cfg), lambda m: m.model.vision_tower


def _vipllava() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.VipLlavaConfig(vision_config=transformers.CLIPVisionConfig(**VISION),
                                      text_config=transformers.LlamaConfig(**TEXT), image_token_index=299,
                                      vision_feature_layers=[-2, -1])
    return transformers.VipLlavaForConditionalGeneration(cfg), lambda m: m.model.vision_tower


def _paligemma() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.PaliGemmaConfig(vision_config=transformers.SiglipVisionConfig(**VISION).to_dict(),
                                       text_config=transformers.GemmaConfig(**TEXT, head_dim=8).to_dict(),
                                       image_token_index=299)
    return transformers.PaliGemmaForConditionalGeneration(cfg), lambda m: m.model.vision_tower


def _gemma3() -> tuple[Any, Callable[[Any], Any]]:
    # Gemma 3's SigLIP tower has no MAP head (vision_use_head false, as released)
    cfg = transformers.Gemma3Config(vision_config=dict(**VISION, model_type="siglip_vision_model",
                                                       vision_use_head=False),
                                    text_config=dict(**TEXT, head_dim=8), mm_tokens_per_image=4, image_token_index=299)
    return transformers.Gemma3ForConditionalGeneration(cfg), lambda m: m.model.vision_tower


def _idefics3() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.Idefics3Config(vision_config=dict(VISION), text_config=dict(TEXT), scale_factor=2,
                                      image_token_id=299)
    return transformers.Idefics3ForConditionalGeneration(cfg), lambda m: m.model.vision_model


def _smolvlm() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.SmolVLMConfig(vision_config=dict(VISION), text_config=dict(TEXT), scale_factor=2,
                                     image_token_id=299)
    return transformers.SmolVLMForConditionalGeneration(cfg), lambda m: m.model.vision_model


def _dinov2_backbone() -> Any:
    return transformers.Dinov2Config(**VISION, out_features=["stage1", "stage2"], reshape_hidden_states=False)


def _depth_anything() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.DepthAnythingConfig(backbone_config=_dinov2_backbone(), neck_hidden_sizes=[8, 16],
                                           fusion_hidden_size=8, reassemble_hidden_size=32, head_hidden_size=8)
    return transformers.DepthAnythingForDepthEstimation(cfg), lambda m: m.backbone


def _dpt_dinov2() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.DPTConfig(backbone_config=_dinov2_backbone(), neck_hidden_sizes=[8, 16], fusion_hidden_size=8,
                                 hidden_size=32, reassemble_factors=[1, 1], head_in_index=-1)
    return transformers.DPTForDepthEstimation(cfg), lambda m: m.backbone


def _blip() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.BlipConfig(vision_config=dict(VISION), text_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=300,
        bos_token_id=1, pad_token_id=0, sep_token_id=2, eos_token_id=2))
    return transformers.BlipForConditionalGeneration(cfg), lambda m: m.vision_model


def _blip2() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.Blip2Config(
        vision_config=dict(VISION), num_query_tokens=4,
        qformer_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                            vocab_size=300, encoder_hidden_size=32),
        text_config=transformers.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=4,
                                           vocab_size=300, word_embed_proj_dim=32).to_dict())
    return transformers.Blip2ForConditionalGeneration(cfg), lambda m: m.vision_model


def _instructblip() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.InstructBlipConfig(
        vision_config=dict(VISION), num_query_tokens=4,
        qformer_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                            vocab_size=300, encoder_hidden_size=32),
        text_config=transformers.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=4,
                                           vocab_size=300, word_embed_proj_dim=32).to_dict())
    return transformers.InstructBlipForConditionalGeneration(cfg), lambda m: m.vision_model


def _git() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.GitConfig(vision_config=dict(VISION), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, vocab_size=300)
    return transformers.GitForCausalLM(cfg), lambda m: m.git.image_encoder


def _kosmos2() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.Kosmos2Config(vision_config=dict(VISION), latent_query_num=4, text_config=dict(
        embed_dim=32, ffn_dim=64, layers=1, attention_heads=4, vocab_size=300))
    return transformers.Kosmos2ForConditionalGeneration(cfg), lambda m: m.vision_model


def _zoedepth() -> tuple[Any, Callable[[Any], Any]]:
    backbone = transformers.BeitConfig(**VISION, out_features=["stage1", "stage2"], reshape_hidden_states=False,
                                       use_relative_position_bias=True, use_mask_token=False,
                                       layer_scale_init_value=0.1)
    cfg = transformers.ZoeDepthConfig(
        backbone_config=backbone, neck_hidden_sizes=[8, 16], fusion_hidden_size=8, reassemble_hidden_size=32,
        backbone_hidden_size=32, bottleneck_features=8, num_relative_features=8, bin_embedding_dim=8,
        bin_configurations=[{"n_bins": 4, "min_depth": 0.001, "max_depth": 10.0, "name": "nyu"}],
        num_attractors=[4, 2, 2, 2], patch_size=8, readout_type="project", reassemble_factors=[1, 1],
        head_in_index=-1)
    return transformers.ZoeDepthForDepthEstimation(cfg), lambda m: m.backbone


def _dpt_own() -> tuple[Any, Callable[[Any], Any]]:
    cfg = transformers.DPTConfig(**VISION, backbone_out_indices=[0, 1], neck_hidden_sizes=[8, 16],
                                 fusion_hidden_size=8, head_in_index=-1)
    return transformers.DPTForDepthEstimation(cfg), lambda m: m.dpt


# model_type: (build, family, what the identity says of the tower, pooling)
COMPOSITES = {
    "llava": (_llava, "hf-clip", "clip_vision_model", "token"),
    "llava_next": (_llava_next, "hf-clip", "clip_vision_model", "token"),
    "llava_onevision": (_llava_onevision, "hf-siglip", "siglip_vision_model", "map"),
    "vipllava": (_vipllava, "hf-clip", "clip_vision_model", "token"),
    "paligemma": (_paligemma, "hf-siglip", "siglip_vision_model", "map"),
    "gemma3": (_gemma3, "hf-siglip", "siglip_vision_model", "avg"),
    "idefics3": (_idefics3, "hf-siglip", "idefics3_vision", "avg"),
    "smolvlm": (_smolvlm, "hf-siglip", "smolvlm_vision", "avg"),
    "depth_anything": (_depth_anything, "hf-dinov2", "dinov2", "token"),
    "dpt": (_dpt_dinov2, "hf-dinov2", "dinov2", "token"),
    "dpt-own": (_dpt_own, "hf-dpt", "", "token"),
    "zoedepth": (_zoedepth, "hf-beit", "beit", "token"),
    "blip": (_blip, "hf-blip", "blip_vision_model", "token"),
    "blip-2": (_blip2, "hf-blip", "blip_2_vision_model", "token"),
    "instructblip": (_instructblip, "hf-blip", "instructblip_vision_model", "token"),
    "git": (_git, "hf-clip", "git_vision_model", "token"),
    "kosmos-2": (_kosmos2, "hf-clip", "kosmos_2_vision_model", "token"),
}


def _saved(tmp_path: Path, model_type: str, **save: Any) -> tuple[Any, Any, Path]:
    torch.manual_seed(0)
    build = COMPOSITES[model_type][0]
    model, tower_of = build()
    model.config._attn_implementation = "eager"
    model.set_attn_implementation("eager")
    model.eval().save_pretrained(tmp_path, **save)
    return model, tower_of(model), tmp_path


def _load(path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        return vitviz.load(path, device="cpu")


def _tower_attention(tower: Any, x: torch.Tensor, native: bool) -> list[torch.Tensor]:
    """The tower's own per-layer attention (1, H, T, T), as the whole model runs it (eager): its
    `output_attentions`, or where a tower drops them from its output (GIT's), each attention module's returned
    weights."""
    kw: dict[str, Any] = {}
    if not native and "interpolate_pos_encoding" in inspect.signature(tower.forward).parameters:
        kw["interpolate_pos_encoding"] = True
    returned: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _a, out: returned.append(out[1])) for m in tower.modules()
             if type(m).__name__.endswith("VisionAttention")]
    try:
        with torch.no_grad():
            out = tower(pixel_values=x, output_attentions=True, **kw)
    finally:
        for hook in hooks:
            hook.remove()
    return list(out.attentions or returned)


@pytest.mark.parametrize("model_type", sorted(COMPOSITES))
def test_tower_by_file(tmp_path: Path, model_type: str) -> None:
    _, family, tower_type, pooling = COMPOSITES[model_type]
    _, tower, folder = _saved(tmp_path, model_type)
    vm = _load(folder)
    s = vm.spec
    assert (s.family, s.num_heads, s.depth, s.pooling) == (family, 4, 2, pooling)
    what = f"its vision tower, a {tower_type!r}" if tower_type else "its own ViT encoder"
    named = json.loads((folder / "config.json").read_text())["model_type"]
    assert s.source_of("identity") == f"named: transformers model_type {named!r} ({what}) (config.json)"
    for size in [(32, 32), (48, 40)]:
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
        theirs = _tower_attention(tower, x, size == (32, 32))
        ours = vm.run(x).attentions
        assert ours.shape[0] == len(theirs) == 2
        for i, ref in enumerate(theirs):
            np.testing.assert_allclose(ours[i], ref[0].numpy(), atol=ATOL, err_msg=f"{model_type} layer {i} {size}")
    check = vitviz.verify(vm)
    assert check.verdict == "verified", check.reason
    assert check.original.startswith("transformers.") and "the vision tower of" in check.original


def test_only_the_tower_is_read(tmp_path: Path) -> None:
    """Sharded: the shards holding only the language model are never opened (here: replaced by garbage), and the
    tensors read are the tower's alone; the processor's preprocessing is the tower's."""
    model, tower, folder = _saved(tmp_path, "llava", max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tower_shards = {f for k, f in index.items() if k.startswith(("vision_tower.", "model.vision_tower."))}
    other = sorted(set(index.values()) - tower_shards)
    assert other, "expected shards without any tower tensor"
    for name in other:
        (folder / name).write_bytes(b"not a safetensors file")
    transformers.CLIPImageProcessor(size={"shortest_edge": 40}, crop_size={"height": 32, "width": 32}).save_pretrained(
        folder)
    raw = read_checkpoint(folder)
    assert raw.tower is not None and raw.tower.model_type == "llava"
    assert all(k.startswith(("embeddings.", "encoder.", "pre_layrnorm.", "post_layernorm.")) for k in raw.tensors)
    vm = _load(folder)
    assert vm.spec.preprocess.resize == 40 and vm.spec.source_of("preprocess").startswith(
        "metadata: preprocessor_config.json")
    assert read_checkpoint(folder / "model.safetensors.index.json").tower is not None   # the index named directly
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    for i, ref in enumerate(_tower_attention(tower, x, True)):
        np.testing.assert_allclose(vm.run(x).attentions[i], ref[0].numpy(), atol=ATOL)


def _config_folder(tmp_path: Path, config: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"model.language_model.embed_tokens.weight": torch.zeros(4, 4),
               "model.visual.blocks.0.attn.qkv.weight": torch.zeros(12, 4)}, str(tmp_path / "model.safetensors"))
    return tmp_path


@pytest.mark.parametrize("config,named", [
    ({"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"]}, "'qwen2_vl'"),
    ({"model_type": "mllama"}, "'mllama'"),
    ({"model_type": "florence2"}, "'florence2'"),
    ({"model_type": "segformer", "num_attention_heads": [1, 2, 5, 8]}, "'segformer'"),   # not "metadata" refused
    ({"model_type": "llava", "vision_config": {"model_type": "some_vision_model"}},
     "'llava' whose vision tower is a 'some_vision_model'"),   # (a 'pixtral' tower runs by its code)
    ({"model_type": "dpt", "is_hybrid": True}, "'dpt' with is_hybrid"),
])
def test_refused_by_name_with_a_route(tmp_path: Path, config: dict[str, Any], named: str) -> None:
    with pytest.raises(CompositeModelError) as e:
        vitviz.load(_config_folder(tmp_path, config))
    text = str(e.value)
    assert named in text and "vitviz.load(module)" in text and "--code FILE.py:FACTORY" in text


def test_tower_missing_where_the_config_says(tmp_path: Path) -> None:
    folder = _config_folder(tmp_path, {"model_type": "llava", "vision_config": {"model_type": "clip_vision_model"}})
    with pytest.raises(CompositeModelError, match=r"'llava'.*no tensor of the weights is under 'model.vision_tower.'"):
        vitviz.load(folder)


@pytest.mark.parametrize("config,named", [
    ({"model_type": "convnext", "architectures": ["ConvNextForImageClassification"]},
     "transformers model_type 'convnext', ConvNextForImageClassification"),
    ({"architecture": "resnet50"}, "timm architecture 'resnet50'"),
])
def test_unknown_layout_names_the_config(tmp_path: Path, config: dict[str, Any], named: str) -> None:
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"stem.conv.weight": torch.zeros(8, 3, 4, 4), "stages.0.conv.weight": torch.zeros(8, 8, 3, 3)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(UnknownLayoutError) as e:
        vitviz.load(tmp_path)
    assert named in str(e.value) and "--code FILE.py:FACTORY" in str(e.value)


def test_unlisted_composite_is_not_guessed(tmp_path: Path) -> None:
    """A composite model vitviz has no entry for (its config states vision_config and text_config) is refused by
    name before its layout is guessed, even when its tensors hold a ViT-like tower."""
    _, _, folder = _saved(tmp_path, "llava")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "some_new_vlm"}))
    with pytest.raises(CompositeModelError, match=r"model_type 'some_new_vlm'.*composite model.*--code FILE.py"):
        vitviz.load(folder)


def test_hub_fetches_only_the_tower_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hf:ORG/NAME` of a sharded LLaVA downloads config.json, the index and the tower's shards: never a shard
    holding only the language model."""
    from _fakehub import FakeHub

    from vitviz.catalog.named import resolve_model_arg

    _, tower, saved = _saved(tmp_path / "saved", "llava", max_shard_size="20KB")
    index = json.loads((saved / "model.safetensors.index.json").read_text())["weight_map"]
    lm_only = set(index.values()) - {f for k, f in index.items() if "vision_tower." in k}
    assert lm_only
    repo = {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()}
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with FakeHub({"acme/tiny-llava": repo}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        folder = Path(resolve_model_arg("hf:acme/tiny-llava"))
        fetched = {name for name in index.values() if any(g.endswith(name) for g in server.gets)}
    assert fetched and not fetched & lm_only
    vm = _load(folder)
    assert vm.spec.source_of("identity").startswith("named: transformers model_type 'llava'")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    for i, ref in enumerate(_tower_attention(tower, x, True)):
        np.testing.assert_allclose(vm.run(x).attentions[i], ref[0].numpy(), atol=ATOL)


def test_depth_tower_runs_at_its_own_size(tmp_path: Path) -> None:
    """Depth Anything's DINOv2 runs at its table's size (518 px as released; 252 here), not at 224, the size
    DINOv2 classifiers are evaluated at."""
    backbone = transformers.Dinov2Config(**{**VISION, "image_size": 252, "patch_size": 14},
                                         out_features=["stage1", "stage2"], reshape_hidden_states=False)
    cfg = transformers.DepthAnythingConfig(backbone_config=backbone, neck_hidden_sizes=[8, 16], fusion_hidden_size=8,
                                           reassemble_hidden_size=32, head_hidden_size=8, patch_size=14)
    transformers.DepthAnythingForDepthEstimation(cfg).save_pretrained(tmp_path)
    spec = _load(tmp_path).spec
    assert spec.image_size == (252, 252) and "224" not in spec.source_of("image_size")


def test_model_listing_names_the_tower(tmp_path: Path) -> None:
    """Models on this computer: a saved LLaVA is listed as its CLIP tower, a refused model as not a ViT."""
    from vitviz.catalog.scan import _family_from_config

    _, _, folder = _saved(tmp_path, "llava")
    assert _family_from_config(json.loads((folder / "config.json").read_text())) == \
        ("hf-clip", "transformers llava, its clip_vision_model tower")
    assert _family_from_config({"model_type": "qwen2_vl", "vision_config": {}})[0] is None


def test_tower_from_a_pytorch_bin(tmp_path: Path) -> None:
    """A whole model saved as pytorch_model.bin (torch.save of its state dict, as older repositories ship it):
    memory-mapped, the tower's tensors alone kept."""
    model, tower, folder = _saved(tmp_path, "paligemma")
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    raw = read_checkpoint(folder)
    assert raw.tower is not None and not any("language_model" in k for k in raw.tensors)
    vm = _load(folder)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    for i, ref in enumerate(_tower_attention(tower, x, True)):
        np.testing.assert_allclose(vm.run(x).attentions[i], ref[0].numpy(), atol=ATOL)


def test_transformers_4_layout(tmp_path: Path) -> None:
    """Files written by transformers 4 (what most hub repositories hold) keep the tower's own `vision_model.`
    level: `vision_tower.vision_model.embeddings...`; they open and verify the same."""
    from safetensors.torch import load_file, save_file

    _, tower, folder = _saved(tmp_path, "paligemma")
    sd = load_file(str(folder / "model.safetensors"))
    old = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
           for k, v in sd.items()}
    assert any(k.startswith("vision_tower.vision_model.encoder.") for k in old)
    save_file(old, str(folder / "model.safetensors"), metadata={"format": "pt"})
    vm = _load(folder)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    for i, ref in enumerate(_tower_attention(tower, x, True)):
        np.testing.assert_allclose(vm.run(x).attentions[i], ref[0].numpy(), atol=ATOL)
    assert vitviz.verify(vm).verdict == "verified"


def test_model_object_opens_its_tower(tmp_path: Path) -> None:
    """`vitviz.load(model)` on a composite transformers object converts its vision tower (what the refusals'
    route suggests), and its provenance says so."""
    model, tower, _ = _saved(tmp_path, "llava")
    vm = vitviz.load(model, device="cpu")
    assert vm.spec.family == "hf-clip"
    assert "the vision tower model.vision_tower of the LlavaForConditionalGeneration given" in vm.spec.source_of("path")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    for i, ref in enumerate(_tower_attention(tower, x, True)):
        np.testing.assert_allclose(vm.run(x).attentions[i], ref[0].numpy(), atol=ATOL)


@pytest.mark.parametrize("cls", ["BlipVisionModel", "Blip2VisionModel"])
def test_blip_vision_model_alone(tmp_path: Path, cls: str) -> None:
    """The BLIP family on its own: a saved BlipVisionModel / Blip2VisionModel folder, its pooled output (the class
    token through post_layernorm twice) and every layer's attention."""
    config_cls = getattr(transformers, cls.replace("Model", "Config"))
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config_cls(**VISION, attn_implementation="eager")).eval()
    model.save_pretrained(tmp_path)
    vm = _load(tmp_path)
    assert vm.spec.family == "hf-blip" and vm.spec.source_of("identity").startswith("named: transformers model_type")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = model(pixel_values=x, output_attentions=True)
    result = vm.run(x)
    np.testing.assert_allclose(result.features, out.pooler_output[0].numpy(), atol=ATOL)
    for i, ref in enumerate(out.attentions):
        np.testing.assert_allclose(result.attentions[i], ref[0].numpy(), atol=ATOL)


def test_a_nested_sub_config_names_the_tower() -> None:
    """An Omni model keeps its vision tower's config in its thinker's (`thinker_config.vision_config`): `identify`
    reads it there and looks for the tower's tensors where the whole model saves them (`thinker.visual.`); without
    that sub-config the folder is not taken for one (nothing to build the tower from)."""
    from vitviz.core.reading.towers import identify, sub_config

    vision = {"model_type": "qwen2_5_omni_vision_encoder", "depth": 2}
    whole = {"model_type": "qwen2_5_omni", "thinker_config": {"model_type": "qwen2_5_omni_thinker",
                                                              "vision_config": vision}}
    assert sub_config(whole, "thinker_config.vision_config") is vision and sub_config(whole, "") is whole
    assert sub_config(whole, "talker_config.vision_config") is None
    tower = identify(whole, "config.json")
    assert tower is not None and tower.config is vision and tower.by_code[1] == "Qwen2_5OmniVisionEncoder"
    assert tower.wants("thinker.visual.blocks.0.attn.q.weight") and not tower.wants("thinker.model.layers.0.x")
    assert not tower.wants("thinker.audio_tower.conv1.weight") and not tower.wants("talker.model.x")
    assert identify({"model_type": "qwen2_5_omni", "thinker_config": {}}, "config.json") is None
