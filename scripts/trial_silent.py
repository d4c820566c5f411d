"""Trial: open checkpoint files nobody here made before, the ways users have them, and hunt silent wrongness.

Each case builds a random-init (perturbed) model with its original library (timm, transformers, open_clip,
vit-pytorch, torchvision -- no network, configs in code), saves it as users do (bare state dict, safetensors,
training checkpoint, EMA, hub folder with config.json), opens it with `vitviz.load`, and compares every layer's
per-head attention (and the logits / features where comparable) with the original's own eager attention.

Each file is classified:
    exact    max |d attn| (and |d out|) < 1e-4
    said     differs, and a field vitviz lists as assumed (spec.assumptions, GuessWarning) explains it
    SILENT   differs, and nothing numeric is said (the bug class)
    refused  a VitvizError that names the file and what it expected
    crash    a traceback / unexpected exception (or vitviz's "please report this file's layout" wrapper)

    python scripts/trial_silent.py            # the table and the counts
    python scripts/trial_silent.py -k timm    # only cases whose name contains 'timm'
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import vitviz  # noqa: E402
from vitviz.errors import VitvizError  # noqa: E402

TOL = 1e-4
Ref = tuple["torch.Tensor | None", "list[torch.Tensor]"]


def perturb(model: nn.Module, std: float = 0.05, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def x_for(h: int = 32, w: int = 32, c: int = 3) -> torch.Tensor:
    return torch.randn(1, c, h, w, generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------------------------------------------ references
def timm_ref(model: nn.Module, x: torch.Tensor) -> Ref:
    """timm unfused: the softmax where it enters each block's `attn.attn_drop`."""
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    return _outputs_of(model, x, lambda n: n.startswith("blocks.") and n.endswith("attn.attn_drop"))


def _outputs_of(model: nn.Module, x: torch.Tensor, named: Callable[[str], bool]) -> Ref:
    """The model's output and the output of every module whose name `named` accepts, in call order."""
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda mod, i, o: maps.append(o.detach()))
             for n, m in model.named_modules() if named(n)]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    return out, maps


def mha_ref(model: nn.Module, x: torch.Tensor, call: Callable | None = None) -> Ref:
    """Every nn.MultiheadAttention asked for its per-head weights (torchvision, open_clip, CLIP)."""
    maps: list[torch.Tensor] = []
    saved = []
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            orig = m.forward
            saved.append((m, orig))

            def fwd(q, k, v, *a, _orig=orig, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
                kw["need_weights"] = True
                kw["average_attn_weights"] = False
                o, w = _orig(q, k, v, *a, **kw)
                maps.append(w.detach())
                return o, w
            m.forward = fwd
    try:
        with torch.no_grad():
            out = (call or model)(x)
    finally:
        for m, orig in saved:
            m.forward = orig
    return out, maps


def softmax_ref(model: nn.Module, x: torch.Tensor, suffix: str = "attend") -> Ref:
    """vit-pytorch: the output of each attention's `attend` (nn.Softmax)."""
    return _outputs_of(model, x, lambda n: n.endswith(suffix))


def hf_ref(model: nn.Module, x: torch.Tensor, out: str = "logits") -> Ref:
    with torch.no_grad():
        o = model(pixel_values=x, output_attentions=True)
    if out == "logits":
        y = o.logits
    elif out == "cls":  # a ViTModel's CLS output (vitviz drops the pooler: model.dropped)
        y = o.last_hidden_state[:, 0]
    elif out == "image_embeds":
        y = o.image_embeds
    else:
        y = None
    return y, list(o.attentions)


# ------------------------------------------------------------------------------------------------ savers
def sd_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def save_pth(model: nn.Module, d: Path, name: str = "model.pth") -> Path:
    torch.save(sd_of(model), d / name)
    return d / name


def save_safe(model: nn.Module, d: Path, name: str = "model.safetensors") -> Path:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd_of(model).items()}, str(d / name))
    return d / name


def save_train(model: nn.Module, d: Path, key: str = "model", prefix: str = "", extra: dict | None = None,
               name: str = "checkpoint.pth") -> Path:
    torch.save({key: {prefix + k: v for k, v in sd_of(model).items()}, "epoch": 3, **(extra or {})}, d / name)
    return d / name


def save_ema(model: nn.Module, d: Path, other: nn.Module) -> Path:
    """timm's training checkpoint: `state_dict` (the other model) and `state_dict_ema` (this one)."""
    torch.save({"epoch": 3, "state_dict": sd_of(other), "state_dict_ema": sd_of(model)}, d / "last.pth.tar")
    return d / "last.pth.tar"


