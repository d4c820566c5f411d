"""Parity for Swin v1 / v2: torchvision `SwinTransformer` (state dicts), timm `swin_*` / `swinv2_*` (hub folders with
config.json, bare state dicts, and the original microsoft/Swin-Transformer layout), transformers `SwinModel` /
`Swinv2Model` / classifiers (save_pretrained).

Each original is tiny (3 stages of 2 blocks, 4x4 windows, 4 px patches, 64 px native) with random weights, and is
compared with vitviz's windowed reference model on the class scores (or pooled features) and on every block's
per-window, per-head attention, read from the original's own eager softmax, at the native size and at sizes where
the windows are padded, the shift is dropped along one side, and (transformers v1) the original refuses to run.
"""
from __future__ import annotations

import json
import warnings
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vitviz
from parity_refs import perturb, recorded_forward
from vitviz.core.spec import GuessWarning

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

ATOL_ATTN, ATOL_OUT = 1e-5, 1e-4
SIZES = [(64, 64), (80, 64), (44, 52)]   # native; a padded, one-side-unshifted last stage; an odd-sided grid
DEPTHS, HEADS = (2, 2, 2), (1, 2, 2)


def x_for(size: tuple[int, int]) -> torch.Tensor:
    return torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))


def quiet_load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        return vitviz.load(path, device="cpu", **kw)


def check(result, out: torch.Tensor, maps: list[torch.Tensor]) -> float:
    """Outputs within 1e-4 and every block's attention within 1e-5; returns the largest attention difference."""
    got = result.features if result.logits.size == 0 else result.logits
    np.testing.assert_allclose(got, out[0].numpy(), atol=ATOL_OUT)
    assert len(result.blocks) == len(maps)
    worst = 0.0
    for i, (mine, ref) in enumerate(zip(result.blocks, maps)):
        ref = ref.numpy().reshape(mine.shape)          # (B * windows, H, n, n) -> (windows, H, n, n)
        np.testing.assert_allclose(mine, ref, atol=ATOL_ATTN, err_msg=f"block {i} ({result.spec_line(i)})")
        worst = max(worst, float(np.abs(mine - ref).max()))
    return worst


