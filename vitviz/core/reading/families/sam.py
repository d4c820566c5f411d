"""SAM / ViTDet image encoders: timm `samvit_*` (`blocks.N.attn.rel_pos_h`, `neck.N`), the original
segment-anything files (`image_encoder.*`, `mlp.lin1/lin2`; the prompt encoder and mask decoder are set aside) and
transformers `SamVisionModel` / `SamModel` (`vision_encoder.layers.N`, `neck.conv1`).

Every layout becomes the reference windowed model's keys (`vitviz.core.running.windowed`): `patch_embed.proj`,
`pos_embed` (1, gh, gw, D), `blocks.N.{norm1, attn.qkv, attn.proj, attn.rel_pos_h, attn.rel_pos_w, norm2,
mlp.fc1, mlp.fc2}`, `neck.0` (1x1 conv) / `neck.1` (LayerNorm2d) / `neck.2` (3x3 conv) / `neck.3`, `head.fc`.

A block's window is read off its decomposed relative position table, (2 * window - 1, head_dim): the global blocks'
tables span the whole native grid; the head width is the table's second axis (so the head count is derived). What
no tensor says -- the LayerNorm eps, the activation, how the position table is resampled at another size -- comes
from the implementation that wrote the file, with its source.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, rename
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("sam", "timm-sam", "hf-sam")
DETECT_ORDER = 20   # detection tries the families in this order, lowest first
WINDOWED = "sam"   # its files convert to the windowed reference model, sam layout
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "SAM / ViTDet encoders"
# No PREPROCESS of its own: its sub-families take their prefix's recipe (hf-sam: hf's, ...)

_REL = re.compile(r"^(?:image_encoder\.|vision_encoder\.)?(?:blocks|layers)\.\d+\.attn\.rel_pos_h$")
_NECK = re.compile(r"^(?:image_encoder\.|vision_encoder\.)?neck\.(?:0|conv1)\.weight$")
# the SAM releases' image encoders (segment-anything build_sam.py; timm samvit_*): window 14, these global blocks
GLOBAL_BLOCKS = {768: (2, 5, 8, 11), 1024: (5, 11, 17, 23), 1280: (7, 15, 23, 31)}


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if not any(_REL.match(k) or _NECK.match(k) for k in keys):
        return None
    if any(k.startswith("vision_encoder.") or k.startswith("layers.0.layer_norm1") for k in keys):
        return "hf-sam"
    if any(k.startswith("image_encoder.") for k in keys):
        return "sam"
    return "timm-sam" if any(k.startswith("blocks.") for k in keys) else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    found = detect(set(sd), raw) or (family if family in ("timm-sam", "hf-sam") else None)
    if found is None:
        raise UnknownLayoutError(f"{raw.path}: family {family!r} named, but this is no SAM / ViTDet image encoder "
                                 "(no blocks.N.attn.rel_pos_h or neck)")
    prefix = {"sam": "image_encoder.", "hf-sam": "vision_encoder."}.get(found, "")
    if prefix and any(k.startswith(prefix) for k in sd):
        dropped = sorted(k for k in sd if not k.startswith(prefix))
        sd = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    else:
        dropped = []
    if found == "hf-sam":
        sd = rename(sd, [(r"^neck\.conv1\.", "neck.0."), (r"^neck\.layer_norm1\.", "neck.1."),
                         (r"^neck\.conv2\.", "neck.2."), (r"^neck\.layer_norm2\.", "neck.3."),
                         (r"^patch_embed\.projection\.", "patch_embed.proj."), (r"^layers\.(\d+)\.", r"blocks.\1."),
                         (r"\.layer_norm1\.", ".norm1."), (r"\.layer_norm2\.", ".norm2.")])
    sd = rename(sd, [(r"\.mlp\.lin1\.", ".mlp.fc1."), (r"\.mlp\.lin2\.", ".mlp.fc2.")])
    cfg = raw.config or {}
    hints: dict[str, Hint] = {"order": ("pad_roll", "family: SAM pads the grid to whole windows (no shift)"),
                              "shift_rule": ("built", "family: SAM never shifts its windows"),
                              "mask_value": (0.0, "family: SAM has no shift mask")}
    if found == "hf-sam":
        _hf_hints(cfg, hints)
    elif found == "sam":
        fam = "segment-anything ImageEncoderViT"
        hints.update(eps=(1e-6, f"family: {fam} LayerNorm eps 1e-6"), eps_neck=(1e-6, f"family: {fam} LayerNorm2d "
                     "eps 1e-6"), mlp_kind=("gelu", f"family: {fam} MLP exact GELU"),
                     pos_interp=("timm", f"assumed: {fam} adds its table as stored (it runs at 1024 px only); at "
                                 "another size it is resampled as timm's samvit does (bicubic, antialiased)"))
        hints["preprocess"] = (_sam_preprocess(), f"family: {fam} (ImageNet mean/std; the image squashed to the "
                               "model size, where SAM resizes the longer side and pads)")
    else:
        _timm_hints(cfg, hints)
    return Converted(found, sd, hints, dropped)


def _sam_preprocess(size: int = 1024) -> dict[str, Any]:
    return dict(crop=(size, size), resize=size, interpolation="bilinear", mean=(0.485, 0.456, 0.406),
                std=(0.229, 0.224, 0.225), mode="squash")


def _windows(window: Any, globals_: Any, where: str) -> dict[str, Hint]:
    out: dict[str, Hint] = {}
    if window is not None:
        out["window"] = (int(window), where + " window_size")
    if globals_ is not None:
        out["global_blocks"] = (tuple(int(i) for i in globals_), where + " global_attn_indexes")
    return out


def _timm_hints(cfg: dict[str, Any], hints: dict[str, Hint]) -> None:
    fam = "timm VisionTransformerSAM"
    hints.update(eps=(1e-5, f"family: {fam} nn.LayerNorm eps 1e-5"),
                 eps_neck=(1e-6, f"family: {fam} LayerNorm2d eps 1e-6"),
                 mlp_kind=("gelu", f"family: {fam} MLP exact GELU"),
                 pos_interp=("timm", f"family: {fam} resamples its table bicubically, antialiased"))
    margs = cfg.get("model_args") or {}
    pcfg = cfg.get("pretrained_cfg") or {}
    arch = str(cfg.get("architecture") or "")
    if arch:
        hints["identity"] = (arch, f"named: timm architecture {arch!r} (config.json)")
    hints.update(_windows(margs.get("window_size"), margs.get("global_attn_indexes"),
                          "metadata: config.json model_args"))
    if margs.get("num_heads") is not None:
        hints["num_heads"] = (int(margs["num_heads"]), "metadata: config.json model_args num_heads")
    if margs.get("act_layer") not in (None, "gelu"):
        raise UnknownLayoutError(f"config.json: timm SAM with act_layer {margs['act_layer']!r} is not supported")
    for flag in ("use_rope", "pre_norm", "qk_norm"):
        if margs.get(flag):
            raise UnknownLayoutError(f"config.json: timm SAM with {flag}=True is not supported yet")
    if pcfg.get("input_size"):
        hints["image_size"] = (tuple(pcfg["input_size"][-2:]), "metadata: config.json pretrained_cfg input_size")
    if margs.get("img_size") is not None:
        v = margs["img_size"]
        hints["image_size"] = ((int(v[0]), int(v[-1])) if isinstance(v, (list, tuple)) else (int(v), int(v)),
                               "metadata: config.json model_args img_size")


def _hf_hints(cfg: dict[str, Any], hints: dict[str, Hint]) -> None:
    fam = "transformers SamVisionEncoder"
    vc = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else cfg
    where = "metadata: config.json" + (" vision_config" if vc is not cfg else "")
    if cfg.get("model_type"):
        hints["identity"] = (cfg["model_type"], f"named: transformers model_type {cfg['model_type']!r} (config.json)")
    hints["eps"] = (float(vc["layer_norm_eps"]), f"{where} layer_norm_eps") if vc.get("layer_norm_eps") is not None \
        else (1e-6, f"default: {fam} layer_norm_eps 1e-6")
    hints["eps_neck"] = (1e-6, f"family: {fam}'s neck SamLayerNorm eps 1e-6")
    act = vc.get("hidden_act")
    if act not in (None, "gelu"):
        raise UnknownLayoutError(f"config.json: SAM vision encoder with hidden_act {act!r} is not supported")
    hints["mlp_kind"] = ("gelu", f"{where} hidden_act" if act else f"default: {fam} hidden_act gelu")
    hints.update(_windows(vc.get("window_size"), vc.get("global_attn_indexes"), where))
    if vc.get("num_attention_heads") is not None:
        hints["num_heads"] = (int(vc["num_attention_heads"]), f"{where} num_attention_heads")
    if vc.get("image_size") is not None:
        size = int(vc["image_size"]) if not isinstance(vc["image_size"], (list, tuple)) else int(vc["image_size"][0])
        hints["image_size"] = ((size, size), f"{where} image_size")
    hints["pos_interp"] = ("timm", f"assumed: {fam} refuses other sizes; there the table is resampled as timm's "
                                   "samvit does (bicubic, antialiased)")
    hints["preprocess"] = (_sam_preprocess(hints.get("image_size", ((1024, 1024), ""))[0][0]),
                           f"family: {fam} (SamProcessor: ImageNet mean/std; the image squashed to the model size, "
                           "where SAM resizes the longer side and pads)")