def save_timm_hub(model: nn.Module, d: Path, model_args: dict, safe: bool = True) -> Path:
    import timm
    timm.models._hub.save_for_hf(model, str(d), model_args=model_args, safe_serialization=safe)
    return d


def save_hf(model: nn.Module, d: Path) -> Path:
    model.save_pretrained(str(d), safe_serialization=True)
    return d


# ------------------------------------------------------------------------------------------------ cases
@dataclass
class Case:
    name: str
    build: Callable[[], nn.Module]
    ref: Callable[[nn.Module, torch.Tensor], Ref]
    save: Callable[[nn.Module, Path], Path]
    load_kw: dict = field(default_factory=dict)
    x: tuple = (32, 32)            # (h, w) or (h, w, c)
    note: str = ""
    perm: Callable[[int], list[int]] | None = None   # original token index of each of vitviz's tokens
    cause: tuple[str, ...] = ()    # the spec field(s) the file's non-default setting is: only a flag on one says it


def timm_vt(**kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from timm.models.vision_transformer import VisionTransformer
        args = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)
        args.update(kw)
        torch.manual_seed(0)
        return perturb(VisionTransformer(**args))
    return build


def timm_named(arch: str, **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import timm
        args = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)
        args.update(kw)
        torch.manual_seed(0)
        return perturb(timm.create_model(arch, pretrained=False, **args))
    return build


TIMM_ARGS = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)


def hub(**extra: Any) -> Callable[[nn.Module, Path], Path]:
    args = {**TIMM_ARGS, **extra}
    args.pop("num_classes")
    return lambda m, d: save_timm_hub(m, d, args)


