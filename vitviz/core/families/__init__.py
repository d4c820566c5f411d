"""Checkpoint families: detection and key conversion into the canonical (timm) layout.

One module per family (`swin`, `sam`, `timm`, `torchvision`, `hf`, `seed`, `clip`, `siglip`, `beit`, `eva`, `jax`,
`vit_pytorch`, `torch_encoder`, `structural`), each
with `NAMES` (the family names it handles), `detect(keys, raw) -> name | None` and
`convert(sd, raw, family, overrides) -> Converted`. `FAMILIES` below is the registry, in detection order; a new
family is one new module and one entry there. `structural` comes last: it reads any layout by the roles and
shapes of its tensors, so a file with attention-shaped weights is never refused as "not a Vision Transformer".
The windowed families (`swin`, `sam`: Swin v1 / v2, SAM / ViTDet image encoders) come first: their keys
(`layers.S.blocks.B.attn`, `features.N.M.attn`, `blocks.N.attn.rel_pos_h`, a SAM neck) are in no plain ViT, and
`structural` would otherwise claim them; their files load into `vitviz.core.windowed`, not the reference ViT.

Each converter returns the canonical state dict plus `hints`: values the family fixes (eps, activation,
pooling, interpolation recipe, token coverage of the position embedding) together with where they came from.
Anything not fixed here is inferred from shapes in `vitviz.core.hyperparams`.
"""
from __future__ import annotations

from types import ModuleType

from vitviz.core.checkpoint import RawCheckpoint
from typing import Any

from vitviz.core.families import (
    beit, clip, eva, hf, jax, sam, seed, siglip, structural, swin, timm, torch_encoder, torchvision, vit_pytorch,
)
from vitviz.core.families.base import Converted, Hint, key_stems, strip_prefixes
from vitviz.errors import UnknownLayoutError

__all__ = ["Converted", "Hint", "FAMILIES", "FAMILY_NAMES", "convert", "detect", "key_stems"]

FAMILIES: tuple[ModuleType, ...] = (swin, sam, torchvision, beit, hf, seed, clip, siglip, jax, eva, timm, vit_pytorch,
                                     torch_encoder, structural)
FAMILY_NAMES: dict[str, ModuleType] = {name: module for module in FAMILIES for name in module.NAMES}


def convert(raw: RawCheckpoint, family: str | None = None, overrides: dict[str, Any] | None = None) -> Converted:
    """Detect the family of `raw` (or use `family`) and convert its keys to the canonical layout; `overrides`
    (the caller's load() overrides) reach readers that need one, e.g. a patch flatten order."""
    sd, dropped = strip_prefixes(dict(raw.tensors))
    detected = family or detect(set(sd), raw)
    full = detected.split(":")[0]
    name = full if full in FAMILY_NAMES else full.split("-")[0]  # 'hf-clip' is clip's, 'hf-vit' is hf's
    module = FAMILY_NAMES.get(name)
    if module is None:
        raise UnknownLayoutError(
            f"{raw.path}: family {detected!r} is not supported; expected one of {', '.join(sorted(FAMILY_NAMES))}")
    # a family named by the caller decides the sub-family defaults (interpolation, preprocessing)
    out = module.convert(sd, raw, name if family else None, overrides or {})
    out.dropped = dropped + out.dropped
    return out


def detect(keys: set[str], raw: RawCheckpoint) -> str:
    """The family of a prefix-stripped key set (checkpoint-formats.md §9)."""
    for module in FAMILIES:
        found = module.detect(keys, raw)
        if found:
            return found
    # structural claims every file with attention-shaped weights, so what is left has none
    if any(k.startswith("visual.") for k in keys):
        hint = "keys under visual. but no CLIP vision tower (visual.class_embedding / visual.trunk.) in them"
    else:
        hint = "no attention weights (no query/key/value or in-projection tensors), so not a Vision Transformer"
    raise UnknownLayoutError(
        f"{raw.path}: unknown checkpoint layout ({len(keys)} tensors; {hint}). Most common key stems: "
        f"{', '.join(key_stems(sorted(keys)))}. Expected a ViT state dict from timm, DeiT, DINO/DINOv2, MAE, "
        "torchvision or Hugging Face (keys like patch_embed.proj.weight, blocks.N.attn.qkv.weight)")
