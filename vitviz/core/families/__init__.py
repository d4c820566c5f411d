"""Checkpoint families: detection and key conversion into the canonical (timm) layout.

One module per family (`timm`, `torchvision`, `hf`, `seed`, ...), each with `NAMES` (the family names it
handles), `detect(keys, raw) -> name | None` and `convert(sd, raw, family) -> Converted`. `FAMILIES` below is
the registry, in detection order; a new family is one new module and one entry there.

Each converter returns the canonical state dict plus `hints`: values the family fixes (eps, activation,
pooling, interpolation recipe, token coverage of the position embedding) together with where they came from.
Anything not fixed here is inferred from shapes in `vitviz.core.hyperparams`.
"""
from __future__ import annotations

from types import ModuleType

from vitviz.core.checkpoint import RawCheckpoint
from vitviz.core.families import hf, seed, timm, torchvision
from vitviz.core.families.base import Converted, Hint, key_stems, strip_prefixes
from vitviz.errors import UnknownLayoutError

__all__ = ["Converted", "Hint", "FAMILIES", "FAMILY_NAMES", "convert", "detect", "key_stems"]

FAMILIES: tuple[ModuleType, ...] = (torchvision, hf, seed, timm)   # detection order
FAMILY_NAMES: dict[str, ModuleType] = {name: module for module in FAMILIES for name in module.NAMES}


def convert(raw: RawCheckpoint, family: str | None = None) -> Converted:
    """Detect the family of `raw` (or use `family`) and convert its keys to the canonical layout."""
    sd, dropped = strip_prefixes(dict(raw.tensors))
    detected = family or detect(set(sd), raw)
    name = detected.split(":")[0].split("-")[0]
    module = FAMILY_NAMES.get(name)
    if module is None:
        raise UnknownLayoutError(
            f"{raw.path}: family {detected!r} is not supported; expected one of {', '.join(sorted(FAMILY_NAMES))}")
    # a family named by the caller decides the sub-family defaults (interpolation, preprocessing)
    out = module.convert(sd, raw, name if family else None)
    out.dropped = dropped + out.dropped
    return out


def detect(keys: set[str], raw: RawCheckpoint) -> str:
    """The family of a prefix-stripped key set (checkpoint-formats.md §9)."""
    for module in FAMILIES:
        found = module.detect(keys, raw)
        if found:
            return found
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