def timm_cases() -> list[Case]:
    H = dict(heads=4)
    cases = [
        Case("timm qkv_bias=False qk_norm (.pth)", timm_vt(qkv_bias=False, qk_norm=True), timm_ref, save_pth),
        Case("timm layerscale+reg4+no_embed_class (.safetensors)",
             timm_vt(init_values=1e-5, reg_tokens=4, no_embed_class=True), timm_ref, save_safe, H),
        Case("timm cls + global_pool=avg (fc_norm) (.pth)", timm_vt(global_pool="avg"), timm_ref, save_pth, H),
        Case("timm global_pool=avg fc_norm=False (.pth)", timm_vt(global_pool="avg", fc_norm=False), timm_ref,
             save_pth, H, cause=('pooling',)),
        Case("timm no-cls avg fc_norm=False (.pth)", timm_vt(class_token=False, global_pool="avg", fc_norm=False),
             timm_ref, save_pth, H),
        Case("timm pre_norm=True eps1e-6 (.pth)", timm_vt(pre_norm=True), timm_ref, save_pth, H, cause=('eps',)),
        Case("timm final_norm=False (.pth)", timm_vt(final_norm=False), timm_ref, save_pth, H),
        Case("timm mlp_ratio=3 gelu_tanh (.pth)", timm_vt(mlp_ratio=3.0, act_layer="gelu_tanh"), timm_ref,
             save_pth, H, cause=('mlp_kind',)),
        Case("timm act quick_gelu (.pth)", timm_vt(act_layer="quick_gelu"), timm_ref, save_pth, H, cause=('mlp_kind',)),
        Case("timm LayerNorm eps1e-5 (.pth)", timm_vt(norm_layer=partial(nn.LayerNorm, eps=1e-5)), timm_ref,
             save_pth, H, cause=('eps',)),
        Case("timm dynamic_img_size run 40x48 ({'model'})", timm_vt(dynamic_img_size=True), timm_ref,
             save_train, H, x=(40, 48)),
        Case("timm pos_embed=none (.pth)", timm_vt(pos_embed="none"), timm_ref, save_pth, H),
        Case("timm no-cls global_pool=map (.pth)", timm_vt(class_token=False, global_pool="map"), timm_ref,
             save_pth, H),
        Case("timm global_pool=max (.pth)", timm_vt(global_pool="max"), timm_ref, save_pth, H, cause=('pooling',)),
        Case("timm global_pool=avgmax (.pth)", timm_vt(global_pool="avgmax"), timm_ref, save_pth, H, cause=('pooling',)),
        Case("timm proj_bias=False (.pth)", timm_vt(proj_bias=False), timm_ref, save_pth, H),
        Case("timm scale_attn_norm+scale_mlp_norm (.pth)", timm_vt(scale_attn_norm=True, scale_mlp_norm=True),
             timm_ref, save_pth, H),
        Case("timm norm_layer=rmsnorm (.pth)", timm_vt(norm_layer="rmsnorm"), timm_ref, save_pth, H),
        Case("timm ResPostBlock (.pth)", timm_vt(block_fn=__import__("timm").models.vision_transformer.ResPostBlock),
             timm_ref, save_pth, H, cause=('block_norm',)),
        Case("timm num_classes=0 (.pth)", timm_vt(num_classes=0), timm_ref, save_pth, H),
        Case("timm avg pool_include_prefix reg2 (.pth)", timm_vt(global_pool="avg", pool_include_prefix=True,
                                                                 reg_tokens=2), timm_ref, save_pth, H, cause=('pooling',)),
        Case("timm no-cls reg4 avg (.pth)", timm_vt(class_token=False, reg_tokens=4, global_pool="avg"),
             timm_ref, save_pth, H),
        Case("timm embed_norm_layer (.pth)", timm_vt(embed_norm_layer="layernorm"), timm_ref, save_pth, H),
        Case("timm in_chans=1 (.pth)", timm_vt(in_chans=1), timm_ref, save_pth, H, x=(32, 32, 1)),
        Case("timm img 32x48 patch 4 (.pth)", timm_vt(img_size=(32, 48), patch_size=4), timm_ref, save_pth, H,
             x=(32, 48)),
        Case("timm no_embed_class dyn run 48 (.pth)", timm_vt(no_embed_class=True, dynamic_img_size=True),
             timm_ref, save_pth, H, x=(48, 48)),
        Case("timm fc_norm=True global_pool=token (.pth)", timm_vt(fc_norm=True), timm_ref, save_pth, H,
             cause=("pooling",)),
        Case("timm final_norm=False global_pool=avg (.pth)", timm_vt(final_norm=False, global_pool="avg"),
             timm_ref, save_pth, H, cause=("pooling",)),
        Case("timm bf16 safetensors", timm_vt(), lambda m, x: timm_ref(m.to(torch.bfloat16).float(), x),
             lambda m, d: (__import__("safetensors.torch").torch.save_file(
                 {k: v.to(torch.bfloat16).contiguous() for k, v in sd_of(m).items()}, str(d / "m.safetensors")),
                 d / "m.safetensors")[1], H),
        Case("timm whole pickled module torch.save(model)", timm_vt(), timm_ref,
             lambda m, d: (torch.save(m, d / "model.pt"), d / "model.pt")[1], H),
        Case("timm DDP module. prefix ({'state_dict'})", timm_vt(), timm_ref,
             partial(save_train, key="state_dict", prefix="module."), H),
        Case("timm torch.compile _orig_mod. prefix (.pth)", timm_vt(), timm_ref,
             partial(save_train, key="model", prefix="_orig_mod."), H),
        Case("timm EMA training ckpt", timm_vt(), timm_ref,
             lambda m, d: save_ema(m, d, perturb(timm_vt()(), seed=7)), H),
        Case("timm lightning {'state_dict': model.*} + hyper_parameters", timm_vt(), timm_ref,
             partial(save_train, key="state_dict", prefix="model.",
                     extra={"hyper_parameters": {"num_heads": 4, "lr": 1e-3}}, name="epoch=3.ckpt")),
        Case("timm mlp_layer=SwiGLU (unpacked) (.pth)", timm_vt(mlp_layer=__import__("timm").layers.SwiGLU,
                                                                act_layer=nn.SiLU), timm_ref, save_pth, H),
        Case("timm mlp_layer=SwiGLUPacked SiLU (.pth)", timm_vt(mlp_layer=__import__("timm").layers.SwiGLUPacked,
                                                                act_layer=nn.SiLU), timm_ref, save_pth, H),
        Case("timm mlp_layer=GluMlp GELU gate_last (.pth)", timm_vt(mlp_layer=__import__("timm").layers.GluMlp),
             timm_ref, save_pth, H, cause=('mlp_kind',)),
        Case("timm dynamic_img_pad run 36x36 (.pth)", timm_vt(dynamic_img_size=True, dynamic_img_pad=True),
             timm_ref, save_pth, H, x=(36, 36), cause=("input",)),
        Case("timm attn_layer=diff (.pth)", timm_vt(attn_layer="diff"), timm_ref, save_pth, H),
        Case("deit-style {'model','model_ema'} (ref: model)", timm_vt(), timm_ref,
             lambda m, d: (torch.save({"model": sd_of(m), "model_ema": sd_of(perturb(timm_vt()(), seed=7)),
                                       "epoch": 3}, d / "checkpoint.pth"), d / "checkpoint.pth")[1], H, cause=('nest_key',)),
        Case("{'state_dict','state_dict_ema'} (ref: state_dict)", timm_vt(), timm_ref,
             lambda m, d: save_ema(perturb(timm_vt()(), seed=7), d, m), H, cause=('nest_key',)),
        Case("dino-style {'teacher','student'} (ref: student)", timm_vt(), timm_ref,
             lambda m, d: (torch.save({"teacher": sd_of(perturb(timm_vt()(), seed=7)), "student": sd_of(m),
                                       "epoch": 3}, d / "checkpoint.pth"), d / "checkpoint.pth")[1], H, cause=('nest_key',)),
        # hub folders of registered names (config.json with architecture + model_args)
        Case("timm hub vit_relpos_small_patch16_224", timm_named("vit_relpos_small_patch16_224"), timm_ref,
             hub()),
        Case("timm hub vit_medium_patch16_gap_256", timm_named("vit_medium_patch16_gap_256"), timm_ref, hub()),
        Case("timm hub deit_tiny_distilled_patch16_224", timm_named("deit_tiny_distilled_patch16_224"),
             timm_ref, hub()),
        Case("timm hub flexivit_small", timm_named("flexivit_small"), timm_ref, hub()),
        Case("timm hub vit_betwixt_patch16_reg4_gap_256", timm_named("vit_betwixt_patch16_reg4_gap_256"),
             timm_ref, hub()),
        Case("timm bare vit_betwixt_patch16_reg4_gap_256 (.pth)", timm_named("vit_betwixt_patch16_reg4_gap_256"),
             timm_ref, save_pth, H),
        Case("timm hub vit_base_patch16_clip_quickgelu_224", timm_named("vit_base_patch16_clip_quickgelu_224"),
             timm_ref, hub()),
        Case("timm bare vit_base_patch16_clip_224 GELU (.pth)", timm_named("vit_base_patch16_clip_224"),
             timm_ref, save_pth, H, cause=('mlp_kind',)),
        Case("timm hub vit_so150m_patch16_reg4_map_256", timm_named("vit_so150m_patch16_reg4_map_256"),
             timm_ref, hub()),
        Case("timm bare vit_base_patch16_siglip_224 (.safetensors)", timm_named("vit_base_patch16_siglip_224"),
             timm_ref, save_safe, H),
        Case("timm hub vit_base_patch16_rpn_224", timm_named("vit_base_patch16_rpn_224"), timm_ref, hub()),
        Case("timm bare vit_base_patch16_rpn_224 (.pth)", timm_named("vit_base_patch16_rpn_224"), timm_ref,
             save_pth, H, cause=('block_norm',)),
        Case("timm hub vit_base_patch16_224_miil", timm_named("vit_base_patch16_224_miil"), timm_ref, hub()),
        Case("timm deit3_small {'model'}", timm_named("deit3_small_patch16_224"), timm_ref, save_train, H),
        Case("timm hub vit_little_patch16_reg1_gap_256", timm_named("vit_little_patch16_reg1_gap_256"),
             timm_ref, hub()),
        Case("timm hub vit_pwee_patch16_reg1_gap_256", timm_named("vit_pwee_patch16_reg1_gap_256"), timm_ref,
             hub()),
        Case("timm hub vit_small_patch16_224 + model_args qkv_bias=False",
             timm_named("vit_small_patch16_224", qkv_bias=False), timm_ref, hub(qkv_bias=False)),
        Case("timm hub deit3 (no_embed_class) at img 32, run 48", timm_named("deit3_small_patch16_224",
                                                                             dynamic_img_size=True),
             timm_ref, hub(dynamic_img_size=True), x=(48, 48)),
    ]
    return cases