def module_softmax_reference(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """timm: eager attention (fused off), read at each block's `attn.softmax` module."""
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    return recorded_forward(model, x, [m for name, m in model.named_modules() if name.endswith("attn.softmax")])


def functional_softmax_reference(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torchvision calls F.softmax inside `shifted_window_attention`: every call during the forward is a block's."""
    maps: list[torch.Tensor] = []
    original = F.softmax

    def record(*args, **kwargs):
        out = original(*args, **kwargs)
        maps.append(out.detach())
        return out

    with mock.patch.object(F, "softmax", record), torch.no_grad():
        out = model(x)
    return out, maps


# ---------------------------------------------------------------------------------------------------- torchvision

def torchvision_swin(v2: bool) -> torch.nn.Module:
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    extra = dict(block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2) if v2 else {}
    torch.manual_seed(0)
    return perturb(SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=list(DEPTHS), num_heads=list(HEADS),
                                   window_size=[4, 4], num_classes=5, **extra))


@pytest.mark.parametrize("v2", [False, True])
def test_torchvision_swin(tmp_path, v2: bool) -> None:
    model = torchvision_swin(v2)
    torch.save(model.state_dict(), tmp_path / "swin.pth")
    vm = quiet_load(tmp_path / "swin.pth", image_size=64)
    s = vm.spec
    assert (s.family, s.arch, s.depths, s.heads, s.dims) == ("torchvision-swin", "swinv2" if v2 else "swin", DEPTHS,
                                                             HEADS, (16, 32, 64))
    assert s.order == "pad_roll" and s.shift_rule == "fits" and s.windows == ((4, 4),) * 6
    assert s.shifts == ((0, 0), (2, 2)) * 3   # built; the last stage's are dropped at run time (4x4 grid, 4x4 window)
    assert s.kind_of("windows") == "derived" and s.kind_of("heads") == "derived"
    assumed = dict(s.assumptions)
    assert "shifts" in assumed and "order" in assumed   # an unnamed layout: torchvision's conventions are assumed
    for size in SIZES:
        result = vm.run(x_for(size))
        check(result, *functional_softmax_reference(model, x_for(size)))
    geo = vm.run(x_for((80, 64))).geometry
    assert geo[-1].shift == (2, 0) and geo[-1].padded == (8, 4)   # 5x4 grid: padded to 8 rows, no shift across


def test_torchvision_swin_named_by_file(tmp_path) -> None:
    """A file under its torchvision release name is that model: its window rule, eps and preprocessing are named."""
    model = torchvision_swin(False)
    path = tmp_path / "swin_t-704ceda3.pth"
    torch.save(model.state_dict(), path)
    vm = quiet_load(path)
    s = vm.spec
    assert s.named and s.kind_of("order") == "named" and s.kind_of("shifts") == "named"
    assert s.image_size == (224, 224) and s.preprocess.resize == 232 and s.kind_of("preprocess") == "read"
    assert s.assumptions == ()
    check(vm.run(x_for((224, 224))), *functional_softmax_reference(model, x_for((224, 224))))


# ----------------------------------------------------------------------------------------------------------- timm

def timm_swin(v2: bool) -> tuple[torch.nn.Module, dict]:
    kw = dict(img_size=64, embed_dim=16, depths=DEPTHS, num_heads=HEADS, window_size=4, num_classes=5)
    arch = "swinv2_tiny_window8_256" if v2 else "swin_tiny_patch4_window7_224"
    torch.manual_seed(0)
    # strict_img_size=False: timm builds the shift masks at each run, so the original runs at other sizes too
    return perturb(timm.create_model(arch, pretrained=False, strict_img_size=False, **kw)), kw


@pytest.mark.parametrize("v2", [False, True])
def test_timm_swin_hub_folder(tmp_path, v2: bool) -> None:
    from timm.models import save_for_hf

    model, kw = timm_swin(v2)
    save_for_hf(model, str(tmp_path), safe_serialization=True, model_args=kw)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert s.family == "timm-swin" and s.named and s.assumptions == ()
    assert s.order == "roll_pad" and s.shift_rule == "built" and s.image_size == (64, 64)
    assert s.shifts[-1] == (0, 0)   # timm drops the shift where the native grid (4x4) fits one window
    if v2:
        assert s.kind_of("windows") == "read" and s.block_norm == "res_post" and s.merge_norm == "after"
    for size in SIZES:
        check(vm.run(x_for(size)), *module_softmax_reference(model, x_for(size)))


@pytest.mark.parametrize("v2", [False, True])
def test_timm_swin_state_dict(tmp_path, v2: bool) -> None:
    """A bare state dict: v1's windows are in its bias tables, v2's in no tensor (a guess until window= is passed);
    the native size decides which blocks timm built without a shift, so it is assumed until image_size= says it."""
    model, _ = timm_swin(v2)
    torch.save(model.state_dict(), tmp_path / "swin.pth")
    bare = quiet_load(tmp_path / "swin.pth")
    assumed = dict(bare.spec.assumptions)
    assert "image_size" in assumed and "shifts" in assumed
    assert ("windows" in assumed) == v2 and (bare.spec.source_of("windows").startswith("guess") == v2)
    with pytest.warns(GuessWarning, match="image_size"):
        vitviz.load(tmp_path / "swin.pth", device="cpu")
    vm = quiet_load(tmp_path / "swin.pth", image_size=64, **({"window": 4} if v2 else {}))
    assert vm.spec.kind_of("windows") == ("given" if v2 else "derived")
    for size in SIZES:
        check(vm.run(x_for(size)), *module_softmax_reference(model, x_for(size)))


def to_microsoft(sd: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """timm's Swin v1 keys back to microsoft/Swin-Transformer's: each merging at the end of the stage before it,
    `head.weight`, the index and mask buffers stored."""
    out = {}
    for k, v in sd.items():
        if ".downsample." in k:
            s = int(k.split(".")[1])
            k = k.replace(f"layers.{s}.downsample", f"layers.{s - 1}.downsample")
        out[k.replace("head.fc.", "head.")] = v
    for name, m in model.named_modules():
        if hasattr(m, "relative_position_index"):
            out[f"{name}.relative_position_index"] = m.relative_position_index
        if getattr(m, "attn_mask", None) is not None:
            out[f"{name}.attn_mask"] = m.attn_mask
    return out


def test_microsoft_swin_checkpoint(tmp_path) -> None:
    model, _ = timm_swin(False)
    torch.save({"model": to_microsoft(model.state_dict(), model)}, tmp_path / "swin_tiny_patch4_window7_224.pth")
    vm = quiet_load(tmp_path / "swin_tiny_patch4_window7_224.pth", image_size=64)
    assert vm.spec.family == "swin" and vm.spec.windows == ((4, 4),) * 6
    assert any(k.endswith("relative_position_index") for k in vm.dropped)   # recomputed, never loaded
    for size in SIZES[:2]:
        check(vm.run(x_for(size)), *module_softmax_reference(model, x_for(size)))


# --------------------------------------------------------------------------------------------------- transformers

def hf_swin(v2: bool) -> torch.nn.Module:
    from transformers import SwinConfig, SwinForImageClassification, Swinv2Config, Swinv2Model

    c = dict(image_size=64, patch_size=4, embed_dim=16, depths=list(DEPTHS), num_heads=list(HEADS), window_size=4,
             attn_implementation="eager")
    torch.manual_seed(0)
    return perturb(Swinv2Model(Swinv2Config(**c)) if v2 else SwinForImageClassification(SwinConfig(**c, num_labels=3)))


def hf_reference(model: torch.nn.Module, x: torch.Tensor, v2: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Every block's attention weights, from its attention module's output (eager attention)."""
    from transformers.models.swin.modeling_swin import SwinAttention
    from transformers.models.swinv2.modeling_swinv2 import Swinv2SelfAttention

    kind = Swinv2SelfAttention if v2 else SwinAttention
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: maps.append(o[1].detach()))
             for m in model.modules() if isinstance(m, kind)]
    try:
        with torch.no_grad():
            o = model(pixel_values=x, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    return (o.pooler_output if v2 else o.logits), maps


@pytest.mark.parametrize("v2", [False, True])
def test_hf_swin(tmp_path, v2: bool) -> None:
    model = hf_swin(v2)
    model.save_pretrained(tmp_path)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert s.family == "hf-swin" and s.named and s.assumptions == ()
    assert s.shift_rule == ("built" if v2 else "min_side") and s.mask_value == (-200.0 if v2 else -100.0)
    sizes = SIZES[:2] + ([(48, 56)] if v2 else [])
    for size in sizes:
        fresh = hf_swin(v2)   # transformers' Swin v1 keeps a shift it dropped once: a new original per size
        fresh.load_state_dict(model.state_dict())
        check(vm.run(x_for(size)), *hf_reference(fresh, x_for(size), v2))
    if not v2:  # a 3x4 last stage under a 4x4 window: transformers' Swin fails, vitviz says why instead
        with pytest.raises(RuntimeError):
            hf_reference(model, x_for((48, 56)), v2)
        with pytest.raises(vitviz.VitvizError, match="cannot run that size"):
            vm.run(x_for((48, 56)))


def test_hf_swin_labels_and_config(tmp_path) -> None:
    model = hf_swin(False)
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "swin"
    vm = quiet_load(tmp_path)
    assert len(vm.spec.labels) == 3 and vm.spec.kind_of("labels") == "read"
    assert vm.spec.eps == cfg["layer_norm_eps"] and vm.spec.kind_of("eps") == "read"


def test_plain_vit_detection_is_unchanged(tiny_ckpt) -> None:
    """The windowed readers come first in the registry; a plain ViT is still the timm family's."""
    from vitviz.core.reading.checkpoint import read_checkpoint
    from vitviz.core.reading.families import detect

    raw = read_checkpoint(tiny_ckpt)
    assert detect(set(raw.tensors), raw) == "timm"


def test_hf_swin_absolute_positions(tmp_path) -> None:
    """transformers' optional absolute position table, resampled bicubically at another size as
    `interpolate_pos_encoding=True` does."""
    from transformers import SwinConfig, SwinModel

    torch.manual_seed(0)
    model = perturb(SwinModel(SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[1, 2],
                                         window_size=4, attn_implementation="eager", use_absolute_embeddings=True)))
    model.save_pretrained(tmp_path)
    vm = quiet_load(tmp_path)
    assert vm.spec.pos_embed and vm.spec.pos_grid == (16, 16) and vm.spec.assumptions == ()
    for size in [(64, 64), (80, 80)]:
        with torch.no_grad():
            o = model(pixel_values=x_for(size), interpolate_pos_encoding=size != (64, 64))
        np.testing.assert_allclose(vm.run(x_for(size)).features, o.pooler_output[0].numpy(), atol=ATOL_OUT)


def test_a_swin_training_checkpoint_with_two_models_says_which_it_took(tmp_path) -> None:
    """model + model_ema (Swin's own train script saves both): the weights taken are an assumption, said with the
    nest_key= that takes the others, as for a plain ViT -- not a silent pick."""
    model, ema = torchvision_swin(False), perturb(torchvision_swin(False), seed=3)
    torch.save({"model": model.state_dict(), "model_ema": ema.state_dict(), "epoch": 7}, tmp_path / "ckpt.pth")
    with pytest.warns(GuessWarning, match="nest_key is assumed: the weights under 'model_ema'.*under 'model'"):
        vm = vitviz.load(tmp_path / "ckpt.pth", image_size=64)
    assert vm.spec.kind_of("nest_key") == "assumed" and "nest_key" in dict(vm.spec.assumptions)
    check(vm.run(x_for((64, 64))), *functional_softmax_reference(ema, x_for((64, 64))))
    assumed = dict(vm.spec.assumptions)   # and a field no option of a windowed model sets says a config
    assert "pooling" in assumed and "pass pooling=" not in vm.spec.describe_guess("pooling")
    given = quiet_load(tmp_path / "ckpt.pth", image_size=64, nest_key="model")
    assert "nest_key" not in dict(given.spec.assumptions)
    check(given.run(x_for((64, 64))), *functional_softmax_reference(model, x_for((64, 64))))
