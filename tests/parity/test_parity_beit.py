"""Parity for BEiT / BEiT v2 / data2vec-vision: timm `Beit` (unilm's names, `{'model': ...}` files), transformers
BeitForImageClassification / BeitModel / Data2VecVisionModel folders.

The relative position bias (one table per block, or one shared) joins the scores before the softmax. At another
grid each family resamples its tables its own way: timm / unilm with the geometric-progression interpolation (the
oracle is timm building the model at that size and converting the file with its `checkpoint_filter_fn`),
transformers bilinearly inside the forward (`interpolate_pos_encoding=True`).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import attn_drop_reference, perturb
from vitviz.core.spec import GuessWarning

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5


def x_for(size: int) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))


def quiet_load(path, **kw):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=GuessWarning, message=".*preprocess")
        return vitviz.load(path, device="cpu", **kw)


def check(result, out: torch.Tensor, maps: list[torch.Tensor]) -> None:
    got = result.features if result.logits.size == 0 else result.logits
    np.testing.assert_allclose(got, out[0].numpy(), atol=ATOL)
    assert result.attentions.shape[0] == len(maps)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(result.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")


def beit_args(shared: bool, size: int = 32) -> dict:
    return dict(embed_dim=64, num_heads=4, depth=2, img_size=size, patch_size=8, num_classes=5, init_values=0.1,
                use_abs_pos_emb=shared, use_rel_pos_bias=not shared, use_shared_rel_pos_bias=shared)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("size", [32, 48])
def test_timm_beit(tmp_path, shared: bool, size: int) -> None:
    from timm.models.beit import checkpoint_filter_fn

    model = perturb(timm.create_model("beit_base_patch16_224", pretrained=False, **beit_args(shared)))
    sd = model.state_dict()
    if not shared:  # unilm files keep the index buffers; they are recomputed, never loaded
        sd = {**sd, **{f"blocks.{i}.attn.relative_position_index": b.attn.relative_position_index
                       for i, b in enumerate(model.blocks)}}
    torch.save({"model": sd}, tmp_path / "beit_base_patch16_224_pt22k_ft22kto1k.pth")
    vm = quiet_load(tmp_path / "beit_base_patch16_224_pt22k_ft22kto1k.pth", heads=4)
    s = vm.spec
    assert s.family == "beit" and s.rel_pos == ("shared" if shared else "layer") and s.pooling == "avg" and s.fc_norm
    assert s.layer_scale and s.pos_embed == shared and s.position_kind == ("learned+relative" if shared else "relative")
    oracle = timm.create_model("beit_base_patch16_224", pretrained=False, **beit_args(shared, size)).eval()
    oracle.load_state_dict(checkpoint_filter_fn(model.state_dict(), oracle))  # timm's own resampling
    for blk in oracle.blocks:
        blk.attn.fused_attn = False
    out, maps = attn_drop_reference(oracle, x_for(size))
    check(vm.run(x_for(size)), out, maps)


@pytest.mark.parametrize("kind", ["beit_cls", "beit_shared", "data2vec"])
def test_hf_beit(tmp_path, kind: str) -> None:
    from transformers import BeitConfig, BeitForImageClassification, BeitModel, Data2VecVisionConfig, \
        Data2VecVisionModel

    shared = kind == "beit_shared"
    c = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
             patch_size=8, use_relative_position_bias=not shared, use_shared_relative_position_bias=shared,
             use_mean_pooling=True, layer_scale_init_value=0.1, use_absolute_position_embeddings=shared,
             attn_implementation="eager")
    if kind == "beit_cls":
        model = BeitForImageClassification(BeitConfig(**c, num_labels=3))
    elif kind == "beit_shared":
        model = BeitModel(BeitConfig(**c))
    else:
        model = Data2VecVisionModel(Data2VecVisionConfig(**c), add_pooling_layer=True)
    perturb(model)
    model.save_pretrained(tmp_path)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert s.family == ("hf-data2vec-vision" if kind == "data2vec" else "hf-beit") and s.eps == 1e-12
    assert s.rel_pos == ("shared" if shared else "layer") and s.rel_pos_interp == "hf" and s.num_heads == 4
    for size in [32, 48]:
        with torch.no_grad():
            o = model(pixel_values=x_for(size), output_attentions=True, interpolate_pos_encoding=size != 32)
        check(vm.run(x_for(size)), o.logits if kind == "beit_cls" else o.pooler_output, list(o.attentions))
