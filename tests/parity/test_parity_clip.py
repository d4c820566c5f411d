"""Parity for CLIP vision towers: timm `vit_*_clip_*` (norm_pre, QuickGELU), OpenAI / open_clip files (open_clip
3.x, `nn.MultiheadAttention`, the whole CLIP file with its text tower), transformers CLIPVisionModel / CLIPModel.

Each original is random and perturbed, saved the way its users save it, loaded by vitviz; the image embedding
(after `proj`) and every layer's per-head attention are compared at 1e-5, also at a non-default resolution
(resampled with the family's own recipe).
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from parity_towers import mha_reference, timm_pool_reference
from vitviz.core.spec import GuessWarning

timm = pytest.importorskip("timm")
open_clip = pytest.importorskip("open_clip")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5
TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0)


def x_for(h: int = 32, w: int = 32) -> torch.Tensor:
    return torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(1))


def check(result, out: torch.Tensor, maps: list[torch.Tensor]) -> None:
    assert result.logits.size == 0 and result.features is not None  # an embedding, not class scores
    np.testing.assert_allclose(result.features, out[0].numpy(), atol=ATOL)
    assert result.attentions.shape[0] == len(maps)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(result.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")


def quiet_load(path, **kw):  # a 32 px model: preprocessing guesses (the inputs here are tensors)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=GuessWarning, message=".*preprocess")
        return vitviz.load(path, device="cpu", **kw)


# ---------------------------------------------------------------------------------------------- timm CLIP
@pytest.mark.parametrize("arch", ["vit_base_patch16_clip_224", "vit_base_patch16_clip_quickgelu_224"])
def test_timm_clip_hub_folder(tmp_path, arch: str) -> None:
    model = timm.create_model(arch, pretrained=False, num_classes=16, dynamic_img_size=True, **TINY)
    perturb(model)
    with torch.no_grad():
        model.head.bias.zero_()  # timm's CLIP towers: proj converted to a head with a zero bias
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=TINY, safe_serialization=True)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert s.family == "timm-clip" and s.norm_pre and not s.patch_bias and s.eps == 1e-5
    assert s.mlp_kind == ("quick_gelu" if "quickgelu" in arch else "gelu") and s.embed_out == 16
    assert s.num_classes == 0 and s.num_heads == 4
    for size in [(32, 32), (40, 56)]:
        x = x_for(*size)
        out, maps, _ = timm_pool_reference(model, x)
        check(vm.run(x), out, maps)


def test_timm_clip_state_dict_guesses_activation_loudly(tmp_path) -> None:
    model = perturb(timm.create_model("vit_base_patch16_clip_224", pretrained=False, num_classes=0, **TINY))
    torch.save(model.state_dict(), tmp_path / "clip_tower.pth")
    with pytest.warns(GuessWarning, match="mlp_kind = gelu is a guess"):
        vm = vitviz.load(tmp_path / "clip_tower.pth", device="cpu", heads=4)
    assert vm.spec.family == "timm-clip" and vm.spec.source_of("mlp_kind").startswith("guess")
    out, maps, _ = timm_pool_reference(model, x_for())
    check(vm.run(x_for()), out, maps)


# ------------------------------------------------------------------------------------------------- open_clip
def open_clip_model(image_size: int = 32, quick_gelu: bool = True, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = open_clip.CLIP(embed_dim=16, quick_gelu=quick_gelu,
                           vision_cfg=dict(layers=2, width=64, head_width=16, patch_size=8, image_size=image_size,
                                           mlp_ratio=2.0, ls_init_value=0.5),
                           text_cfg=dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1))
    return perturb(model.eval(), seed=seed)


def open_clip_config(quick_gelu: bool) -> dict:
    return {"model_cfg": {"embed_dim": 16, "quick_gelu": quick_gelu,
                          "vision_cfg": dict(layers=2, width=64, head_width=16, patch_size=8, image_size=32,
                                             mlp_ratio=2.0, ls_init_value=0.5),
                          "text_cfg": dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)},
            "preprocess_cfg": {"mean": [0.1, 0.2, 0.3], "std": [0.3, 0.3, 0.3]}}


@pytest.mark.parametrize("quick_gelu", [True, False])
def test_open_clip_hub_folder_with_text_tower(tmp_path, quick_gelu: bool) -> None:
    model = open_clip_model(quick_gelu=quick_gelu)
    torch.save(model.state_dict(), tmp_path / "open_clip_pytorch_model.bin")  # the whole CLIP, text tower too
    (tmp_path / "open_clip_config.json").write_text(json.dumps(open_clip_config(quick_gelu)))
    with pytest.warns(UserWarning, match="ignored the text tower"):
        vm = quiet_load(tmp_path / "open_clip_pytorch_model.bin")
    s = vm.spec
    assert s.family == "clip" and s.num_heads == 4 and s.source_of("num_heads").startswith("metadata")
    assert s.mlp_kind == ("quick_gelu" if quick_gelu else "gelu") and s.layer_scale and s.embed_out == 16
    assert s.preprocess.mean == (0.1, 0.2, 0.3)
    text_keys = [k for k in model.state_dict() if not k.startswith("visual.")]
    assert sorted(vm.dropped) == sorted(text_keys) and "token_embedding.weight" in vm.dropped
    out, maps = mha_reference(model.visual, model.encode_image, x_for())
    check(vm.run(x_for()), out, maps)


def test_clip_file_with_text_tower_opens_the_vision_tower_and_says_so(tmp_path) -> None:
    """The acceptance test: an OpenAI-style file (no config) with text-tower keys opens its vision tower, lists the
    text keys as dropped, says so in a warning, and guesses QuickGELU loudly."""
    model = open_clip_model()
    torch.save(model.state_dict(), tmp_path / "ViT-B-16.pt")
    with pytest.warns(UserWarning) as record:
        vm = vitviz.load(tmp_path / "ViT-B-16.pt", device="cpu", heads=4)
    text = [str(r.message) for r in record]
    assert any("vision tower" in t and "ignored the text tower" in t and "token_embedding" in t for t in text)
    assert any(issubclass(r.category, GuessWarning) and "mlp_kind = quick_gelu" in str(r.message) for r in record)
    assert "ln_final.weight" in vm.dropped and "logit_scale" in vm.dropped
    assert not any(k.startswith("visual.") for k in vm.dropped)
    out, maps = mha_reference(model.visual, model.encode_image, x_for())
    check(vm.run(x_for()), out, maps)


def test_open_clip_at_another_resolution(tmp_path) -> None:
    """open_clip runs another size by resizing the table when it loads (resize_pos_embed: bicubic, antialias)."""
    from open_clip.model import resize_pos_embed

    model = open_clip_model()
    sd = model.state_dict()
    torch.save(sd, tmp_path / "open_clip_pytorch_model.bin")
    (tmp_path / "open_clip_config.json").write_text(json.dumps(open_clip_config(True)))
    vm = quiet_load(tmp_path / "open_clip_pytorch_model.bin")
    big = open_clip_model(image_size=48, seed=5)
    sd = dict(sd)
    resize_pos_embed(sd, big)
    big.load_state_dict(sd)
    out, maps = mha_reference(big.visual, big.encode_image, x_for(48, 48))
    r = vm.run(x_for(48, 48))
    assert r.spec.grid == (6, 6)
    check(r, out, maps)


# ------------------------------------------------------------------------------------------------ transformers
@pytest.mark.parametrize("kind", ["vision", "clip"])
def test_hf_clip_folders(tmp_path, kind: str) -> None:
    from transformers import CLIPConfig, CLIPModel, CLIPVisionConfig, CLIPVisionModel

    v = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
             patch_size=8)
    if kind == "vision":
        model = CLIPVisionModel(CLIPVisionConfig(**v, attn_implementation="eager"))
    else:
        model = CLIPModel(CLIPConfig(vision_config=v, text_config=dict(hidden_size=32, intermediate_size=64,
                                                                        num_hidden_layers=1, num_attention_heads=2,
                                                                        vocab_size=64),
                                     projection_dim=16, attn_implementation="eager"))
    perturb(model)
    model.save_pretrained(tmp_path)
    if kind == "clip":
        with pytest.warns(UserWarning, match="ignored the text tower"):
            vm = quiet_load(tmp_path)
    else:
        vm = quiet_load(tmp_path)
    s = vm.spec
    assert s.family == "hf-clip" and s.norm_pre and s.mlp_kind == "quick_gelu" and s.eps == 1e-5
    assert s.embed_out == (16 if kind == "clip" else 0) and s.num_heads == 4
    vision = model if kind == "vision" else model.vision_model
    for size in [(32, 32), (48, 40)]:
        x = x_for(*size)
        kw = {"interpolate_pos_encoding": True} if size != (32, 32) else {}
        with torch.no_grad():
            o = vision(pixel_values=x, output_attentions=True, **kw)
            out = o.pooler_output if kind == "vision" else model.visual_projection(o.pooler_output)
        check(vm.run(x), out, list(o.attentions))
