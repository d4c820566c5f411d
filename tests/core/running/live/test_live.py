"""The live-module path (vitviz.core.running.live): any nn.Module run as written, its attention captured exactly.

Parity: every layer's per-head attention against the eager attention of the original implementation (atol 1e-5,
float32), and the output the capture returns against the module's own forward -- identical where the module's
own forward is what runs, and within 1e-5 where PyTorch's fused fast path (which the capture turns off) would have
run instead. Mechanisms: explicit softmax (vit-pytorch), nn.MultiheadAttention with need_weights=False
(nn.TransformerEncoder, open_clip 3.x, torchvision), F.scaled_dot_product_attention (timm fused, transformers
sdpa, open_clip's own Attention, a hand-written module with masks, a scale, is_causal and GQA).

User code that changes torch's or Python's process-wide state leaves it as it was once vitviz ran it (issue 34).
"""
from __future__ import annotations

import copy
import json
import math
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from parity_refs import recorded_forward
from torch import nn
from trial_refs import (D2LMultiHeadAttention, LabmlMultiHeadAttention, ZupMultiHeadAttention, make_d2l, make_labml,
                        make_zuppichini)

import vitviz
from vitviz.core.running.live import (MHA, SDPA, SOFTMAX, LiveModel, LiveModelError, LiveWarning, NoAttentionError,
                                      UserCodeError, sdpa_probabilities)
from vitviz.errors import UnknownLayoutError, VitvizError

ATOL = 1e-5
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")  # said on purpose; tested once