def hf_build(cls_name: str, cfg_name: str, out: str = "logits", **cfg: Any) -> tuple[Callable, Callable]:
    def build() -> nn.Module:
        import transformers
        base = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128)
        base.update(cfg)
        config = getattr(transformers, cfg_name)(**base)
        config._attn_implementation = "eager"
        torch.manual_seed(0)
        model = getattr(transformers, cls_name)(config)
        return perturb(model)
    return build, partial(hf_ref, out=out)


def hf_cases() -> list[Case]:
    out = []

    def add(name: str, cls: str, cfg: str, save: Callable = save_hf, kw: dict | None = None, o: str = "logits",
            x: tuple = (32, 32), **c: Any) -> None:
        b, r = hf_build(cls, cfg, o, **c)
        out.append(Case(name, b, r, save, kw or {}, x, cause=("eps",) if "no config" in name else ()))

    add("hf ViT qkv_bias=False eps1e-6 gelu_new", "ViTForImageClassification", "ViTConfig", num_labels=5,
        qkv_bias=False, layer_norm_eps=1e-6, hidden_act="gelu_new")
    add("hf ViT quick_gelu eps1e-5", "ViTForImageClassification", "ViTConfig", num_labels=5,
        hidden_act="quick_gelu", layer_norm_eps=1e-5)
    for act in ("gelu_fast", "gelu_python", "mish", "gelu_accurate", "silu", "swish", "tanh", "gelu_10",
                "gelu_pytorch_tanh"):
        add(f"hf ViT hidden_act={act}", "ViTForImageClassification", "ViTConfig", num_labels=5, hidden_act=act)
    add("hf ViTModel pooler_act=relu (last_hidden_state[:, 0])", "ViTModel", "ViTConfig", o="cls",
        pooler_act="relu")
    add("hf ViT num_channels=1", "ViTForImageClassification", "ViTConfig", num_labels=5, num_channels=1,
        x=(32, 32, 1))
    add("hf ViTModel headless relu", "ViTModel", "ViTConfig", o="none", hidden_act="relu")
    add("hf ViT bare model.safetensors (no config)", "ViTForImageClassification", "ViTConfig", save=save_safe,
        kw=dict(heads=4), num_labels=5)
    add("hf ViT bare pytorch_model.bin eps1e-6 (no config)", "ViTForImageClassification", "ViTConfig",
        save=partial(save_pth, name="pytorch_model.bin"), kw=dict(heads=4), num_labels=5, layer_norm_eps=1e-6)
    add("hf DeiT WithTeacher relu", "DeiTForImageClassificationWithTeacher", "DeiTConfig", num_labels=5,
        hidden_act="relu")
    add("hf DeiT classifier eps1e-6", "DeiTForImageClassification", "DeiTConfig", num_labels=5,
        layer_norm_eps=1e-6)
    add("hf Dinov2 swiglu layerscale0.1 eps1e-5", "Dinov2Model", "Dinov2Config", o="none",
        use_swiglu_ffn=True, layerscale_value=0.1, layer_norm_eps=1e-5)
    add("hf Dinov2 gelu_new mlp_ratio2", "Dinov2Model", "Dinov2Config", o="none", hidden_act="gelu_new",
        mlp_ratio=2)
    add("hf Dinov2ForImageClassification", "Dinov2ForImageClassification", "Dinov2Config", num_labels=5)
    add("hf Dinov2 qkv_bias=False", "Dinov2Model", "Dinov2Config", o="none", qkv_bias=False)
    add("hf Dinov2WithRegisters reg2 run 48", "Dinov2WithRegistersModel", "Dinov2WithRegistersConfig",
        o="none", num_register_tokens=2, x=(48, 48))
    add("hf Dinov2WithRegisters cls", "Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersConfig",
        num_labels=5, num_register_tokens=3)
    add("hf CLIPVision gelu eps1e-6", "CLIPVisionModel", "CLIPVisionConfig", o="none", hidden_act="gelu",
        layer_norm_eps=1e-6)
    add("hf CLIPVisionWithProjection quick_gelu", "CLIPVisionModelWithProjection", "CLIPVisionConfig",
        o="image_embeds", projection_dim=16)
    add("hf SiglipVision tanh head", "SiglipVisionModel", "SiglipVisionConfig", o="none")
    add("hf SiglipVision no head gelu eps1e-5", "SiglipVisionModel", "SiglipVisionConfig", o="none",
        vision_use_head=False, hidden_act="gelu", layer_norm_eps=1e-5)
    add("hf Dinov2 bare torch.save (no config)", "Dinov2Model", "Dinov2Config", save=save_pth,
        kw=dict(heads=4), o="none")
    return out


