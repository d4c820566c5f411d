"""transformers InternViT (`InternVLVisionModel`, model_type `internvl_vision`: the vision tower of InternVL, read
from an InternVL folder's `model.vision_tower.` by `vitviz.core.reading.towers`).

A pre-norm ViT with a CLS token, a learned position table over [CLS, patches], separate q/k/v projections
(`attention_bias`), `projection_layer` as the attention's output, layer scale (`lambda_1`, `lambda_2`) and a final
LayerNorm unless `use_mean_pooling` (then none: the last block's tokens are the output). Its keys look like
BEiT's (`layernorm_before`, `lambda_1`), so it is detected before that reader, by `projection_layer` /
`q_proj`. Its output is `last_hidden_state`, no pooler: vitviz shows the CLS token of it as the features.

What the reference ViT does not compute is refused by name, with the route: q/k norm (`use_qk_norm`: an RMSNorm
over the whole width before the heads are split, InternViT-6B's), and RMSNorm blocks (`norm_type: rms_norm`) beside
a final LayerNorm.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename
from vitviz.core.reading.families.clip import fuse_qkv
from vitviz.core.reading.families.hf import HF_ACT, _hf_preprocess
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-internvit",)
DETECT_ORDER = 39   # before beit (40): its blocks carry BEiT's norm and layer-scale names
HELP = "transformers InternViT (InternVL's vision tower)"
# InternVL's processor: the image resized to 448 x 448 as a whole (tiles aside), ImageNet statistics
PREPROCESS = {"hf-internvit": Recipe(1.0, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "squash")}
# REGISTERED_SIZES False (the default): InternViT-300M is 1024 wide with 16 heads, 6B 3200 with 25: not the
# registered table's
NAME_HINTS = ((r"internvit|internvl", "hf-internvit", 85),)
HF_MODEL_TYPES = {"internvl_vision": "hf-internvit"}

FAM = "family: transformers InternViT"
ROUTE = ("open it with its own code: build transformers.InternVLVisionModel (or InternVLModel's vision_tower) and "
         "pass it to vitviz.load(module) in Python, or --code FILE.py:FACTORY on the command line")

_RULES = [
    (r"^embeddings\.cls_token$", "cls_token"), (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^encoder\.layer\.(\d+)\.", r"blocks.\1."), (r"\.attention\.projection_layer\.", ".attn.proj."),
    (r"\.layernorm_before\.", ".norm1."), (r"\.layernorm_after\.", ".norm2."),
    (r"\.lambda_([12])$", r".ls\1.gamma"), (r"^layernorm\.", "norm."),
]


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if (raw.config or {}).get("model_type") == "internvl_vision":
        return "hf-internvit"
    if any(re.match(r"^encoder\.layer\.\d+\.attention\.projection_layer\.", k) for k in keys) and \
            any(re.match(r"^encoder\.layer\.\d+\.attention\.q_proj\.", k) for k in keys):
        return "hf-internvit"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    cfg = raw.config or {}
    cfg = cfg["vision_config"] if isinstance(cfg.get("vision_config"), dict) else cfg
    named = "metadata: config.json" if cfg.get("model_type") == "internvl_vision" else \
        "layout: transformers InternViT keys (projection_layer, q_proj, lambda_1)"
    if cfg.get("use_qk_norm") or any(".attention.q_norm." in k for k in sd):
        raise UnknownLayoutError(
            f"{raw.path}: transformers InternViT with q/k norm (use_qk_norm: an RMSNorm over the whole attention "
            "width before the heads are split, InternViT-6B's): the reference ViT norms each head's q and k, so it "
            f"cannot compute this exactly. {ROUTE}; vitviz then shows its attention as its own code computes it")
    rms = cfg.get("norm_type") == "rms_norm" or any(
        re.match(r"^encoder\.layer\.\d+\.layernorm_before\.weight$", k) for k in sd) and not any(
        re.match(r"^encoder\.layer\.\d+\.layernorm_before\.bias$", k) for k in sd)
    if rms and "layernorm.weight" in sd:
        raise UnknownLayoutError(
            f"{raw.path}: transformers InternViT with RMSNorm blocks (norm_type 'rms_norm') and a final LayerNorm: "
            f"the reference ViT uses one kind of norm throughout. {ROUTE}")
    dropped = [k for k in sd if k == "embeddings.mask_token"]
    out = rename({k: v for k, v in sd.items() if k not in dropped and not re.search(r"\.attention\.[qkv]_proj\.", k)},
                 _RULES)
    fuse_qkv(sd, out, "encoder.layer.{i}.attention.{n}_proj")
    act = str(cfg.get("hidden_act", "gelu"))
    src = named if cfg else f"{FAM} defaults"
    hints: dict[str, Hint] = {
        "eps": (float(cfg.get("layer_norm_eps", 1e-6)), src),
        "mlp_kind": (HF_ACT.get(act, act), f"{src} (hidden_act {act!r})"),
        "pos_prefix": (1, f"{src} (the position table covers [CLS, patches])"),
        "pos_interp": ("hf", f"{FAM} (bicubic to the new grid, align_corners=False)"),
        "pooling": ("token", f"{FAM} (no pooler: the CLS token of last_hidden_state"
                             f"{', after the final LayerNorm' if 'layernorm.weight' in sd else ''})"),
    }
    if rms:
        hints["norm_kind"] = ("rms", f"{src} (InternVLVisionRMSNorm: weight only)")
    if cfg.get("num_attention_heads"):
        hints["num_heads"] = (int(cfg["num_attention_heads"]), src)
    size = cfg.get("image_size")
    if size:
        hints["pos_image_size"] = ((size, size) if isinstance(size, int) else tuple(size), src)
    pre = _hf_preprocess(raw.preprocessor)
    if pre:
        hints["preprocess"] = (pre, "metadata: preprocessor_config.json")
    return Converted("hf-internvit", out, hints, dropped)