def _perturb(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial norms and biases (fresh LayerNorms are the identity), in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                m.weight.add_(torch.randn(m.weight.shape, generator=g) * 0.2)
                m.bias.add_(torch.randn(m.bias.shape, generator=g) * 0.2)
    return model.eval()


def _image(size: tuple[int, int] = (32, 32), channels: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, channels, *size, generator=torch.Generator().manual_seed(seed))


def _own(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out = model(x)
    return getattr(out, "logits", out)


def _slow_path(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The module's own forward with PyTorch's fused MHA / TransformerEncoderLayer fast path off."""
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        return _own(model, x)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def _mha_reference(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Eager per-head weights of every nn.MultiheadAttention: each is called again on its own inputs with
    need_weights=True, average_attn_weights=False."""
    maps: list[torch.Tensor] = []
    busy: list[bool] = []

    def hook(mod: nn.MultiheadAttention, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if busy:
            return
        q, k, v = (list(args) + [kwargs.get(n) for n in ("query", "key", "value")][len(args):])[:3]
        busy.append(True)
        try:
            w = mod(q, k, v, need_weights=True, average_attn_weights=False, attn_mask=kwargs.get("attn_mask"))[1]
        finally:
            busy.clear()
        maps.append(w if w.dim() == 4 else w.unsqueeze(0))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in model.modules()
               if isinstance(m, nn.MultiheadAttention)]
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        with torch.inference_mode():
            model(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
        for h in handles:
            h.remove()
    return maps


def _assert_parity(model: LiveModel, x: torch.Tensor, reference: list[torch.Tensor], mechanism: str) -> np.ndarray:
    attn, out = model.forward_captured(x)
    assert attn.shape[1] == len(reference) == model.spec.depth
    for i, ref in enumerate(reference):
        np.testing.assert_allclose(attn[0, i], ref[0].float().numpy(), atol=ATOL, rtol=0, err_msg=f"layer {i}")
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
    assert [m for _, m in model.layers] == [mechanism] * len(reference)
    return out


# ---------------------------------------------------------------------------------------------------------------
# explicit softmax: vit-pytorch


def test_vit_pytorch_softmax_parity_and_identical_logits() -> None:
    from vit_pytorch import ViT

    torch.manual_seed(0)
    net = _perturb(ViT(image_size=32, patch_size=8, num_classes=10, dim=32, depth=3, heads=4, mlp_dim=64,
                       dim_head=16))
    x = _image()
    ref: list[torch.Tensor] = []
    handles = [m.register_forward_hook(lambda _m, _i, o: ref.append(o.clone())) for m in net.modules()
               if isinstance(m, nn.Softmax)]
    own = _own(net, x)
    for h in handles:
        h.remove()
    model = vitviz.load(net, live=True)
    assert isinstance(model, LiveModel) and model.spec.family == "live"
    s = model.spec
    assert (s.grid, s.num_prefix, s.prefix_names, s.num_heads, s.depth, s.patch_size) == ((4, 4), 1, ("cls",), 4, 3, 8)
    assert s.num_classes == 10 and s.pos_embed and s.pos_prefix == 1
    assert [n for n, _ in model.layers] == [f"transformer.layers.{i}.0" for i in range(3)]
    out = _assert_parity(model, x, ref, SOFTMAX)
    assert torch.equal(torch.from_numpy(out), own)  # the capture returns the module's own logits, bit for bit
    assert "live" in s.source_of("path") and "softmax" in s.source_of("path")
    np.testing.assert_array_equal(model.pos_embed(), net.pos_embedding.detach().numpy())  # its own table
    assert model.pos_embed((2, 3)).shape == (7, 32)  # CLS row kept, the grid resampled


def test_vit_pytorch_mean_pool_has_no_prefix_and_run_works() -> None:
    from vit_pytorch import ViT

    torch.manual_seed(1)
    net = _perturb(ViT(image_size=32, patch_size=8, num_classes=5, dim=32, depth=2, heads=2, mlp_dim=32,
                       pool="mean", dim_head=16))
    model = vitviz.load(net, live=True)
    assert model.spec.num_prefix == 0 and model.spec.num_tokens == 16
    result = model.run(np.random.default_rng(0).integers(0, 255, (40, 50, 3), dtype=np.uint8))
    assert result.attentions.shape == (2, 2, 16, 16) and result.attentions.dtype == np.float32
    assert result.logits.shape == (5,) and len(result.top_k(3)) == 3
    assert result.image.shape == (32, 32, 3)


# ---------------------------------------------------------------------------------------------------------------
# nn.MultiheadAttention: nn.TransformerEncoder (fast path), torchvision, open_clip


class EncoderViT(nn.Module):
    """A ViT written with nn.TransformerEncoder, as tutorials write it."""

    def __init__(self, norm_first: bool, activation: str = "relu", dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, 17, dim) * 0.5)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, activation=activation,
                                           batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)  # (B, D, 4, 4) -> (B, 16, D)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.encoder(x)[:, 0])


def _aten_ops(run: Any) -> set[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return {e.name for e in prof.events()}


FUSED_LAYER = "aten::_transformer_encoder_layer_fwd"  # the whole layer in one kernel: no MHA module runs


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_fast_path_parity(norm_first: bool) -> None:
    torch.manual_seed(2)
    net = _perturb(EncoderViT(norm_first, "gelu" if norm_first else "relu"))
    x = _image()
    ref = _mha_reference(net, x)
    assert FUSED_LAYER in _aten_ops(lambda: _own(net, x))  # eval + inference mode: PyTorch's fused fast path
    own = _own(net, x)
    model = vitviz.load(net, live=True)
    assert FUSED_LAYER not in _aten_ops(lambda: model.forward_captured(x))  # turned off for the capture only
    assert [n for n, _ in model.layers] == [f"encoder.layers.{i}.self_attn" for i in range(3)]
    out = torch.from_numpy(_assert_parity(model, x, ref, MHA))
    assert torch.equal(out, _slow_path(net, x))          # exactly the module's own (unfused) forward
    torch.testing.assert_close(out, own, atol=ATOL, rtol=0)  # and the fused one, to float rounding
    assert torch.equal(_own(net, x), own)                # nothing left behind: the fast path is back


def test_capture_leaves_model_as_it_was() -> None:
    """Hooks removed, no torch-function mode left, train/eval flags restored, output of a later plain forward
    unchanged -- also after the user's forward fails inside the capture."""
    torch.manual_seed(3)
    net = _perturb(EncoderViT(False))
    x = _image()
    before = _own(net, x)
    net.train()
    net.encoder.layers[1].eval()
    model = vitviz.load(net, live=True)
    model.forward_captured(x)
    with pytest.raises(LiveModelError, match="own forward failed"):
        model.forward_captured(_image((40, 40)))  # 25 patches: its position table has 17 rows
    assert net.training and not net.encoder.layers[1].training and net.encoder.layers[0].training
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())
    assert not torch.overrides._get_current_function_mode_stack()
    assert torch.equal(_own(net.eval(), x), before)


def test_torchvision_vit_mha_parity_and_auto_path() -> None:
    import torchvision

    torch.manual_seed(4)
    net = _perturb(torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                                                       hidden_dim=32, mlp_dim=64, num_classes=10))
    x = _image()
    auto = vitviz.load(net)  # a known layout: converted to the reference ViT, as before
    assert auto.spec.family == "torchvision" and "reference" in auto.spec.source_of("path")
    model = vitviz.load(net, live=True)
    assert model.spec.family == "live" and model.spec.image_size == (32, 32)
    out = torch.from_numpy(_assert_parity(model, x, _mha_reference(net, x), MHA))
    torch.testing.assert_close(out, _own(net, x), atol=ATOL, rtol=0)
    np.testing.assert_allclose(auto.forward_captured(x)[0], model.forward_captured(x)[0], atol=ATOL)


def _open_clip_tower(block_type: str | None) -> nn.Module:
    from open_clip.transformer import VisionTransformer

    torch.manual_seed(5)
    return _perturb(VisionTransformer(image_size=32, patch_size=8, width=32, layers=2, heads=4, mlp_ratio=2.0,
                                      output_dim=16, block_type=block_type))


def test_open_clip_vision_tower_mha() -> None:
    """open_clip 3.x blocks call nn.MultiheadAttention(need_weights=False)."""
    tower = _open_clip_tower(None)
    assert isinstance(tower.transformer.resblocks[0].attn, nn.MultiheadAttention)
    tower.image_mean, tower.image_std = (0.48, 0.46, 0.41), (0.27, 0.26, 0.28)  # as open_clip sets them
    x = _image()
    model = vitviz.load(tower, live=True)
    assert model.spec.preprocess.mean == (0.48, 0.46, 0.41) and "open_clip" in model.spec.source_of("preprocess")
    assert model.spec.num_classes == 0 and model.spec.prefix_names == ("cls",)
    assert "features" in model.spec.source_of("num_classes")  # the image embedding is no classifier
    out = torch.from_numpy(_assert_parity(model, x, _mha_reference(tower, x), MHA))
    assert torch.equal(out, _slow_path(tower, x))
    torch.testing.assert_close(out, _own(tower, x), atol=ATOL, rtol=0)
    result = model.run(x)
    assert result.logits.size == 0 and result.features is not None and result.features.shape == (16,)


def test_open_clip_vision_tower_own_attention_sdpa() -> None:
    """open_clip's own `Attention` (newer main's default) calls F.scaled_dot_product_attention."""
    tower = _open_clip_tower("custom")
    x = _image()
    ref: list[torch.Tensor] = []

    def eager(mod: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        xs = args[0]
        n, length, c = xs.shape
        q, k, _ = F.linear(xs, mod.in_proj_weight, mod.in_proj_bias).chunk(3, dim=-1)
        q = q.reshape(n, length, mod.num_heads, -1).transpose(1, 2)  # (B, H, T, hd)
        k = k.reshape(n, length, mod.num_heads, -1).transpose(1, 2)
        ref.append(torch.softmax((q * mod.scale) @ k.transpose(-2, -1), dim=-1))

    handles = [b.attn.register_forward_pre_hook(eager) for b in tower.transformer.resblocks]
    own = _own(tower, x)
    for h in handles:
        h.remove()
    model = vitviz.load(tower, live=True)
    out = torch.from_numpy(_assert_parity(model, x, ref, SDPA))
    assert torch.equal(out, own)


# ---------------------------------------------------------------------------------------------------------------
# F.scaled_dot_product_attention: timm fused, transformers sdpa, a hand-written module


def test_timm_fused_attention_parity() -> None:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(6)
    net = _perturb(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=10,
                                     qk_norm=True, reg_tokens=2))
    for block in net.blocks:
        block.attn.fused_attn = True
    x = _image()
    own = _own(net, x)
    eager = copy.deepcopy(net)
    ref: list[torch.Tensor] = []
    for block in eager.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda _m, _i, o: ref.append(o.clone()))
    _own(eager, x)
    model = vitviz.load(net, live=True)
    assert model.spec.prefix_names == ("cls", "reg0", "reg1") and model.spec.num_tokens == 19
    assert "patch_embed.img_size" in model.spec.source_of("image_size")
    out = _assert_parity(model, x, ref, SDPA)  # qk-norm included: q and k are taken where SDPA gets them
    assert torch.equal(torch.from_numpy(out), own)
    assert [n for n, _ in model.layers] == ["blocks.0.attn", "blocks.1.attn"]


