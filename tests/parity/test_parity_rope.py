"""Parity for RoPE ViTs: timm's `Eva` (DINOv3, EVA-02 incl. the CLIP tower, Perception Encoder with its MAP head,
Naver RoPE-ViT axial / mixed, timm's rope reg gap), the original DINOv3 layout and transformers' DINOv3.

2-D RoPE turns the patch tokens' q and k (prefix tokens untouched); the tests compare features, every layer's
per-head attention (and the MAP head's) with the original's eager path at 1e-5, at the native grid and at another
one, up to T = 1370 tokens. A DINOv3 state dict must never open as a plain ViT without positions; a file that
could be RoPE and names nothing is refused, naming `rope=`. `rope_kernel` is checked against the rotation the
model applies.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from parity_towers import timm_pool_reference
from vitviz.core.posembed import kernel_at, rope_kernel, rope_kernels, rotate
from vitviz.core.spec import GuessWarning
from vitviz.errors import VitvizError

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5
TINY = dict(embed_dim=64, num_heads=4, depth=2)


def x_for(h: int, w: int) -> torch.Tensor:
    return torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(1))


def quiet_load(path, **kw):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=GuessWarning, message=".*preprocess")
        return vitviz.load(path, device="cpu", **kw)


def check(result, out: torch.Tensor, maps: list[torch.Tensor], pool: torch.Tensor | None = None) -> None:
    got = result.features if result.logits.size == 0 else result.logits
    np.testing.assert_allclose(got, out[0].numpy(), atol=ATOL)
    assert result.attentions.shape[0] == len(maps)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(result.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    if pool is not None:
        np.testing.assert_allclose(result.pool_attention, pool[0].numpy(), atol=ATOL)


# arch -> (extra model args, expected family, rope kind, pooling)
ARCHS = {
    "vit_small_patch16_dinov3": (dict(), "dinov3", "dinov3", "avg"),
    "vit_small_patch16_dinov3_qkvb": (dict(), "dinov3", "dinov3", "avg"),
    "vit_small_plus_patch16_dinov3": (dict(), "dinov3", "dinov3", "avg"),
    "eva02_tiny_patch14_224": (dict(img_size=56), "eva02", "axial", "avg"),
    "eva02_base_patch14_224": (dict(img_size=56), "eva02", "axial", "avg"),
    "eva02_base_patch16_clip_224": (dict(img_size=64), "eva02", "axial", "token"),
    "vit_pe_core_base_patch16_224": (dict(img_size=64, attn_pool_num_heads=2), "pe", "axial", "map"),
    "vit_small_patch16_rope_224": (dict(img_size=64), "rope_vit", "axial", "token"),
    "vit_small_patch16_rope_mixed_224": (dict(img_size=64), "rope_vit", "mixed", "token"),
    "vit_small_patch16_rope_mixed_ape_224": (dict(img_size=64), "rope_vit", "mixed", "token"),
    "vit_base_patch16_rope_reg1_gap_256": (dict(img_size=64), "timm_rope", "axial", "avg"),
}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_timm_eva_hub_folders(tmp_path, arch: str) -> None:
    extra, family, kind, pooling = ARCHS[arch]
    args = dict(TINY, **extra)
    model = perturb(timm.create_model(arch, pretrained=False, num_classes=0, dynamic_img_size=True, **args))
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=args, safe_serialization=True)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert (s.family, s.rope, s.pooling, s.num_heads) == (family, kind, pooling, 4)
    assert s.source_of("rope").startswith(("metadata", "shape")) and not s.guesses
    assert s.position_kind == ("learned+rope" if s.pos_embed else "rope")
    p = s.patch_size
    for gh, gw in [(4, 4), (5, 3)]:  # the native grid and another one (RoPE tables recomputed, tables resampled)
        x = x_for(gh * p, gw * p)
        out, maps, pool = timm_pool_reference(model, x)
        check(vm.run(x), out, maps, pool)


def test_dinov3_state_dict_is_not_a_plain_vit(tmp_path) -> None:
    """The bug this family fixes: a timm DINOv3 state dict used to open as a plain ViT with registers and no
    positions (off by 0.58). Now its layout is read as DINOv3's, said loudly as a guess, and the maps are exact."""
    model = perturb(timm.create_model("vit_small_patch16_dinov3", pretrained=False, num_classes=0,
                                      global_pool="token", **TINY))
    torch.save(model.state_dict(), tmp_path / "dinov3_vits16.pth")
    with pytest.warns(GuessWarning, match="rope = dinov3 is a guess"):
        vm = vitviz.load(tmp_path / "dinov3_vits16.pth", device="cpu", heads=4)
    s = vm.spec
    assert s.rope == "dinov3" and s.rope_half and s.rope_theta == 100.0 and s.eps == 1e-5
    assert s.prefix_names == ("cls", "reg0", "reg1", "reg2", "reg3") and s.pooling == "token"
    for size in [(64, 64), (48, 80)]:
        x = x_for(*size)
        out, maps, _ = timm_pool_reference(model, x)
        check(vm.run(x), out, maps)