def open_clip_build(quick_gelu: bool = True, **vision: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import open_clip
        vcfg = dict(image_size=32, patch_size=8, width=64, layers=2, head_width=16, mlp_ratio=2.0)
        vcfg.update(vision)
        tcfg = dict(context_length=8, vocab_size=50, width=32, heads=2, layers=1)
        torch.manual_seed(0)
        model = open_clip.CLIP(embed_dim=16, vision_cfg=vcfg, text_cfg=tcfg, quick_gelu=quick_gelu)
        return perturb(model)
    return build


def oc_ref(model: nn.Module, x: torch.Tensor) -> Ref:
    return mha_ref(model, x, call=model.encode_image)


def save_oc_folder(model: nn.Module, d: Path, quick_gelu: bool, vision: dict) -> Path:
    vcfg = dict(image_size=32, patch_size=8, width=64, layers=2, head_width=16, mlp_ratio=2.0)
    vcfg.update(vision)
    cfg = {"model_cfg": {"embed_dim": 16, "quick_gelu": quick_gelu, "vision_cfg": vcfg,
                         "text_cfg": dict(context_length=8, vocab_size=50, width=32, heads=2, layers=1)},
           "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073],
                              "std": [0.26862954, 0.26130258, 0.27577711]}}
    (d / "open_clip_config.json").write_text(json.dumps(cfg))
    return save_safe(model, d, "open_clip_model.safetensors")