def test_transformers_vit_sdpa_parity() -> None:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(7)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, num_labels=10)
    net = _perturb(ViTForImageClassification(config))
    net.set_attn_implementation("sdpa")
    eager = copy.deepcopy(net)
    eager.set_attn_implementation("eager")
    x = _image()
    with torch.inference_mode():
        ref = eager(x, output_attentions=True)
    own = _own(net, x)
    model = vitviz.load(net, live=True)
    assert model.spec.num_classes == 10 and "logits" in model.spec.source_of("num_classes")
    assert "config.image_size" in model.spec.source_of("image_size") or "image_size" in model.spec.source_of(
        "image_size")
    out = torch.from_numpy(_assert_parity(model, x, list(ref.attentions), SDPA))
    assert torch.equal(out, own)
    torch.testing.assert_close(out, ref.logits, atol=ATOL, rtol=0)


class SdpaViT(nn.Module):
    """A hand-written ViT on F.scaled_dot_product_attention, with the SDPA options users pass; `eager=True`
    computes the same attention explicitly and keeps it in `self.maps` (the reference)."""

    def __init__(self, mask: str = "none", scale: float | None = None, causal: bool = False, kv_heads: int = 4,
                 dim: int = 32, heads: int = 4, depth: int = 2) -> None:
        super().__init__()
        self.mask, self.scale, self.causal, self.heads, self.kv_heads = mask, scale, causal, heads, kv_heads
        self.hd = dim // heads
        self.embed = nn.Conv2d(3, dim, 8, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.q = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.kv = nn.ModuleList(nn.Linear(dim, 2 * kv_heads * self.hd) for _ in range(depth))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 7)
        self.eager = False
        self.maps: list[torch.Tensor] = []

    def _mask(self, t: int, device: torch.device) -> torch.Tensor | None:
        g = torch.Generator().manual_seed(t)
        if self.mask == "bool":
            keep = torch.rand(t, t, generator=g) > 0.3
            return (keep | torch.eye(t, dtype=torch.bool)).to(device)
        if self.mask == "float":
            return (torch.randn(1, self.heads, t, t, generator=g) * 0.5).to(device)
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        b, t, _ = x.shape
        mask = self._mask(t, x.device)
        for q_lin, kv_lin, proj, norm in zip(self.q, self.kv, self.proj, self.norms):
            h = norm(x)
            q = q_lin(h).reshape(b, t, self.heads, self.hd).transpose(1, 2)  # (B, H, T, hd)
            k, v = kv_lin(h).reshape(b, t, 2, self.kv_heads, self.hd).permute(2, 0, 3, 1, 4)  # 2 x (B, Hkv, T, hd)
            gqa = self.kv_heads != self.heads
            if self.eager:
                kk = k.repeat_interleave(self.heads // self.kv_heads, 1) if gqa else k
                vv = v.repeat_interleave(self.heads // self.kv_heads, 1) if gqa else v
                s = (q @ kk.transpose(-2, -1)) * (self.scale if self.scale is not None else self.hd ** -0.5)
                if self.causal:
                    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
                if mask is not None:
                    s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
                p = s.softmax(-1)
                self.maps.append(p)
                o = p @ vv
            else:
                extra = {"enable_gqa": True} if gqa else {}
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal,
                                                   scale=self.scale, **extra)
            x = x + proj(o.transpose(1, 2).reshape(b, t, -1))
        return self.head(x[:, 0])


@pytest.mark.parametrize("options", [
    {}, {"mask": "bool"}, {"mask": "float", "scale": 0.3}, {"causal": True}, {"kv_heads": 2, "mask": "bool"},
], ids=["plain", "bool-mask", "float-mask-scale", "causal", "gqa"])
def test_sdpa_module_options_parity(options: dict[str, Any]) -> None:
    torch.manual_seed(8)
    net = _perturb(SdpaViT(**options))
    x = _image()
    own = _own(net, x)
    net.eager = True
    _own(net, x)
    ref, net.maps, net.eager = net.maps, [], False
    model = vitviz.load(net)  # not a layout vitviz converts: the live path, automatically
    assert model.spec.family == "live" and "no layout" in model.spec.source_of("path")
    out = _assert_parity(model, x, ref, SDPA)
    assert torch.equal(torch.from_numpy(out), own)
    assert model.spec.num_prefix == 1 and model.spec.num_classes == 7


def test_sdpa_probabilities_match_torch_math() -> None:
    """The recomputation against torch's own SDPA output: probabilities @ v == SDPA(q, k, v)."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    mask = torch.randn(6, 6, generator=g)
    for kwargs in ({}, {"attn_mask": mask}, {"attn_mask": mask > 0.5}, {"is_causal": True}, {"scale": 0.1}):
        probs = sdpa_probabilities(q, k, **kwargs)
        torch.testing.assert_close(probs @ v, F.scaled_dot_product_attention(q, k, v, **kwargs), atol=1e-5,
                                   rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# geometry, options and errors


def test_non_square_input_grid_and_overrides() -> None:
    torch.manual_seed(10)
    net = _perturb(SdpaViT())  # no position table: runs at any size
    model = vitviz.load(net, live=True, image_size=(32, 48))
    assert model.spec.grid == (4, 6) and model.spec.num_tokens == 25
    assert model.spec.preprocess.crop == (32, 48)
    attn, _ = model.forward_captured(_image((32, 48)))
    assert attn.shape == (1, 2, 4, 25, 25)
    photo = np.random.default_rng(0).integers(0, 255, (60, 50, 3), dtype=np.uint8)
    result = model.run(photo, image_size=(48, 32))
    assert result.spec.grid == (6, 4) and result.attentions.shape == (2, 4, 25, 25)
    assert vitviz.load(net, grid=(3, 5)).spec.image_size == (24, 40)
    with pytest.raises(LiveModelError, match="num_prefix=2 .* 1 prefix"):
        vitviz.load(net, num_prefix=2)
    with pytest.raises(LiveModelError, match="heads=3 .* 4 heads"):
        vitviz.load(net, live=True, heads=3)
    mm = vitviz.load(net, live=True, mean=(0.1,), std=(0.2,))
    assert mm.spec.preprocess.mean == (0.1,) and "mean, std overridden" in mm.spec.source_of("preprocess")
    with pytest.raises(vitviz.VitvizError, match="live path"):
        vitviz.load({"a": torch.zeros(1)}, grid=(2, 2))


def test_logits_false_stops_early_rows_and_half() -> None:
    torch.manual_seed(11)
    net = _perturb(SdpaViT(depth=3))
    model = vitviz.load(net, live=True)
    x = _image()
    full, _ = model.forward_captured(x)
    first, out = model.forward_captured(x, logits=False, upto=0)
    assert first.shape == (1, 1, 4, 17, 17) and out.shape == (1, 0)
    np.testing.assert_array_equal(first[:, 0], full[:, 0])
    rows, _ = model.forward_captured(x, rows=[0, 5])
    np.testing.assert_array_equal(rows, full[:, :, :, [0, 5]])
    half, _ = model.forward_captured(torch.cat([x, x]), half=True)
    assert half.dtype == np.float16 and half.shape == (2, 3, 4, 17, 17)
    np.testing.assert_allclose(half[1].astype(np.float32), full[0], atol=1e-3)
    assert not torch.overrides._get_current_function_mode_stack()


def test_guessed_preprocessing_is_said_unless_given() -> None:
    import warnings

    from vitviz.core.spec import GuessWarning

    net = _perturb(SdpaViT())
    with pytest.warns(GuessWarning, match="preprocess"):
        model = vitviz.load(net, live=True, image_size=32)
    assert model.spec.source_of("preprocess").startswith("guess")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GuessWarning)
        model = vitviz.load(net, live=True, image_size=32, mean=(0.5,), std=(0.5,))
    assert not model.spec.guesses


class NoAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 8, 8)
        self.head = nn.Linear(8 * 16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x).flatten(1)).softmax(-1)


def test_no_attention_is_a_clear_error() -> None:
    with pytest.raises(NoAttentionError) as info:
        vitviz.load(NoAttention(), live=True, image_size=32)
    text = str(info.value)
    for word in ("no self-attention", "nn.MultiheadAttention", "scaled_dot_product_attention", "softmax",
                 "(1, 4)"):
        assert word in text
    with pytest.raises(LiveModelError, match="Converting it to the reference ViT failed too"):
        vitviz.load(NoAttention(), image_size=32)  # automatic: both paths said no, and both reasons are given


def test_window_attention_is_refused_with_its_token_count() -> None:
    class Windows(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Conv2d(3, 8, 4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = self.embed(x).flatten(2).transpose(1, 2).reshape(4, 16, 2, 4).transpose(1, 2)  # 4 windows of 16
            return F.scaled_dot_product_attention(t, t, t).mean()

    # windows folded into the batch are no image's map: skipped and said (RF-DETR's windowed DINOv2, the zoo)
    with pytest.raises(LiveModelError, match=r"4 windows per batch of 1 \(4, 2, 16, 16\)"):
        vitviz.load(Windows(), live=True, image_size=32)


# ---------------------------------------------------------------------------------------------------------------
# code=FILE.py:FACTORY and the command line


CODE = '''
import torch
from vit_pytorch import ViT

def build():
    torch.manual_seed(123)
    return ViT(image_size=32, patch_size=8, num_classes=4, dim=32, depth=2, heads=2, mlp_dim=32, dim_head=16)

class NeedsArgs(torch.nn.Module):
    def __init__(self, width):
        super().__init__()

def not_a_model():
    return 3
'''


@pytest.fixture()
def user_code(tmp_path: Path) -> tuple[Path, Path, torch.Tensor]:
    """model.py with a factory, and weights saved the way training scripts save them (DataParallel prefix)."""
    code = tmp_path / "model.py"
    code.write_text(CODE)
    from vit_pytorch import ViT

    torch.manual_seed(0)
    trained = _perturb(ViT(image_size=32, patch_size=8, num_classes=4, dim=32, depth=2, heads=2, mlp_dim=32,
                           dim_head=16))
    weights = tmp_path / "weights.pth"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in trained.state_dict().items()}}, weights)
    return code, weights, _own(trained, _image())


def test_code_factory_with_weights(user_code: tuple[Path, Path, torch.Tensor]) -> None:
    code, weights, expected = user_code
    model = vitviz.load(weights, code=f"{code}:build", device="cpu")
    assert model.spec.family == "live" and model.spec.source == str(weights)
    assert "code" in model.spec.source_of("path") and "'module.' removed" in model.spec.source_of("path")
    _, out = model.forward_captured(_image())
    assert torch.equal(torch.from_numpy(out), expected)  # the file's weights, not the factory's random ones


def test_code_errors(user_code: tuple[Path, Path, torch.Tensor], tmp_path: Path) -> None:
    code, weights, _ = user_code
    cases = {
        "model.py": "expected FILE.py:FACTORY",
        f"{code}:missing": "defines no 'missing'; it defines NeedsArgs, build, not_a_model",
        f"{code}:NeedsArgs": "needs arguments (width)",
        f"{code}:not_a_model": "returned a int; expected a torch.nn.Module",
        f"{tmp_path / 'nope.py'}:build": "is not a Python file",
    }
    for ref, message in cases.items():
        with pytest.raises(UserCodeError, match=message.replace("(", r"\(").replace(")", r"\)")):
            vitviz.load(weights, code=ref)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(UserCodeError, match="importing .* failed .*boom"):
        vitviz.load(None, code=f"{broken}:build")
    other = tmp_path / "other.pth"
    torch.save({"blocks.0.weight": torch.zeros(2)}, other)
    with pytest.raises(UserCodeError, match="does not fit the model .*not in the file"):
        vitviz.load(other, code=f"{code}:build")


def test_cli_code_info_and_export(user_code: tuple[Path, Path, torch.Tensor], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    from vitviz.cli import main

    code, weights, _ = user_code
    assert main(["info", str(weights), "--code", f"{code}:build"]) == 0
    text = capsys.readouterr().out
    assert "family: live" in text and "transformer.layers.1.0" in text and "softmax" in text
    image = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(image)
    out = tmp_path / "out"
    assert main(["export", "--model", str(weights), "--code", f"{code}:build", str(image), "--out", str(out),
                 "--quiet", "--npz", "--device", "cpu"]) == 0
    assert (out / "img_cls_L1_Hmean.png").is_file()
    data = np.load(out / "img.npz")
    assert data["attentions"].shape == (2, 2, 17, 17)
    assert main(["info", "--code", f"{code}:nope", str(weights)]) == 2
    assert "defines no 'nope'" in capsys.readouterr().err


# What a new user's trial of the live path found (scripts/trial_live.py), each a regression test: attention
# the module computes that vitviz could not show as computed is said, never shown silently as something else.
DIM, HEADS = 32, 4


class Attention(nn.Module):
    """qkv attention; `style` says what happens between the scores and the product with the values."""

    def __init__(self, style: str = "plain") -> None:
        super().__init__()
        self.style, self.hd = style, DIM // HEADS
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mix = nn.Linear(HEADS, HEADS)
        self.drop = nn.Dropout(0.1)
        self.bias = nn.Parameter(torch.randn(HEADS, 4))
        self.applied: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, self.hd).permute(2, 0, 3, 1, 4)
        if self.style != "sdpa_bias":
            s = q @ k.transpose(-2, -1) / math.sqrt(self.hd)
        if self.style == "sigmoid":
            a = torch.sigmoid(s)
        elif self.style == "sdpa_bias":      # a bias made by a product, handed to SDPA as its float mask
            e = self.bias[None, :, None, :].expand(b, -1, n, -1)
            mask = e @ e.transpose(-2, -1)                       # (B, H, T, T)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.proj(o.transpose(1, 2).reshape(b, n, c))
        else:
            a = s.softmax(dim=-1)
        if self.style == "talking_heads":
            a = self.mix(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        elif self.style == "renormalised":
            a = a * (torch.arange(n, device=a.device) < n - 2)
            a = a / a.sum(-1, keepdim=True)
        elif self.style == "hard_dropout":
            a = F.dropout(a, 0.1)
        elif self.style == "plain":         # what is not a change: dropout off, casts, reshapes, a slice read
            a = self.drop(a).float().contiguous().view(b, HEADS, n, n)
            _ = a[:, :, 0].mean(1)
        self.applied = a.detach()
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, style: str) -> None:
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(DIM), Attention(style)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attn(self.norm(x))


class TinyViT(nn.Module):
    def __init__(self, *styles: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM))
        self.blocks = nn.ModuleList([Block(s) for s in styles])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


def _load(net: nn.Module) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = vitviz.load(net, live=True, device="cpu")
    return model, [str(w.message) for w in caught if issubclass(w.category, LiveWarning)]


@pytest.mark.parametrize(("style", "call"), [("talking_heads", "by linear in blocks.1.attn.mix"),
                                             ("renormalised", "by mul")])
def test_a_softmax_output_changed_before_it_is_applied_is_shown_as_applied_and_said(style: str, call: str) -> None:
    """Talking heads, a re-normalisation: the weights that meet the values are shown (issue 31), said."""
    model, said = _load(TinyViT("plain", style))
    assert len(said) == 1 and "blocks.1.attn" in said[0] and call in said[0] and "blocks.0.attn" not in said[0]
    assert "the weights applied to the values" in said[0]
    assert "blocks.1.attn" in model.spec.source_of("path")
    x = torch.randn(2, 3, 32, 32)
    attn, _ = model.forward_captured(x)
    with torch.inference_mode():
        model.net.eval()(x)      # as vitviz runs it: eval mode
    np.testing.assert_allclose(attn[:, 1], model.net.blocks[1].attn.applied.numpy(), atol=1e-6)
    np.testing.assert_allclose(attn[:, 0], model.net.blocks[0].attn.applied.numpy(), atol=1e-6)


def test_a_softmax_output_changed_at_random_before_it_is_applied_is_said() -> None:
    """Dropout in training mode is random: the softmax is shown, said as not what the module applies."""
    model, said = _load(TinyViT("plain", "hard_dropout"))
    call = "dropout(p=0.1) in training mode"
    assert len(said) == 1 and "blocks.1.attn" in said[0] and call in said[0] and "blocks.0.attn" not in said[0]
    assert "not the weights the module applies" in said[0]
    x = torch.randn(1, 3, 32, 32)
    attn, _ = model.forward_captured(x)
    with torch.inference_mode():
        model.net.eval()(x)
    assert not np.allclose(attn[:, 1], model.net.blocks[1].attn.applied.numpy(), atol=1e-3)
    np.testing.assert_allclose(attn[:, 0], model.net.blocks[0].attn.applied.numpy(), atol=1e-6)


def test_dropout_off_casts_reshapes_and_reads_are_not_changes() -> None:
    model, said = _load(TinyViT("plain", "plain"))
    assert said == [] and "changed" not in model.spec.source_of("path")
    assert [m for _, m in model.layers] == ["softmax", "softmax"]


def test_scores_without_a_softmax_beside_softmax_layers_are_left_out_and_said() -> None:
    model, said = _load(TinyViT("plain", "sigmoid", "plain"))
    assert [n for n, _ in model.layers] == ["blocks.0.attn", "blocks.2.attn"]     # the sigmoid layer is not shown
    assert len(said) == 1 and "blocks.1.attn" in said[0] and "no softmax over their last axis" in said[0]
    assert [(n, shape) for n, m, shape in model.skipped if "no softmax" in m] == [("blocks.1.attn", (1, 4, 17, 17))]


def test_only_sigmoid_attention_is_refused_naming_the_scores() -> None:
    with pytest.raises(vitviz.core.running.live.NoAttentionError, match=r"blocks\.0\.attn 17x17 scores with no softmax"):
        vitviz.load(TinyViT("sigmoid", "sigmoid"), live=True, device="cpu")


def test_a_product_made_bias_given_to_sdpa_is_not_scores_without_a_softmax() -> None:
    model, said = _load(TinyViT("sdpa_bias", "plain"))
    assert said == [] and not [s for s in model.skipped if "no softmax" in s[1]]
    assert [m for _, m in model.layers] == ["scaled_dot_product_attention", "softmax"]


class StemViT(TinyViT):
    """A hybrid stem: three 2x2 stride-2 convolutions, 8 px patches in all."""

    def __init__(self) -> None:
        super().__init__("plain", "plain")
        self.patch_embed = nn.Sequential(nn.Conv2d(3, 16, 2, 2), nn.BatchNorm2d(16), nn.ReLU(),
                                         nn.Conv2d(16, 16, 2, 2), nn.ReLU(), nn.Conv2d(16, DIM, 2, 2))


def test_a_stem_of_patchify_convolutions_takes_the_patch_size_from_the_tokens() -> None:
    model, said = _load(StemViT())
    s = model.spec
    assert (s.image_size, s.patch_size, s.grid, s.embed_dim, s.prefix_names, s.pos_embed) == \
        ((32, 32), 8, (4, 4), DIM, ("cls",), True)
    assert "more downsampling follows it" in s.source_of("patch_size") and "cut in the forward" not in \
        s.source_of("patch_size")
    x = torch.randn(2, 3, 32, 32)
    attn, _ = model.forward_captured(x)
    with torch.inference_mode():
        model.net.eval()(x)
    for i, blk in enumerate(model.net.blocks):
        np.testing.assert_allclose(attn[:, i], blk.attn.applied.numpy(), atol=1e-6)


class PerImageAttention(Attention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, self.hd).permute(2, 0, 3, 1, 4)
        maps = [torch.softmax(q[i] @ k[i].transpose(-2, -1) / math.sqrt(self.hd), dim=-1) for i in range(b)]
        self.applied = torch.stack(maps).detach()
        out = torch.stack([m @ v[i] for i, m in enumerate(maps)])
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


def test_attention_computed_one_image_at_a_time_runs_a_batch_image_by_image() -> None:
    net = TinyViT("plain", "plain")
    for blk in net.blocks:
        blk.attn = PerImageAttention()
    model, said = _load(net)
    assert model.layout.per_image and "one image at a time" in model.spec.source_of("path")
    x = torch.randn(3, 3, 32, 32)
    attn, out = model.forward_captured(x)
    with torch.inference_mode():
        own = model.net.eval()(x)
    assert attn.shape == (3, 2, HEADS, 17, 17)
    for i, blk in enumerate(model.net.blocks):
        np.testing.assert_allclose(attn[:, i], blk.attn.applied.numpy(), atol=1e-6)
    np.testing.assert_allclose(out, own.numpy(), atol=1e-5)
    maps, _ = model.forward_captured(x, logits=False, upto=0)
    assert maps.shape == (3, 1, HEADS, 17, 17)


def sigmoid_between() -> nn.Module:
    """A factory for `--code`: a sigmoid "attention" between two softmax layers."""
    torch.manual_seed(0)
    return TinyViT("plain", "sigmoid", "plain").eval()


def test_vitviz_info_lists_what_the_live_path_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    """`vitviz info --code` says which attention calls it saw but did not show (text and JSON), not only the GUI."""
    from vitviz.cli import main

    code = f"{Path(__file__)}:sigmoid_between"
    assert main(["info", "--code", code]) == 0
    text = capsys.readouterr().out
    assert re.search(r"skipped\s+blocks\.1\.attn\s+.*no softmax.*\(1, 4, 17, 17\)", text), text
    assert main(["info", "--code", code, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["module"] for s in data["skipped_attention"]] == ["blocks.1.attn"]
    assert [a["module"] for a in data["attention_layers"]] == ["blocks.0.attn", "blocks.2.attn"]


# What the trial of eleven hand-written ViTs from GitHub (scripts/trial_handwritten/REPORT.md) found, each a
# regression test (the models are copied in trial_refs.py, sources credited there).
TESTS = Path(__file__).resolve().parents[3]   # tests/, where trial_refs.py is


def _built(make: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """The model its factory makes, given its shapes by one forward (as its first training step does), every
    parameter perturbed (attention far from uniform), in eval mode."""
    torch.manual_seed(seed)
    net = make()
    with torch.no_grad():
        net.eval()(torch.zeros(1, 3, 32, 32))
        g = torch.Generator().manual_seed(seed + 1)
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return net.eval()


def _code_file(tmp_path: Path, factory: str) -> str:
    code = tmp_path / "model.py"
    code.write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom trial_refs import {factory}\n")
    return f"{code}:{factory}"


def _own_maps(net: nn.Module, cls: type, read: object, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The module's own output and, per attention module of class `cls`, what `read(module)` makes of what it
    kept ((B, H, T, T))."""
    return recorded_forward(net, x, [m for m in net.modules() if isinstance(m, cls)], read=read)


def _same(attn: np.ndarray, maps: list[torch.Tensor], image: int = 0) -> None:
    """(L, H, T, T) captured against the per-layer (B, H, T, T) maps the module kept, for one image."""
    assert attn.shape == (len(maps), *maps[0].shape[1:])
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(attn[i], ref[image].numpy(), atol=ATOL, err_msg=f"layer {i}")


def _d2l_maps(m: nn.Module) -> torch.Tensor:
    w = m.attention.attention_weights                         # (B*H, T, T), d2l keeps it
    return w.reshape(-1, m.num_heads, *w.shape[-2:])         # (B, H, T, T)


def _labml_maps(m: nn.Module) -> torch.Tensor:
    return m.attn.permute(2, 3, 0, 1)                         # (T_q, T_k, B, H) -> (B, H, T_q, T_k)


# --------------------------------------------------------------------------------------- 1. Lazy modules (d2l)
def test_d2l_lazy_vit_by_code_with_its_weights_is_exact(tmp_path: Path) -> None:
    net = _built(make_d2l)
    torch.save(net.state_dict(), tmp_path / "d2l.pth")
    vm = vitviz.load(tmp_path / "d2l.pth", code=_code_file(tmp_path, "make_d2l"), device="cpu")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    out, maps = _own_maps(net, D2LMultiHeadAttention, _d2l_maps, x)
    attn, logits = vm.forward_captured(x)
    for b in range(2):
        _same(attn[b], maps, b)
    np.testing.assert_allclose(logits, out.numpy(), atol=1e-5)
    assert vm.spec.num_heads == 4 and vm.spec.depth == 2
    assert "Lazy modules" in vm.spec.source_of("path") and "dry forward of a (1, 3, 32, 32) input" in \
        vm.spec.source_of("path")


def test_a_fresh_lazy_model_opens_live_and_the_dry_run_leaves_the_global_random_state() -> None:
    torch.manual_seed(3)
    net = make_d2l()
    state = torch.random.get_rng_state()
    vm = vitviz.load(net, live=True, device="cpu")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in net.modules())   # Linear, Conv2d now
    assert net.patch_embedding.conv.in_channels == 3
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    _out, maps = _own_maps(net.eval(), D2LMultiHeadAttention, _d2l_maps, x)
    _same(vm.forward_captured(x)[0][0], maps)


