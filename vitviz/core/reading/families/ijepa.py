"""transformers I-JEPA (`IJepaModel`, `IJepaForImageClassification`, model_type `ijepa`): a ViT with no CLS token,
whose position table covers the patches only.

Its keys are transformers ViT's (the `hf` reader renames and fuses them); what differs is said here: no prefix
token covered by the table (issue 31: it was read as if it had one, and the table "did not fit the grid"), and
pooling by the mean of the final norm's tokens (IJepaForImageClassification's classifier input; a backbone's
features likewise). A file without config.json that has transformers ViT keys but no CLS token is this layout
(HF ViT always has one), said as derived from the layout.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families import hf
from vitviz.core.reading.families.base import Converted, Hint, Recipe
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-ijepa",)
DETECT_ORDER = 46   # before hf (50): the same key names, no CLS token
HELP = "transformers I-JEPA (no CLS token)"
# facebook/ijepa_* ship a ViTImageProcessor: resize 224 (shortest edge 256 then crop for the in22k ones), ImageNet
# statistics; the preprocessor_config.json beside a folder wins over this
PREPROCESS = {"hf-ijepa": Recipe(1.0, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "squash")}
# REGISTERED_SIZES False (the default): I-JEPA's sizes (ViT-H/14 at 1280 / 16 heads, ViT-G) are not the
# registered table's
NAME_HINTS = ((r"ijepa|i-jepa", "hf-ijepa", 90),)
HF_MODEL_TYPES = {"ijepa": "hf-ijepa"}

FAM = "family: transformers I-JEPA"


def _strip(key: str) -> str:
    """IJepaForImageClassification keeps the backbone under `ijepa.`."""
    return key[len("ijepa."):] if key.startswith("ijepa.") else key


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    keys = {_strip(k) for k in keys}
    if hf.detect(keys, raw) is None:
        return None
    model_type = (raw.config or {}).get("model_type")
    if model_type == "ijepa":
        return "hf-ijepa"
    if model_type is None and not any(k.endswith("embeddings.cls_token") for k in keys) and \
            any(k.endswith("embeddings.position_embeddings") for k in keys):
        return "hf-ijepa"   # transformers ViT keys without a CLS token: I-JEPA's layout
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    import math

    from vitviz.errors import UnknownLayoutError

    base = hf.convert({_strip(k): v for k, v in sd.items()}, raw, family, overrides)
    named = (raw.config or {}).get("model_type") == "ijepa"
    pos = base.tensors.get("pos_embed")
    rows = int(pos.shape[1]) if pos is not None and pos.ndim == 3 else 0
    if not named and rows and math.isqrt(rows) ** 2 != rows:
        raise UnknownLayoutError(
            f"{raw.path}: transformers ViT keys without a CLS token and a {rows}-row position table, and no "
            "config.json naming the model: I-JEPA's table covers a square grid of patches, ViTPose's has a CLS row "
            f"added to every patch ({rows - 1} patches, a non-square grid such as 16 x 12). Keep the model's "
            "config.json beside the file (its model_type, 'ijepa' or 'vitpose', says which)")
    src = FAM if named else "layout: transformers ViT keys without a CLS token (I-JEPA's)"
    hints: dict[str, Hint] = dict(base.hints)
    hints["pos_prefix"] = (0, f"{src} (no CLS token; the position table covers the patches only)")
    hints["pos_interp"] = ("hf", f"{src} (bicubic to the new grid, align_corners=False)")
    hints["pooling"] = ("avg", f"{src} (the mean of the final norm's tokens, all of them patches)")
    return Converted("hf-ijepa", base.tensors, hints, base.dropped)