OC_CAUSE = {"open_clip GELU bare .pt": ("mlp_kind",), "open_clip bare .pt heads not given": ("num_heads",),
            "open_clip norm_kwargs eps1e-6 folder": ("eps",),
            "open_clip act_kwargs (ignored by QuickGELU?) folder": ("mlp_kind",)}


def open_clip_cases() -> list[Case]:
    out = []
    for name, qg, vis, folder, kw in [
        ("open_clip GELU bare .pt", False, {}, False, dict(heads=4)),
        ("open_clip quickgelu folder", True, {}, True, {}),
        ("open_clip GELU folder head_width16", False, {}, True, {}),
        ("open_clip pool_type=avg folder", True, dict(pool_type="avg"), True, {}),
        ("open_clip final_ln_after_pool folder", True, dict(final_ln_after_pool=True, pool_type="avg"), True, {}),
        ("open_clip ls_init_value folder", True, dict(ls_init_value=0.1), True, {}),
        ("open_clip no_ln_pre folder", True, dict(no_ln_pre=True), True, {}),
        ("open_clip no_ln_pre bare .pt", True, dict(no_ln_pre=True), False, dict(heads=4)),
        ("open_clip attentional_pool folder", True, dict(attentional_pool=True, attn_pooler_queries=4,
                                                          attn_pooler_heads=2), True, {}),
        ("open_clip bare .pt heads not given", True, {}, False, {}),
        ("open_clip train ckpt module.", True, {}, False, dict(heads=4)),
        ("open_clip norm_kwargs eps1e-6 folder", True, dict(norm_kwargs={"eps": 1e-6}), True, {}),
        ("open_clip act_kwargs (ignored by QuickGELU?) folder", False, dict(act_kwargs={"approximate": "tanh"}),
         True, {}),
        ("open_clip pos_embed_type=sin_cos_2d folder", True, dict(pos_embed_type="sin_cos_2d"), True, {}),
        ("open_clip scale_attn+scale_fc folder", True, dict(scale_attn=True, scale_fc=True), True, {}),
        ("open_clip pool_type=none? tok folder", True, dict(pool_type="tok"), True, {}),
    ]:
        if folder:
            save = partial(lambda m, d, qg, vis: save_oc_folder(m, d, qg, vis), qg=qg, vis=vis)
        elif "train" in name:
            save = partial(save_train, key="state_dict", prefix="module.", name="epoch_3.pt")
        else:
            save = partial(save_pth, name="open_clip_vit.pt")
        out.append(Case(name, open_clip_build(qg, **vis), oc_ref, save, kw, cause=OC_CAUSE.get(name, ())))
    return out