class _LazyOddSize(nn.Module):
    """A Lazy model whose forward takes only 40 px images, which nothing in it states."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.LazyLinear(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-1] == 40, "40 px images only"
        t = self.proj(x.flatten(2).transpose(1, 2)[:, :, :3])
        return torch.softmax(t @ t.transpose(1, 2), -1).mean(1)


def test_a_lazy_model_no_probe_fits_is_a_user_code_error_naming_its_lazy_modules(tmp_path: Path) -> None:
    with pytest.raises(UserCodeError, match=r"Lazy modules without shapes \(proj \(LazyLinear\)\).*image_size="):
        vitviz.load(_LazyOddSize(), live=True, device="cpu")


# -------------------------------------------------------------------- 2. labml: (T_q, T_k, B, H), softmax(dim=1)
@pytest.mark.parametrize("heads", [4, 2])     # 2 heads: as many as the two images, told apart by the probe
def test_labml_sequence_first_softmax_over_dim_1_is_captured_exactly(heads: int) -> None:
    net = _built(lambda: make_labml(heads))
    vm = vitviz.load(net, live=True, device="cpu")
    assert [m for _, m in vm.layers] == ["softmax over dim=1 of (T_q, T_k, B, H)"] * 3
    assert [n for n, _ in vm.layers] == [f"transformer_layers.{i}.self_attn" for i in range(3)]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    out, maps = _own_maps(net, LabmlMultiHeadAttention, _labml_maps, x)
    attn, logits = vm.forward_captured(x)
    assert attn.shape == (2, 3, heads, 17, 17)
    for b in range(2):
        _same(attn[b], maps, b)
    np.testing.assert_allclose(logits, out.numpy(), atol=1e-5)


def test_labml_by_code_with_its_weights_is_exact_and_by_file_names_its_attention(tmp_path: Path) -> None:
    net = _built(make_labml)
    path = tmp_path / "labml.pth"
    torch.save(net.state_dict(), path)
    vm = vitviz.load(path, code=_code_file(tmp_path, "make_labml"), device="cpu", image_size=32)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    _out, maps = _own_maps(net, LabmlMultiHeadAttention, _labml_maps, x)
    _same(vm.forward_captured(x)[0][0], maps)
    # by file: its query.linear / key.linear / value.linear are attention, so it is never "not a ViT"; what cannot
    # be placed is said, and the route given is --code, which works
    with pytest.raises(UnknownLayoutError) as refused:
        vitviz.load(path)
    msg = str(refused.value)
    assert "not a Vision Transformer" not in msg
    assert "attention: width 64" in msg and "positional_encodings (5000, 1, 64) is a sequence-first table" in msg
    assert "Next: open it with its own code" in msg and "--code" in msg


class _OverQueries(nn.Module):
    """(B, H, T, T) scores with a softmax over the queries (dim=-2): not attention over the keys, whatever its
    shape -- the rule for token axes elsewhere must not take it."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 32, 8, 8)
        self.qkv = nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch_embed(x).flatten(2).transpose(1, 2)
        q, k, v = self.qkv(t).reshape(t.shape[0], t.shape[1], 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1)).softmax(dim=-2)
        return (a @ v).mean((1, 2))


