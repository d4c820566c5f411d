"""Family detection and key conversion into the canonical (timm) layout.

Each converter takes the raw tensors and returns the canonical state dict plus `hints`: values the family
fixes (eps, activation, pooling, interpolation recipe, token coverage of the position embedding) together with
where they came from. Anything not fixed here is inferred from shapes in `vitviz.core.infer`.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from vitviz.core.checkpoint import RawCheckpoint
from vitviz.errors import UnknownLayoutError

Hint = tuple[Any, str]  # (value, where it came from)


@dataclass
class Converted:
    family: str
    tensors: dict[str, torch.Tensor]
    hints: dict[str, Hint] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)   # keys deliberately ignored (foreign heads, mask token)


def key_stems(keys: list[str], n: int = 10) -> list[str]:
    """The n most common key stems (digits replaced by N), for messages about unknown layouts."""
    stems = Counter(re.sub(r"\d+", "N", k) for k in keys)
    return [f"{s} (x{c})" if c > 1 else s for s, c in stems.most_common(n)]


def _strip_prefixes(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Strip wrapper prefixes (DDP, compile, DINO MultiCropWrapper, Lightning) until stable; drop foreign heads."""
    dropped: list[str] = []
    changed = True
    while changed:
        changed = False
        for prefix in ("module.", "_orig_mod.", "model.", "timm_model.", "backbone."):
            if sd and all(k.startswith(prefix) for k in sd):
                sd = {k[len(prefix):]: v for k, v in sd.items()}
                changed = True
        backbone = [k for k in sd if k.startswith("backbone.")]
        if backbone and all(k.startswith(("backbone.", "head.", "dino_head.", "ibot_head.")) for k in sd):
            dropped += [k for k in sd if not k.startswith("backbone.")]
            sd = {k[len("backbone."):]: v for k, v in sd.items() if k.startswith("backbone.")}
            changed = True
    return sd, dropped


def convert(raw: RawCheckpoint, family: str | None = None) -> Converted:
    """Detect the family of `raw` (or use `family`) and convert its keys to the canonical layout."""
    sd, dropped = _strip_prefixes(dict(raw.tensors))
    keys = set(sd)
    detected = family or detect(keys, raw)
    converter = CONVERTERS.get(detected.split(":")[0].split("-")[0])
    if converter is None:
        raise UnknownLayoutError(
            f"{raw.path}: family {detected!r} is not supported; expected one of {', '.join(sorted(CONVERTERS))}")
    # a timm-layout family named by the caller decides the sub-family defaults (interpolation, preprocessing)
    out = convert_timm(sd, raw, detected.split(":")[0]) if converter is convert_timm and family else converter(sd, raw)
    out.dropped = dropped + out.dropped
    return out


def detect(keys: set[str], raw: RawCheckpoint) -> str:
    """The family of a prefix-stripped key set (checkpoint-formats.md §9)."""
    stripped = {re.sub(r"^(vit|deit|dinov2|dinov2_with_registers)\.", "", k) for k in keys}
    if "conv_proj.weight" in keys and "encoder.pos_embedding" in keys:
        return "torchvision"
    if "embeddings.patch_embeddings.projection.weight" in stripped:
        return "hf"
    if "patch_embedding.weight" in keys and "position_embedding" in keys:
        return "seed"
    if "patch_embed.proj.weight" in keys and any(".attn.qkv.weight" in k for k in keys):
        return "timm"
    if any(k.startswith("visual.") for k in keys):
        hint = "CLIP visual towers are not supported yet"
    elif any(k.startswith("to_patch_embedding") for k in keys):
        hint = "lucidrains/vit-pytorch layouts are not supported yet"
    else:
        hint = "this does not look like a Vision Transformer"
    raise UnknownLayoutError(
        f"{raw.path}: unknown checkpoint layout ({len(keys)} tensors; {hint}). Most common key stems: "
        f"{', '.join(key_stems(sorted(keys)))}. Expected a ViT state dict from timm, DeiT, DINO/DINOv2, MAE, "
        "torchvision or Hugging Face (keys like patch_embed.proj.weight, blocks.N.attn.qkv.weight)")


