"""transformers ViTPose (`VitPoseForPoseEstimation`, `VitPoseBackbone`): a plain ViT backbone with two quirks.

- No CLS token, but a position table with a CLS row: `embeddings + pos[:, 1:] + pos[:, :1]`, so row 0 is added to
  every patch. The table is folded here (patch rows + row 0) into a patches-only table, exactly what the
  original adds (issue 31: it used to end in an error about a table that does not fit the grid).
- The patch projection conv is zero-padded by 2 px (`padding=2`, ViTPose's own PatchEmbed): each patch is
  shifted up-left by 2 px (`spec.patch_pad`).

The backbone's settings are in config.json's `backbone_config` (model_type `vitpose`) or at its top level
(`vitpose_backbone`); the keypoint head (`head.*`) is not part of the ViT and is dropped. ViTPose+ (`num_experts`
> 1) chooses part of every MLP by a dataset index, which the reference ViT does not express: refused by name.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families import hf
from vitviz.core.reading.families.base import Converted, Hint, Recipe
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-vitpose",)
DETECT_ORDER = 45   # before hf (50): the same key names, with the folded table and padded patch conv
HELP = "transformers ViTPose (pose estimation backbone)"
PREPROCESS = {"hf-vitpose": Recipe(1.0, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "squash")}
REGISTERED_SIZES = True
NAME_HINTS = ((r"vitpose", "hf-vitpose", 90),)
HF_MODEL_TYPES = {"vitpose": "hf-vitpose", "vitpose_backbone": "hf-vitpose"}

PATCH_PAD = 2   # ViTPose's PatchEmbed: Conv2d(..., kernel=stride=patch, padding=2) (transformers and mmpose)


def backbone_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The ViTPose backbone's config and where it is (`backbone_config` of a `vitpose` model)."""
    inner = cfg.get("backbone_config")
    if cfg.get("model_type") == "vitpose" and isinstance(inner, dict):
        return inner, "metadata: config.json backbone_config"
    return cfg, "metadata: config.json"


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    cfg = raw.config or {}
    inner, _ = backbone_config(cfg)
    if str(inner.get("model_type", cfg.get("model_type", ""))) not in HF_MODEL_TYPES and \
            cfg.get("model_type") not in HF_MODEL_TYPES:
        return None
    return "hf-vitpose" if "embeddings.patch_embeddings.projection.weight" in keys else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    cfg, src = backbone_config(raw.config or {})
    experts = int(cfg.get("num_experts", 1) or 1)
    if experts > 1 or any(".mlp.experts." in k for k in sd):
        raise UnknownLayoutError(
            f"{raw.path}: ViTPose+ (transformers VitPose with num_experts={experts}): part of every block's MLP is "
            "chosen per dataset by `dataset_index`, which the reference ViT does not express, and every layer after "
            "the first depends on it: not supported yet (ViTPose with num_experts=1 opens)")
    base = hf.convert(sd, raw, family, overrides)
    out = base.tensors
    if "cls_token" in out:
        raise UnknownLayoutError(f"{raw.path}: a ViTPose config with a CLS token in the file; ViTPose has none")
    pos = out.get("pos_embed")
    hints: dict[str, Hint] = {k: ((v[0], src) if v[1] == "metadata: config.json" else v)
                              for k, v in hf._hf_hints(cfg, raw, "vitpose_backbone", out).items()}
    named = "family: transformers ViTPose"
    if pos is not None:
        # embeddings + pos[:, 1:] + pos[:, :1]: row 0 belongs to no token, it is added to every patch
        out["pos_embed"] = pos[:, 1:] + pos[:, :1]
        hints["pos_prefix"] = (0, f"{named} (no CLS token; the table's CLS row is added to every patch and is "
                                  "folded into the patch rows)")
    hints["patch_pad"] = (PATCH_PAD, f"{named} (its patch projection conv pads 2 px)")
    hints["pooling"] = ("avg", f"{named} (no CLS token: the patches' average of the final norm's output)")
    return Converted("hf-vitpose", out, hints, base.dropped)
