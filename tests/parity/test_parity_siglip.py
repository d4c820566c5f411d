"""Parity for SigLIP / SigLIP 2 towers: timm `vit_*_siglip_*` (MAP head `attn_pool`), transformers
SiglipVisionModel / SiglipModel (MAP head = `nn.MultiheadAttention`) and Siglip2VisionModel (NaFlex: a Linear
patch embedding over (p1, p2, c) patches, a position table resized bilinearly with antialias).

Besides features and every block's attention, the MAP head's per-head attention over the patches -- the "CLS
attention" of a model without a class token -- is compared with the original's softmax, at 1e-5, at two sizes.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from parity_towers import mha_weights, timm_pool_reference
from vitviz.core.spec import GuessWarning

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5
TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0)


def x_for(h: int = 32, w: int = 32) -> torch.Tensor:
    return torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(1))


def quiet_load(path, **kw):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=GuessWarning, message=".*preprocess")
        return vitviz.load(path, device="cpu", **kw)


def check(result, out: torch.Tensor, maps: list[torch.Tensor], pool: torch.Tensor) -> None:
    """pool: the original MAP head's softmax (1, H, N)."""
    np.testing.assert_allclose(result.features, out[0].numpy(), atol=ATOL)
    assert result.attentions.shape[0] == len(maps)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(result.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    assert result.pool_attention is not None and result.pool_attention.shape == (pool.shape[1], result.spec.num_tokens)
    np.testing.assert_allclose(result.pool_attention, pool[0].numpy(), atol=ATOL)
    np.testing.assert_allclose(result.pool_map("mean"), pool[0].mean(0).reshape(result.grid).numpy(), atol=ATOL)


@pytest.mark.parametrize("arch,save", [("vit_base_patch16_siglip_224", "hub"), ("vit_so400m_patch16_siglip_256", "hub"),
                                       ("vit_so400m_patch16_siglip_256", "safetensors")])
def test_timm_siglip(tmp_path, arch: str, save: str) -> None:
    model = perturb(timm.create_model(arch, pretrained=False, num_classes=0, dynamic_img_size=True, **TINY))
    tanh = arch != "vit_base_patch16_siglip_224"  # timm's SigLIP 2 era towers use tanh-GELU, the older exact GELU
    if save == "hub":
        timm.models._hub.save_for_hf(model, str(tmp_path), model_args=TINY, safe_serialization=True)
        vm = quiet_load(tmp_path)
        assert vm.spec.source_of("mlp_kind").startswith("metadata: model name")
    else:
        from safetensors.torch import save_file
        save_file(model.state_dict(), str(tmp_path / "siglip.safetensors"))
        with pytest.warns(GuessWarning, match="mlp_kind = gelu_tanh is a guess"):
            vm = vitviz.load(tmp_path / "siglip.safetensors", device="cpu", heads=4)
    s = vm.spec
    assert s.family == "timm-siglip" and s.pooling == "map" and s.num_prefix == 0
    assert s.mlp_kind == ("gelu_tanh" if tanh else "gelu")
    assert s.pool_num_heads == 4 and s.pool_mlp == 128
    for size in [(32, 32), (40, 56)]:
        x = x_for(*size)
        out, maps, pool = timm_pool_reference(model, x)
        check(vm.run(x), out, maps, pool)
    r = vm.run(x_for(), logits=False)
    assert r.pool_attention is None  # the MAP head runs after the blocks: a logits=False run stops before it


def hf_vision(cls: str) -> torch.nn.Module:
    from transformers import SiglipConfig, SiglipModel, SiglipVisionConfig, SiglipVisionModel

    v = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
             patch_size=8)
    if cls == "vision":
        return perturb(SiglipVisionModel(SiglipVisionConfig(**v, attn_implementation="eager")))
    return perturb(SiglipModel(SiglipConfig(vision_config=v, text_config=dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64),
        attn_implementation="eager")))


@pytest.mark.parametrize("cls", ["vision", "siglip"])
def test_hf_siglip(tmp_path, cls: str) -> None:
    model = hf_vision(cls)
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        vm = quiet_load(tmp_path)
    if cls == "siglip":
        assert any("ignored the text tower" in str(w.message) for w in record)
    s = vm.spec
    assert s.family == "hf-siglip" and s.pooling == "map" and s.num_heads == 4 and s.eps == 1e-6
    vision = model if cls == "vision" else model.vision_model
    for size in [(32, 32), (48, 40)]:
        x = x_for(*size)
        head_maps: list[torch.Tensor] = []
        vm_kw = {"interpolate_pos_encoding": True} if size != (32, 32) else {}
        with mha_weights(vision, head_maps), torch.no_grad():
            o = vision(pixel_values=x, output_attentions=True, **vm_kw)
        check(vm.run(x), o.pooler_output, list(o.attentions), head_maps[0][:, :, 0])


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """transformers' Siglip2ImageProcessor patch order: (B, C, H, W) -> (B, N, P*P*C), patches row-major, each
    flattened (p1, p2, c)."""
    b, c, h, w = x.shape
    t = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)  # (B, gh, gw, P, P, C)
    return t.reshape(b, (h // p) * (w // p), p * p * c)


def test_hf_siglip2_naflex(tmp_path) -> None:
    from transformers import Siglip2VisionConfig, Siglip2VisionModel

    model = perturb(Siglip2VisionModel(Siglip2VisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, patch_size=8,
        num_patches=16, attn_implementation="eager")))
    model.save_pretrained(tmp_path)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert s.family == "hf-siglip2" and s.pos_grid == (4, 4) and s.pos_interp == "bilinear_aa" and s.pooling == "map"
    for gh, gw in [(4, 4), (3, 5)]:  # the fixed-size grid, and a NaFlex aspect ratio (table resized)
        x = x_for(8 * gh, 8 * gw)
        head_maps: list[torch.Tensor] = []
        with mha_weights(model, head_maps), torch.no_grad():
            o = model(pixel_values=patchify(x, 8), pixel_attention_mask=torch.ones(1, gh * gw, dtype=torch.long),
                      spatial_shapes=torch.tensor([[gh, gw]]), output_attentions=True)
        check(vm.run(x), o.pooler_output, list(o.attentions), head_maps[0][:, :, 0])