def _rename(sd: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in sd.items():
        for pattern, repl in rules:
            k = re.sub(pattern, repl, k)
        out[k] = v
    return out


# ---------------------------------------------------------------------------------------------- timm-style
def convert_timm(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None) -> Converted:
    """timm, DeiT (1, distilled, III), DINO v1, DINOv2 original, MAE, WZ / old timm: timm naming already.

    `family` (one of the timm-layout families) overrides the detected sub-family.
    """
    keys = set(sd)
    hints: dict[str, Hint] = {}
    dropped = [k for k in keys if k.startswith(("decoder", "mask_token", "head.mlp.", "head.last_layer."))]
    sd = {k: v for k, v in sd.items() if k not in dropped}
    sd = _rename(sd, [(r"^blocks\.\d+\.(\d+)\.", r"blocks.\1."),        # DINOv2 chunked blocks
                      (r"\.gamma_([12])$", r".ls\1.gamma"),               # DeiT III layer scale
                      (r"\.mlp\.w12\.", ".mlp.fc1."), (r"\.mlp\.w3\.", ".mlp.fc2."),  # DINOv2 SwiGLU
                      (r"^register_tokens$", "reg_token")])
    family = family if family in TIMM_LAYOUT_FAMILIES else _timm_subfamily(keys, raw)
    if "register_tokens" in keys:  # DINOv2 original: pos covers cls only; registers inserted after
        hints["pos_prefix"] = (1, "layout: DINOv2 register tokens get no position embedding")
    if family == "dinov2":
        hints["pos_interp"] = ("dinov2_reg" if "register_tokens" in keys else "dinov2", "family: DINOv2")
    elif family == "dino":
        hints["pos_interp"] = ("dino", "family: DINO")
    elif family in ("deit", "deit3", "mae"):
        hints["pos_interp"] = ("deit", f"family: {family} (bicubic, size=, align_corners=False)")
    if any(".mlp.w12." in k for k in keys):
        hints["mlp_kind"] = ("swiglu", "shape: mlp.w12 (DINOv2 SwiGLU)")
    return Converted(family, sd, hints, dropped)


def _timm_subfamily(keys: set[str], raw: RawCheckpoint) -> str:
    arch = str(raw.meta.get("arch") or (raw.meta.get("args") or {}).get("model")
               or (raw.meta.get("args") or {}).get("arch") or "")
    if "mask_token" in keys or "register_tokens" in keys or any(re.match(r"blocks\.\d+\.\d+\.", k) for k in keys):
        return "dinov2"
    if any(k.endswith("gamma_1") for k in keys) or arch.startswith("deit3"):
        return "deit3"
    if "dist_token" in keys or arch.startswith("deit"):
        return "deit"
    if raw.nest_key in ("teacher", "student") or "patch_size" in (raw.meta.get("args") or {}):
        return "dino"
    if "fc_norm.weight" in keys and "cls_token" in keys and "norm.weight" not in keys:
        return "mae"
    return "timm"


# --------------------------------------------------------------------------------------------- torchvision
def convert_torchvision(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    sd = _rename(sd, [
        (r"^conv_proj\.", "patch_embed.proj."), (r"^class_token$", "cls_token"),
        (r"^encoder\.pos_embedding$", "pos_embed"), (r"^encoder\.ln\.", "norm."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.", r"blocks.\1."),
        (r"\.ln_1\.", ".norm1."), (r"\.ln_2\.", ".norm2."),
        (r"\.self_attention\.in_proj_weight$", ".attn.qkv.weight"),
        (r"\.self_attention\.in_proj_bias$", ".attn.qkv.bias"),
        (r"\.self_attention\.out_proj\.", ".attn.proj."),
        (r"\.mlp\.(0|linear_1)\.", ".mlp.fc1."), (r"\.mlp\.(3|linear_2)\.", ".mlp.fc2."),
        (r"^heads\.head\.", "head."), (r"^heads\.pre_logits\.", "pre_logits.fc."),
    ])
    hints: dict[str, Hint] = {"eps": (1e-6, "family: torchvision"), "pos_interp": ("torchvision", "family"),
                              "pos_prefix": (1, "family: torchvision")}
    return Converted("torchvision", sd, hints)


# ----------------------------------------------------------------------------------------------------- seed
def convert_seed(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    """The tutorial ViT of seeds/004: nn.MultiheadAttention blocks, nn.LayerNorm defaults (eps 1e-5)."""
    sd = _rename(sd, [
        (r"^patch_embedding\.", "patch_embed.proj."), (r"^position_embedding$", "pos_embed"),
        (r"\.attention\.in_proj_weight$", ".attn.qkv.weight"), (r"\.attention\.in_proj_bias$", ".attn.qkv.bias"),
        (r"\.attention\.out_proj\.", ".attn.proj."), (r"\.mlp\.0\.", ".mlp.fc1."), (r"\.mlp\.2\.", ".mlp.fc2."),
    ])
    hints: dict[str, Hint] = {"eps": (1e-5, "family: nn.LayerNorm default"), "pos_prefix": (1, "family"),
                              "pos_interp": ("torchvision", "family: seed tutorial (bicubic, align_corners)"),
                              "default_heads": ((4, 64), "family default: the tutorial ViT (dim 64, 4 heads)")}
    return Converted("seed", sd, hints)


from vitviz.core.families_hf import convert_hf  # noqa: E402  (HF converter lives in its own module)

TIMM_LAYOUT_FAMILIES = ("timm", "deit", "deit3", "dino", "dinov2", "mae")
CONVERTERS = {"timm": convert_timm, "deit": convert_timm, "deit3": convert_timm, "dino": convert_timm,
              "dinov2": convert_timm, "mae": convert_timm, "torchvision": convert_torchvision,
              "hf": convert_hf, "seed": convert_seed}
