"""timm-layout checkpoints: timm, DeiT (1, distilled, III), DINO v1, DINOv2 original, MAE, old timm.

The canonical layout is timm's, so conversion is a few renames plus the sub-family, which decides the
position-embedding interpolation recipe and the preprocessing defaults.
"""
from __future__ import annotations

import re

from typing import Any

import torch

from vitviz.core.checkpoint import RawCheckpoint
from vitviz.core.families.base import Converted, Hint, blocks_are_canonical, rename as _rename

NAMES = ("timm", "deit", "deit3", "dino", "dinov2", "mae")
TIMM_LAYOUT_FAMILIES = NAMES


_RENAMES = [(r"^blocks\.\d+\.(\d+)\.", r"blocks.\1."),        # DINOv2 chunked blocks
            (r"\.gamma_([12])$", r".ls\1.gamma"),               # DeiT III layer scale
            (r"\.mlp\.w12\.", ".mlp.fc1."), (r"\.mlp\.w3\.", ".mlp.fc2."),  # DINOv2 SwiGLU
            (r"^register_tokens$", "reg_token")]


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    """timm naming with blocks the reference loads as they are; timm-like files with other block names (e.g. an
    `nn.MultiheadAttention` or `mlp.0` inside `blocks.N`) are left to the structural reader."""
    if "patch_embed.proj.weight" in keys and any(".attn.qkv.weight" in k for k in keys):
        renamed = _rename({k: None for k in keys}, _RENAMES)  # type: ignore[arg-type]
        if blocks_are_canonical(set(renamed)):
            return "timm"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    """timm, DeiT (1, distilled, III), DINO v1, DINOv2 original, MAE, WZ / old timm: timm naming already.

    `family` (one of the timm-layout families) overrides the detected sub-family.
    """
    keys = set(sd)
    hints: dict[str, Hint] = {}
    dropped = [k for k in keys if k.startswith(("decoder", "mask_token", "head.mlp.", "head.last_layer."))]
    sd = {k: v for k, v in sd.items() if k not in dropped}
    sd = _rename(sd, _RENAMES)
    family = family if family in TIMM_LAYOUT_FAMILIES else _timm_subfamily(keys, raw)
    if "register_tokens" in keys:  # DINOv2 original: pos covers cls only; registers inserted after
        hints["pos_prefix"] = (1, "shape: register_tokens (the DINOv2 layout: register tokens get no position "
                                  "embedding)")
    if isinstance((raw.config or {}).get("architecture"), str):  # a timm hub folder: timm runs it, whoever trained it
        hints["pos_interp"] = ("timm", f"named: timm architecture {raw.config['architecture']!r} (config.json): "
                                       "timm resamples the table (bicubic, antialias)")
    elif family == "dinov2":
        hints["pos_interp"] = ("dinov2_reg" if "register_tokens" in keys else "dinov2", "family: DINOv2")
    elif family == "dino":
        hints["pos_interp"] = ("dino", "family: DINO")
    elif family in ("deit", "deit3", "mae"):
        hints["pos_interp"] = ("deit", f"family: {family} (bicubic, size=, align_corners=False)")
    if any(".mlp.w12." in k for k in keys):
        hints["mlp_kind"] = ("swiglu", "shape: mlp.w12 (DINOv2 SwiGLU)")
    if family == "timm" and ("norm_pre.weight" in keys or "attn_pool.latent" in keys or "siglip" in _architecture(raw)):
        family = _tower_hints(sd, raw, hints)
    return Converted(family, sd, hints, dropped)


# timm SigLIP towers built with tanh-GELU (the SigLIP 2 era); every other `vit_*_siglip_*` uses exact GELU
SIGLIP_TANH = frozenset(f"vit_{n}" for n in (
    "base_patch32_siglip_256", "large_patch16_siglip_512", "so400m_patch16_siglip_256", "so400m_patch16_siglip_384",
    "so400m_patch16_siglip_512", "giantopt_patch16_siglip_256", "giantopt_patch16_siglip_384",
    "base_patch32_siglip_gap_256", "large_patch16_siglip_gap_512", "so400m_patch16_siglip_gap_256",
    "so400m_patch16_siglip_gap_384", "so400m_patch16_siglip_gap_512", "giantopt_patch16_siglip_gap_256",
    "giantopt_patch16_siglip_gap_384"))


def _architecture(raw: RawCheckpoint) -> str:
    """The timm model name a config beside the file or the training args give ('' when none)."""
    cfg = raw.config or {}
    name = cfg.get("architecture") if isinstance(cfg.get("architecture"), str) else ""
    args = raw.meta.get("args") if isinstance(raw.meta.get("args"), dict) else {}
    return str(name or raw.meta.get("arch") or args.get("model") or "").lower()


def _tower_hints(sd: dict[str, torch.Tensor], raw: RawCheckpoint, hints: dict[str, Hint]) -> str:
    """timm's CLIP-style (`pre_norm`: `norm_pre`, no patch bias, LayerNorm eps 1e-5, GELU or QuickGELU, the head
    a projection) and SigLIP-style (`global_pool='map'`: the MAP head `attn_pool`, tanh-GELU) towers."""
    name = _architecture(raw)
    named = f"metadata: model name {name!r}" if name else ""
    if "attn_pool.latent" in sd or "siglip" in name:
        if "siglip" in name:
            tanh = name.split(".")[0] in SIGLIP_TANH
            hints["mlp_kind"] = ("gelu_tanh" if tanh else "gelu", f"{named} (timm builds this SigLIP tower with "
                                 f"{'tanh-GELU' if tanh else 'exact GELU'})")
        elif not name:
            hints["mlp_kind"] = ("gelu_tanh", "guess: a timm ViT with a MAP head (attn_pool) and no config is a "
                                 "SigLIP tower; timm builds the SigLIP 2 era ones with tanh-GELU, the older "
                                 "vit_*_siglip_* with exact GELU (pass act='gelu' for those)")
        return "timm-siglip"
    hints["eps"] = (1e-5, "family: timm builds every pre_norm (CLIP-style) ViT with LayerNorm eps 1e-5")
    if "quickgelu" in name:
        hints["mlp_kind"] = ("quick_gelu", named)
    elif "clip" in name:
        hints["mlp_kind"] = ("gelu", named)
    elif not name:
        hints["mlp_kind"] = ("gelu", "guess: a CLIP-style timm tower (norm_pre) without a config; timm's *_clip_* "
                             "models use GELU, its *_clip_quickgelu_* ones (OpenAI weights) QuickGELU")
    bias = sd.get("head.bias")
    if "head.weight" in sd and (bias is None or not bool(bias.any())):
        hints["embed_out"] = (True, "shape: a CLIP-style head without bias (or an all-zero one, as timm converts "
                                    "CLIP's proj) is the image-embedding projection")
        if bias is not None:
            sd.pop("head.bias")
    return "timm-clip"


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