def vp_build(module: str, cls: str = "ViT", **kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import importlib
        mod = importlib.import_module(f"vit_pytorch.{module}")
        args = dict(image_size=32, patch_size=8, num_classes=5, dim=64, depth=2, heads=4, mlp_dim=128)
        args.update(kw)
        torch.manual_seed(0)
        return perturb(getattr(mod, cls)(**args))
    return build


def vit_pytorch_cases() -> list[Case]:
    H = dict(heads=4)
    return [
        Case("vit-pytorch ViT pool=mean dim_head=8", vp_build("vit", pool="mean", dim_head=8), softmax_ref,
             save_pth, H),
        Case("vit-pytorch ViT channels=1", vp_build("vit", channels=1), softmax_ref, save_pth, H, x=(32, 32, 1)),
        Case("vit-pytorch ViT heads not given", vp_build("vit"), softmax_ref, save_pth, cause=('num_heads',)),
        Case("vit-pytorch SimpleViT dim_head=16", vp_build("simple_vit", "SimpleViT", dim_head=16), softmax_ref,
             save_pth, H),
        Case("vit-pytorch SimpleViT registers", vp_build("simple_vit_with_register_tokens", "SimpleViT",
                                                         num_register_tokens=2), softmax_ref, save_pth, H,
             perm=lambda t: list(range(t - 2, t)) + list(range(t - 2))),  # [patches, reg] -> [reg, patches]
        Case("vit-pytorch SimpleViT qk_norm", vp_build("simple_vit_with_qk_norm", "SimpleViT"), softmax_ref,
             save_pth, H),
        Case("vit-pytorch vit_for_small_dataset (SPT+LSA)", vp_build("vit_for_small_dataset"), softmax_ref,
             save_pth, H),
        Case("vit-pytorch ViT patch_dropout", vp_build("vit_with_patch_dropout", patch_dropout=0.25),
             softmax_ref, save_pth, H),
        Case("vit-pytorch SimpleViT patch_dropout", vp_build("simple_vit_with_patch_dropout", "SimpleViT",
                                                             patch_dropout=0.25), softmax_ref, save_pth, H),
        Case("vit-pytorch deepvit", vp_build("deepvit", "DeepViT"), softmax_ref, save_pth, H),
        Case("vit-pytorch SimpleViT 32x48 image_size not given", vp_build("simple_vit", "SimpleViT",
                                                                          image_size=(32, 48)),
             softmax_ref, save_pth, H, x=(32, 48)),
        Case("vit-pytorch value_residual", vp_build("simple_vit_with_value_residual", "SimpleViT"), softmax_ref,
             save_pth, H),
        Case("vit-pytorch orthog_residual_update", vp_build("simple_vit_orthog_residual_update", "SimpleViT"),
             softmax_ref, save_pth, H),
        Case("vit-pytorch specialized_cls", vp_build("simple_vit_with_specialized_cls", "SimpleViT"),
             softmax_ref, save_pth, H),
        Case("vit-pytorch keel_post_ln", vp_build("vit_with_keel_post_ln"), softmax_ref, save_pth, H),
        Case("vit-pytorch vit_5", vp_build("vit_5"), softmax_ref, save_pth, H),
        Case("vit-pytorch simple_uvit", vp_build("simple_uvit", "SimpleUViT"), softmax_ref, save_pth, H),
        Case("vit-pytorch parallel_vit", vp_build("parallel_vit"), softmax_ref, save_pth, H),
        Case("vit-pytorch vit_with_decorr", vp_build("vit_with_decorr"), softmax_ref, save_pth, H),
        Case("vit-pytorch relative_proj_pos_bias", vp_build("simple_vit_with_relative_proj_pos_bias",
                                                            "SimpleViT"), softmax_ref, save_pth, H),
        Case("vit-pytorch learnable_memory_vit", vp_build("learnable_memory_vit"), softmax_ref, save_pth, H),
        Case("vit-pytorch hyper_connections", vp_build("simple_vit_with_hyper_connections", "SimpleViT",
                                                       num_residual_streams=2), softmax_ref, save_pth, H),
        Case("vit-pytorch ViT {'model_state_dict'}", vp_build("vit", dim_head=16), softmax_ref,
             partial(save_train, key="model_state_dict"), H),
    ]


def tv_build(**kw: Any) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from torchvision.models.vision_transformer import VisionTransformer
        args = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                    num_classes=5)
        args.update(kw)
        torch.manual_seed(0)
        return perturb(VisionTransformer(**args))
    return build


def torchvision_cases() -> list[Case]:
    H = dict(heads=4)
    return [
        Case("torchvision small heads given (.pth)", tv_build(), mha_ref, save_pth, H),
        Case("torchvision representation_size (.pth)", tv_build(representation_size=32), mha_ref, save_pth, H),
        Case("torchvision heads=2 not given (.pth)", tv_build(num_heads=2), mha_ref, save_pth, cause=('num_heads',)),
        Case("torchvision norm eps1e-5 (.pth)", tv_build(norm_layer=partial(nn.LayerNorm, eps=1e-5)), mha_ref,
             save_pth, H, cause=('eps',)),
        Case("torchvision img 48 run 48 (.safetensors)", tv_build(image_size=48), mha_ref, save_safe, H,
             x=(48, 48)),
    ]


def all_cases() -> list[Case]:
    return timm_cases() + hf_cases() + open_clip_cases() + vit_pytorch_cases() + torchvision_cases()


# ------------------------------------------------------------------------------------------------ judging
IGNORED = {"preprocess"}   # never explain a difference on a given input tensor
# Settings that act after the last softmax only. When the attention is the original's to float rounding (every
# block's softmax matches, so the blocks' norm order, activation, eps and scale are right) and only the output
# differs, only one of these can explain it: a flag on, say, the activation does not say what went wrong.
OUTPUT_FIELDS = {"pooling", "eps_final", "pool_heads", "pool_mlp", "pool_act", "pool_prefix", "pre_logits_act",
                 "head_bias", "embed_out", "model_args", "final_norm", "fc_norm", "norm_extra", "head_dist"}
ATTN_SAME = 1e-6


@dataclass
class Row:
    name: str
    verdict: str
    d_attn: float = float("nan")
    d_out: float = float("nan")
    said: tuple = ()
    detail: str = ""


