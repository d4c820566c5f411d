"""A transformers task model built on a plain-ViT backbone (`load_backbone`): Depth Anything (v1 / v2, a DINOv2
backbone under a DPT neck and head), and any folder whose config.json has a `backbone_config` of a model type the
`hf` reader reads (ViT, DeiT, DINOv2 with or without registers) and whose weights hold it under `backbone.`.

The backbone is the ViT whose attention vitviz shows: its tensors go through the `hf` reader with the
`backbone_config` (heads, eps, activation, image size are there, not at the top of config.json, which names the
task model); the neck and head (`neck.*`, `head.*`, ...) are not part of it and are dropped. Before this module a
Depth Anything folder ended in the structural reader's "could not be placed" (issue 31).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families import hf
from vitviz.core.reading.families.base import Converted, Hint

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-backbone",)
DETECT_ORDER = 47   # before hf (50): its keys carry the task model's `backbone.` prefix beside a neck and head
HELP = "transformers task models on a ViT / DINOv2 backbone (Depth Anything)"
# No PREPROCESS of its own: the backbone's family's (hf-dinov2, hf-vit ...); preprocessor_config.json wins
REGISTERED_SIZES = True
# No NAME_HINTS: the family is the backbone's (hf-dinov2, ...)

PREFIX = "backbone."


def backbone_config(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """config.json's `backbone_config` when its model type is one the `hf` reader reads as a plain ViT."""
    inner = cfg.get("backbone_config")
    if isinstance(inner, dict) and str(inner.get("model_type", "")) in hf.HF_MODEL_TYPES:
        return inner
    return None


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if backbone_config(raw.config or {}) is None:
        return None
    inner = {k[len(PREFIX):] for k in keys if k.startswith(PREFIX)}
    return "hf-backbone" if inner and hf.detect(inner, raw) else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    cfg = raw.config or {}
    inner_cfg = backbone_config(cfg) or {}
    task = str(cfg.get("model_type") or "a task model")
    backbone = {k[len(PREFIX):]: v for k, v in sd.items() if k.startswith(PREFIX)}
    dropped = sorted(k for k in sd if not k.startswith(PREFIX))   # the task model's neck and head
    base = hf.convert(backbone, dataclasses.replace(raw, config=inner_cfg), None, overrides)
    src = f"metadata: config.json backbone_config ({task})"
    hints: dict[str, Hint] = {k: ((v[0], src) if v[1] == "metadata: config.json" else v) for k, v in base.hints.items()}
    hints.pop("labels", None)   # the backbone config's placeholder labels: the backbone has no classifier
    return Converted(base.family, base.tensors, hints, dropped + base.dropped)
