"""Parity with facebookresearch/dinov2's own model code (the `dinov2` 0.0.1.dev2 wheel, installed --no-deps by the
test command in README.md; skipped where it is absent).

The earlier HF-derived DINOv2 tests cover the key layout; these run the original `DinoVisionTransformer` itself,
including its position-embedding interpolation (bicubic with the +0.1 scale-factor offset) at non-square sizes.
"""
from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import attn_drop_reference

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "xFormers not available": the original falls back to eager attention
    dinov2_vit = pytest.importorskip("dinov2.models.vision_transformer")
    dinov2_layers = pytest.importorskip("dinov2.layers")


def original(ffn: str, chunks: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    block = partial(dinov2_layers.NestedTensorBlock, attn_class=dinov2_layers.MemEffAttention)
    model = dinov2_vit.DinoVisionTransformer(img_size=56, patch_size=14, embed_dim=192, depth=2, num_heads=3,
                                             mlp_ratio=4, block_fn=block, init_values=1.0, ffn_layer=ffn,
                                             block_chunks=chunks).eval()
    with torch.no_grad():
        for p in model.parameters():  # off the init values, so eps / layer-scale / offset mistakes show
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("ffn,chunks", [("mlp", 0), ("swiglufused", 0), ("mlp", 2)])
@pytest.mark.parametrize("size", [(56, 56), (70, 98), (98, 56)])
def test_original_dinov2_at_square_and_non_square_sizes(tmp_path, ffn: str, chunks: int,
                                                        size: tuple[int, int]) -> None:
    model = original(ffn, chunks, seed=len(ffn) + chunks)
    path = tmp_path / "dinov2_vits14_pretrain.pth"
    torch.save(model.state_dict(), path)
    vm = vitviz.load(path, heads=3, device="cpu")
    assert vm.spec.family == "dinov2" and vm.spec.pos_interp == "dinov2"
    assert vm.spec.mlp_kind == ("swiglu" if ffn.startswith("swiglu") else "gelu")
    assert vm.spec.num_params == sum(p.numel() for n, p in model.named_parameters() if n != "mask_token")
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(3))
    out, maps = attn_drop_reference(model, x)  # the CLS features, and each block's softmax
    assert len(maps) == 2
    got = vm.run(x)
    assert got.attentions.shape == (2, 3, 1 + (size[0] // 14) * (size[1] // 14), 1 + (size[0] // 14) * (size[1] // 14))
    assert got.logits.shape == (0,) and got.top_k() == []  # a backbone has no classes to rank
    np.testing.assert_allclose(got.features, out[0].numpy(), atol=1e-5)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(got.attentions[i], ref[0].numpy(), atol=1e-5, err_msg=f"layer {i}")