def compare(vm: Any, x: torch.Tensor, ref: Ref, perm: Callable | None = None) -> tuple[float, float, str]:
    out, maps = ref
    if perm is not None:  # the same attention in vitviz's token order (prefix tokens first)
        maps = [m[:, :, perm(m.shape[-1])][:, :, :, perm(m.shape[-1])] for m in maps]
    r = vm.run(x)
    detail = ""
    if r.attentions.shape[0] != len(maps):
        return float("inf"), float("nan"), f"layers {r.attentions.shape[0]} vs {len(maps)}"
    d_attn = 0.0
    for i, m in enumerate(maps):
        a = m[0].float().numpy()
        if r.attentions[i].shape != a.shape:
            return float("inf"), float("nan"), f"layer {i} attention {r.attentions[i].shape} vs {a.shape}"
        d_attn = max(d_attn, float(np.abs(r.attentions[i] - a).max()))
    d_out = float("nan")
    if out is not None:
        if isinstance(out, (tuple, list)):
            out = out[0]
        o = out[0].float().numpy() if out.dim() > 1 else out.float().numpy()
        got = r.logits if r.logits.size else r.features
        if got is None or np.shape(got) != o.shape:
            detail = f"output {None if got is None else np.shape(got)} vs {o.shape}"
            d_out = float("inf")
        else:
            d_out = float(np.abs(got - o).max())
    return d_attn, d_out, detail


def run_case(case: Case, tmp: Path) -> Row:
    d = tmp / "".join(ch if ch.isalnum() else "_" for ch in case.name)
    d.mkdir(parents=True)
    try:
        model = case.build()
        h, w, *c = case.x
        x = x_for(h, w, c[0] if c else 3)
        ref = case.ref(model, x)
        path = case.save(model, d)
        if not ref[1]:
            raise RuntimeError("no attention captured from the original")
    except Exception as e:  # noqa: BLE001 - the original library could not build / save it: not vitviz's
        return Row(case.name, "skip", detail=f"original: {type(e).__name__}: {str(e)[:150]}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            vm = vitviz.load(path, device="cpu", **case.load_kw)
        except VitvizError as e:
            msg = str(e)
            bug = "please report" in msg or "unexpected" in msg
            return Row(case.name, "crash" if bug else "refused", detail=msg.replace("\n", " ")[:300])
        except Exception as e:  # noqa: BLE001
            return Row(case.name, "crash", detail=f"{type(e).__name__}: {str(e)[:200]} @ "
                       + traceback.format_exc().strip().splitlines()[-3].strip()[:120])
        try:
            d_attn, d_out, detail = compare(vm, x, ref, case.perm)
        except VitvizError as e:
            return Row(case.name, "refused", detail="run: " + str(e).replace("\n", " ")[:300])
        except Exception as e:  # noqa: BLE001
            return Row(case.name, "crash", detail=f"run: {type(e).__name__}: {str(e)[:200]}")
    said = tuple(f for f, _ in vm.spec.assumptions if f not in IGNORED)
    warned = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    if any("not a multiple of" in w for w in warned):  # the run said it cut the input to whole patches
        said += ("input",)
    if case.cause:
        explaining = tuple(f for f in said if f in case.cause)
    else:
        explaining = said if d_attn > ATTN_SAME else tuple(f for f in said if f in OUTPUT_FIELDS)
    bad = not (d_attn < TOL) or (d_out == d_out and not d_out < TOL)
    if not bad:
        verdict = "exact"
    elif explaining:
        verdict = "said"
    else:
        verdict = "SILENT"
        if warned:
            detail = (detail + " | warnings: " + " / ".join(w[:120] for w in warned))[:400]
    return Row(case.name, verdict, d_attn, d_out, said, detail)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    ap.add_argument("-v", action="store_true", help="print the assumed fields of exact cases too")
    args = ap.parse_args()
    torch.set_num_threads(2)
    cases = [c for c in all_cases() if args.k.lower() in c.name.lower()]
    rows = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            row = run_case(case, Path(tmp))
            rows.append(row)
            said = ",".join(row.said) if (row.verdict != "exact" or args.v) else ""
            print(f"{row.verdict:8s} {row.name:58s} attn {row.d_attn:9.2e} out {row.d_out:9.2e} "
                  f"{('said: ' + said) if said else ''} {row.detail}", flush=True)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    order = ["exact", "said", "SILENT", "refused", "crash", "skip"]
    print(f"\n{len(rows)} files: " + ", ".join(f"{counts.get(k, 0)} {k}" for k in order if counts.get(k))
          + f"  ({time.time() - t0:.0f} s)")
    return 0 if not (counts.get("SILENT") or counts.get("crash")) else 1


if __name__ == "__main__":
    sys.exit(main())