def test_a_softmax_over_the_query_axis_of_b_h_t_t_scores_is_still_not_attention() -> None:
    with pytest.raises(NoAttentionError, match=r"softmax over other shapes: \[\(1, 4, 16, 16\)\]"):
        vitviz.load(_OverQueries(), live=True, device="cpu", image_size=32)


class _SigmoidAttention(nn.Module):
    """Attention the live path cannot see (sigmoid over the scores), under `attn.qkv` (which a file reads)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.proj(torch.sigmoid(q @ k.transpose(-2, -1)) @ v)


class _Block(nn.Module):
    def __init__(self, mixer: nn.Module) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(32), mixer, nn.LayerNorm(32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _Unseen(nn.Module):
    """A ViT whose attention no route shows when `named` is False: its mixing weights carry no attention names
    (`mix.a` / `mix.b`); with `named`, a file route reads its `attn.qkv`."""

    def __init__(self, named: bool) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 32, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 32))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, 32))
        mixer: nn.Module = _SigmoidAttention() if named else nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.blocks = nn.ModuleList([_Block(copy.deepcopy(mixer)) for _ in range(2)])
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


def make_unseen_named() -> nn.Module:
    return _Unseen(named=True)


def make_unseen_plain() -> nn.Module:
    return _Unseen(named=False)


@pytest.mark.parametrize("named", [False, True])
def test_the_live_refusal_offers_the_weights_file_only_when_the_file_route_reads_it(tmp_path: Path,
                                                                                  named: bool) -> None:
    path = tmp_path / "unseen.pth"
    torch.save(_Unseen(named).state_dict(), path)
    code = tmp_path / "unseen.py"
    code.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
                    "from test_live import make_unseen_named, make_unseen_plain\n")
    factory = "make_unseen_named" if named else "make_unseen_plain"
    with pytest.raises(NoAttentionError) as refused:
        vitviz.load(path, code=f"{code}:{factory}", device="cpu")
    msg = str(refused.value)
    assert "no self-attention was seen" in msg
    if named:       # the file route reads it: the advice stands
        assert "open its weights file by itself" in msg
    else:           # the file route refuses it: said, and not offered
        file_msg = ""
        try:
            vitviz.load(path)
        except UnknownLayoutError as e:
            file_msg = str(e)
        assert "--code" in file_msg            # the file route points at the code ...
        assert "open its weights file by itself" not in msg and "without code=" in msg   # ... and this not back
        assert "no attention weights" in msg and "Next: if it is a Vision Transformer" in msg


# ----------------------------------------------------------------------------- 3. nn.Sequential (zuppichini)
def test_an_nn_sequential_vit_file_is_refused_as_one_and_its_code_opens_it(tmp_path: Path) -> None:
    net = _built(make_zuppichini)
    path = tmp_path / "vit.pth"
    torch.save(net.state_dict(), path)
    with pytest.raises(UnknownLayoutError) as refused:
        vitviz.load(path)
    msg = str(refused.value)
    assert "keys start with numbers because the model is an nn.Sequential" in msg
    assert "0: 0.cls_token" in msg and "1: 1.0.0.fn.0.weight" in msg
    assert "Next: open it with its own code" in msg and "--code FILE.py:FACTORY" in msg
    assert ".0 comes before any attention" not in msg
    # the route it gives: exact (the softmax's probabilities; its division by sqrt(D) afterwards is said)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vm = vitviz.load(path, code=_code_file(tmp_path, "make_zuppichini"), device="cpu")
    assert any("not the weights the module applies" in str(w.message) for w in caught)

    def softmax(m: nn.Module) -> torch.Tensor:
        qkv = rearrange(m.qkv(m.seen), "b n (h d qkv) -> (qkv) b h n d", h=m.num_heads, qkv=3)
        return torch.softmax(qkv[0] @ qkv[1].transpose(-2, -1), -1)

    hooks = [m.register_forward_pre_hook(lambda m, a: setattr(m, "seen", a[0])) for m in net.modules()
             if isinstance(m, ZupMultiHeadAttention)]
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    try:
        out, maps = _own_maps(net, ZupMultiHeadAttention, softmax, x)
    finally:
        for h in hooks:
            h.remove()
    attn, logits = vm.forward_captured(x)
    _same(attn[0], maps)
    np.testing.assert_allclose(logits, out.numpy(), atol=1e-5)


# ---------------------------------------------------------------------------- user code's process-wide state (issue 34)

def _probe_env() -> str | None:
    return os.environ.get("VITVIZ_ANSWERS")


LEAKS = {   # what the user's code runs -> what reads the state it changes (equal before and after)
    "device": ("torch.set_default_device('meta')", lambda: __import__("torch").get_default_device().type),
    "dtype": ("torch.set_default_dtype(torch.float64)", lambda: __import__("torch").get_default_dtype()),
    "grad": ("torch.set_grad_enabled(False)", lambda: __import__("torch").is_grad_enabled()),
    "seed": ("torch.manual_seed(1234)", lambda: __import__("torch").get_rng_state().sum().item()),
    "threads": ("torch.set_num_threads(1)", lambda: __import__("torch").get_num_threads()),
    "deterministic": ("torch.use_deterministic_algorithms(True)",
                      lambda: __import__("torch").are_deterministic_algorithms_enabled()),
    "precision": ("torch.set_float32_matmul_precision('medium')",
                  lambda: __import__("torch").get_float32_matmul_precision()),
    "anomaly": ("torch.autograd.set_detect_anomaly(True)", lambda: __import__("torch").is_anomaly_enabled()),
    "warnings": ("import warnings; warnings.simplefilter('ignore')", lambda: list(__import__("warnings").filters)),
    "cwd": ("import os; os.chdir('/')", os.getcwd),
    "recursion": ("import sys; sys.setrecursionlimit(200)", lambda: __import__("sys").getrecursionlimit()),
    "numpy": ("import numpy; numpy.seterr(all='raise')", lambda: np.geterr()),
    "sigint": ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)",
               lambda: __import__("signal").getsignal(__import__("signal").SIGINT)),
    "stderr": ("import sys, io; sys.stderr = io.StringIO()", lambda: id(__import__("sys").stderr)),
    "env": ("import os; os.environ['VITVIZ_ANSWERS'] = '/dev/zero'", _probe_env),
}


@pytest.mark.parametrize("leak", sorted(LEAKS))
@pytest.mark.parametrize("where", ["module", "factory", "forward"])
def test_user_code_does_not_leak_process_state_into_vitviz(leak: str, where: str, tmp_path: Path, demo) -> None:
    """A --code file that changes torch's or Python's process-wide state at import, in its factory or in its
    forward: after vitviz ran it, the state is what it was (so the demo runs and verifies as before: a float64
    default made the verification differ, a meta default device made the next load fail)."""
    import sys
    import warnings

    statement, probe = LEAKS[leak]
    code = tmp_path / f"leaky_{where}.py"
    body = {"module": f"{statement}\n", "factory": "", "forward": ""}[where]
    code.write_text(
        "import torch\nimport sys\nsys.path.insert(0, %r)\nfrom misbehaving_code import TinyViT\n%s\n"
        "class Leaky(TinyViT):\n"
        "    def forward(self, x):\n"
        "        %s\n"
        "        return super().forward(x)\n\n"
        "def make():\n"
        "    %s\n"
        "    return Leaky()\n" % (str(TESTS), body,
                                  statement if where == "forward" else "pass",
                                  statement if where == "factory" else "pass"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        before = probe()
        try:
            model = vitviz.load(None, code=f"{code}:make", device="cpu")
            model.run(np.zeros((32, 32, 3), np.uint8))
        except VitvizError as e:   # a model built on 'meta' by its factory, or a forward making meta tensors
            assert leak == "device" and where != "module", e
            assert "meta" in str(e)
        assert probe() == before, leak
    sys.modules.pop("misbehaving_code", None)
    result = demo.run(np.zeros((64, 64, 3), np.uint8))
    assert result.attentions.dtype == np.float32 and np.isfinite(result.attentions).all()


def test_a_float64_default_from_user_code_does_not_make_verify_differ(tmp_path: Path, demo) -> None:
    import warnings

    code = tmp_path / "f64.py"
    code.write_text("import sys, torch\nsys.path.insert(0, %r)\nfrom misbehaving_code import TinyViT\n\n"
                    "def make():\n    torch.set_default_dtype(torch.float64)\n    return TinyViT()\n"
                    % str(TESTS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vitviz.load(None, code=f"{code}:make", device="cpu")
    check = vitviz.verify(demo)
    assert check.verdict == "verified", check.summary()
