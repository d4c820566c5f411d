"""transformers EoMT (`EomtForUniversalSegmentation`, `EomtDinov3ForUniversalSegmentation`): refused by name.

EoMT is a DINOv2 / DINOv3 encoder whose last `num_blocks` blocks also carry learned segmentation queries
(`query.weight`), appended to the tokens before those blocks: the token count changes between layers, which one
(L, H, T, T) stack cannot hold. Before this module such a folder ended in the structural reader's "several
convolutions could be the patch embedding".
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-eomt",)
DETECT_ORDER = 43   # before the transformers readers: its encoder keys are DINOv2's / DINOv3's
HELP = "transformers EoMT (refused: segmentation queries join the last blocks)"


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if str((raw.config or {}).get("model_type", "")) in ("eomt", "eomt_dinov3") or (
            "query.weight" in keys and any(k.startswith("mask_head.") for k in keys)):
        return "hf-eomt"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    cfg = raw.config or {}
    query = sd.get("query.weight")
    queries = int(query.shape[0]) if query is not None and query.ndim == 2 else cfg.get("num_queries", "its")
    blocks = cfg.get("num_blocks", "the last")
    raise UnknownLayoutError(
        f"{raw.path}: transformers EoMT (universal segmentation, {cfg.get('model_type') or 'eomt'}): {queries} "
        f"learned query tokens join the sequence before {blocks} last block(s), so the tokens attended over change "
        "between layers, which the reference ViT's one token set cannot express: not supported yet")