def test_unidentified_rope_is_refused_and_the_override_opens_it(tmp_path) -> None:
    model = perturb(timm.create_model("vit_small_patch16_rope_224", pretrained=False, num_classes=0, img_size=64,
                                      dynamic_img_size=True, **TINY))
    torch.save(model.state_dict(), tmp_path / "rope_vit.pth")
    with pytest.raises(VitvizError, match=r"RoPE.*'rope_vit'.*--rope NAME"):
        vitviz.load(tmp_path / "rope_vit.pth", device="cpu", heads=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        vm = vitviz.load(tmp_path / "rope_vit.pth", device="cpu", heads=4, rope="rope_vit", image_size=64)
    assert vm.spec.rope == "axial" and vm.spec.source_of("rope") == "override: rope='rope_vit'"
    x = x_for(64, 48)
    out, maps, _ = timm_pool_reference(model, x)
    check(vm.run(x), out, maps)


def original_dinov3_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A timm DINOv3 model in facebookresearch/dinov3's own layout (timm's `checkpoint_filter_fn` read backwards):
    storage_tokens, ls1.gamma, qkv.bias with a k part the mask zeroes, bias_mask, rope_embed.periods, mask_token,
    SwiGLU w1 / w2 / w3."""
    g = torch.Generator().manual_seed(4)
    sd: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        if k.endswith(".attn.q_bias"):
            q, vb = v, model.state_dict()[k.replace("q_bias", "v_bias")]
            sd[k.replace("q_bias", "qkv.bias")] = torch.cat([q, torch.randn(q.shape, generator=g), vb])
            sd[k.replace("q_bias", "qkv.bias_mask")] = torch.cat([torch.ones_like(q), torch.zeros_like(q),
                                                                   torch.ones_like(q)])
            continue
        if k.endswith(".attn.v_bias"):
            continue
        k = k.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma").replace("reg_token", "storage_tokens")
        k = k.replace("mlp.fc1_g", "mlp.w1").replace("mlp.fc1_x", "mlp.w2")
        if ".mlp.fc2." in k and any(".fc1_g." in n for n in model.state_dict()):
            k = k.replace("mlp.fc2", "mlp.w3")
        sd[k] = v
    sd["rope_embed.periods"] = model.rope.periods.clone()
    sd["mask_token"] = torch.zeros(1, model.embed_dim)
    return sd


@pytest.mark.parametrize("arch", ["vit_small_patch16_dinov3_qkvb", "vit_small_plus_patch16_dinov3_qkvb"])
def test_original_dinov3_layout(tmp_path, arch: str) -> None:
    from timm.models.eva import checkpoint_filter_fn

    model = perturb(timm.create_model(arch, pretrained=False, num_classes=0, global_pool="token",
                                      dynamic_img_size=True, **TINY))
    sd = original_dinov3_state_dict(model)
    torch.save(sd, tmp_path / "dinov3_vits16_pretrain_lvd1689m-08c60483.pth")
    oracle = timm.create_model(arch, pretrained=False, num_classes=0, global_pool="token", dynamic_img_size=True,
                               **TINY).eval()
    oracle.load_state_dict(checkpoint_filter_fn(dict(sd), oracle))  # timm's own conversion of the original
    vm = quiet_load(tmp_path / "dinov3_vits16_pretrain_lvd1689m-08c60483.pth", heads=4)
    s = vm.spec
    assert s.family == "dinov3" and s.rope == "dinov3" and s.rope_periods and s.source_of("rope_periods") != \
        s.source_of("rope")   # the periods are read from the file
    # nothing names this file (random weights under the release's name: its hash does not match), so the
    # settings the facebookresearch layout implies are assumptions, said; the head count is the caller's
    assert not s.named and "num_heads" not in dict(s.guesses)
    assert {k for k, _ in s.guesses} <= {"rope", "eps", "mlp_kind", "attn_scale", "block_norm", "pooling",
                                         "image_size", "pos_grid", "preprocess"}
    assert "mask_token" in vm.dropped and any(k.endswith("bias_mask") for k in vm.dropped)
    for size in [(64, 64), (80, 48)]:
        x = x_for(*size)
        out, maps, _ = timm_pool_reference(oracle, x)
        check(vm.run(x), out, maps)


@pytest.mark.parametrize("gated", [False, True])
def test_hf_dinov3(tmp_path, gated: bool) -> None:
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    model = perturb(DINOv3ViTModel(DINOv3ViTConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
        patch_size=8, num_register_tokens=2, use_gated_mlp=gated, hidden_act="silu" if gated else "gelu",
        attn_implementation="eager")))
    model.save_pretrained(tmp_path)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert s.family == "hf-dinov3" and s.rope == "dinov3" and s.prefix_names == ("cls", "reg0", "reg1")
    assert s.mlp_kind == ("swiglu" if gated else "gelu")
    for size in [(32, 32), (40, 56)]:
        x = x_for(*size)
        with torch.no_grad():
            o = model(pixel_values=x, output_attentions=True)
        check(vm.run(x), o.pooler_output, list(o.attentions))


def test_large_input_1370_tokens(tmp_path) -> None:
    """518 px at patch 14: 37 x 37 patches + CLS = 1370 tokens, RoPE and the learned table both resampled."""
    model = perturb(timm.create_model("eva02_tiny_patch14_224", pretrained=False, num_classes=0, img_size=56,
                                      dynamic_img_size=True, embed_dim=32, num_heads=2, depth=1))
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=dict(img_size=56, embed_dim=32, num_heads=2,
                                                                        depth=1))
    vm = quiet_load(tmp_path)
    x = x_for(518, 518)
    out, maps, _ = timm_pool_reference(model, x)
    r = vm.run(x)
    assert r.attentions.shape == (1, 2, 1370, 1370)
    check(r, out, maps)


# ------------------------------------------------------------------------------------------------ rope_kernel
@pytest.mark.parametrize("arch", ["vit_small_patch16_dinov3", "eva02_tiny_patch14_224",
                                  "vit_small_patch16_rope_mixed_224"])
def test_rope_kernel_is_the_rotation_the_model_applies(tmp_path, arch: str) -> None:
    """kernel[dy + gh - 1, dx + gw - 1] = q·k of one content vector placed at two patches d apart, through the
    model's own RoPE tables: for a vector whose every rotation pair is (1, 0) / sqrt(hd/2), that score is the mean
    over pairs of cos(angle difference)."""
    extra = ARCHS[arch][0]
    args = dict(TINY, **extra)
    model = perturb(timm.create_model(arch, pretrained=False, num_classes=0, **args))
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=args)
    vm = quiet_load(tmp_path)
    spec, hd = vm.spec, vm.spec.head_dim
    grid = (3, 5)
    sin, cos = vm.net.rope.tables(grid, torch.device("cpu"))
    if spec.rope == "mixed":
        sin, cos = sin[1], cos[1]  # layer 1: (H, N, hd)
    content = torch.zeros(hd)
    content[: hd // 2] = 1.0 if spec.rope_half else 0.0
    if not spec.rope_half:
        content[0::2] = 1.0
    content /= math.sqrt(hd // 2)
    turned = rotate(content.expand(*sin.shape[:-1], hd), sin, cos, spec.rope_half)  # (..., N, hd)
    scores = turned @ turned.transpose(-2, -1)  # (..., N, N): query patch -> key patch
    for head in ([0, 3] if spec.rope == "mixed" else [None]):
        k = rope_kernel(vm, grid, head=head, layer=1)
        assert k.shape == (5, 9) and abs(k[2, 4] - 1.0) < 1e-6
        s = scores[head] if head is not None else scores
        for q in (0, 7, 14):
            r, c = divmod(q, grid[1])
            np.testing.assert_allclose(kernel_at(k, grid, (r, c)).ravel(), s[q].numpy(), atol=1e-5)
    stack = rope_kernels(vm, grid)         # what the window's RoPE panel is given: one kernel, or one per layer/head
    assert stack.shape == ((spec.depth, spec.num_heads) if spec.rope == "mixed" else (1, 1)) + (5, 9)
    np.testing.assert_allclose(stack[1, 3] if spec.rope == "mixed" else stack[0, 0],
                               rope_kernel(vm, grid, head=3, layer=1), atol=1e-6)
    if spec.rope != "mixed":
        np.testing.assert_allclose(k, k[::-1, ::-1], atol=1e-6)  # cos is even: K(-d) = K(d)


def test_rope_kernel_refuses_models_without_rope() -> None:
    model = perturb(timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32,
                                      patch_size=8, depth=1))
    vm = quiet_load(model.state_dict())
    assert vm.spec.position_kind == "learned"
    with pytest.raises(ValueError, match="no rotary"):
        rope_kernel(vm)


def test_info_of_a_rope_model_without_a_table(tmp_path, capsys) -> None:
    """`vitviz info` as a user reads it: no table, so no 'pos_kind learned' line, and the input size says it came
    from the family's native grid, not from a position table the file does not have."""
    from vitviz.cli import main

    model = timm.create_model("vit_small_patch16_dinov3", pretrained=False, num_classes=0, global_pool="token", **TINY)
    torch.save(model.state_dict(), tmp_path / "dinov3_vits16.pth")
    assert main(["info", str(tmp_path / "dinov3_vits16.pth"), "--heads", "4"]) == 0
    out = capsys.readouterr().out
    assert "!! GUESSED rope = dinov3" in out
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line.strip()}
    assert "pos_kind" not in lines and "rope" in lines["positions"]
    assert "position embedding grid" not in lines["image_size"] and "native grid" in lines["image_size"]

