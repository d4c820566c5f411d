"""The live-module path (vitviz.core.running.live): any nn.Module run as written, its attention captured exactly.

Parity: every layer's per-head attention against the eager attention of the original implementation (atol 1e-5,
float32), and the output the capture returns against the module's own forward -- identical where the module's
own forward is what runs, and within 1e-5 where PyTorch's fused fast path (which the capture turns off) would have
run instead. Mechanisms: explicit softmax (vit-pytorch), nn.MultiheadAttention with need_weights=False
(nn.TransformerEncoder, open_clip 3.x, torchvision), F.scaled_dot_product_attention (timm fused, transformers
sdpa, open_clip's own Attention, a hand-written module with masks, a scale, is_causal and GQA).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitviz
from vitviz.core.running.live import (
    MHA, SDPA, SOFTMAX, LiveModel, LiveModelError, NoAttentionError, UserCodeError, sdpa_probabilities,
)

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
