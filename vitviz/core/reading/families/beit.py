"""BEiT, BEiT v2 and data2vec-vision: timm / microsoft-unilm files and transformers folders.

The attention adds a relative position bias per head, gathered from a table of (2gh-1)(2gw-1) + 3 rows (the last
three: cls->token, token->cls, cls->cls) -- one table per block (`rel_pos='layer'`) or one shared by all
(`'shared'`). q and v have biases, k has none (timm `q_bias` / `v_bias`, transformers' bias-free `key`); layer
scale (`gamma_1` / `lambda_1`); mean pooling with `fc_norm` (transformers: `pooler.layernorm`). At another grid the
tables are resampled as the family does: timm's / unilm's geometric-progression interpolation, or transformers'
bilinear one.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename
from vitviz.core.reading.families.clip import HF_ACT, fuse_qkv
from vitviz.core.spec import INCEPTION_MEAN, INCEPTION_STD
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("beit", "hf-beit", "hf-data2vec-vision")
DETECT_ORDER = 40   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "BEiT, data2vec-vision"
PREPROCESS = {"beit": Recipe(0.9, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "center"),
              "hf-beit": Recipe(1.0, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "squash"),
              "hf-data2vec-vision": Recipe(1.0, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "squash")}
REGISTERED_SIZES = True
NAME_HINTS = ((r"beit", "beit", 50),)
HF_MODEL_TYPES = {"beit": "hf-beit", "data2vec-vision": "hf-data2vec-vision"}

_HF_RULES = [
    (r"^embeddings\.cls_token$", "cls_token"), (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^encoder\.relative_position_bias\.", "rel_pos_bias."),
    (r"^encoder\.layer\.(\d+)\.", r"blocks.\1."),
    (r"\.attention\.attention\.relative_position_bias\.relative_position_bias_table$",
     ".attn.relative_position_bias_table"),
    (r"\.attention\.output\.dense\.", ".attn.proj."), (r"\.layernorm_before\.", ".norm1."),
    (r"\.layernorm_after\.", ".norm2."), (r"\.intermediate\.dense\.", ".mlp.fc1."), (r"\.output\.dense\.", ".mlp.fc2."),
    (r"\.lambda_([12])$", r".ls\1.gamma"), (r"^pooler\.layernorm\.", "fc_norm."), (r"^layernorm\.", "norm."),
    (r"^classifier\.", "head."),
]
_HF_V5 = [  # transformers >= 5 in-memory names -> the names its files use
    (r"^layers\.(\d+)\.", r"encoder.layer.\1."), (r"\.attention\.q_proj\.", ".attention.attention.query."),
    (r"\.attention\.k_proj\.", ".attention.attention.key."), (r"\.attention\.v_proj\.", ".attention.attention.value."),
    (r"\.attention\.o_proj\.", ".attention.output.dense."), (r"\.mlp\.fc1\.", ".intermediate.dense."),
    (r"\.mlp\.fc2\.", ".output.dense."),
    (r"^(encoder\.layer\.\d+)\.relative_position_bias\.", r"\1.attention.attention.relative_position_bias."),
]


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if "patch_embed.proj.weight" in keys and any(k.endswith("relative_position_bias_table") for k in keys) and \
            not any(".rel_pos.relative_position_bias_table" in "." + k for k in keys):  # timm vit_relpos_*: eva's
        return "beit"
    stripped = {re.sub(r"^(beit|data2vec_vision)\.", "", k) for k in keys}
    hf = "embeddings.patch_embeddings.projection.weight" in stripped
    if hf and (any(k.endswith("relative_position_bias_table") or re.search(r"\.lambda_[12]$", k) for k in stripped)
               or any(k.startswith("pooler.layernorm.") for k in stripped)
               or str((raw.config or {}).get("model_type", "")) in ("beit", "data2vec-vision")):
        return "hf-beit"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    if detect(set(sd), raw) == "hf-beit" or (family or "").startswith("hf-"):
        return _convert_hf(sd, raw)
    return _convert_timm(sd, raw)


def _convert_timm(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    """timm `Beit` and microsoft/unilm BEiT / BEiT v2 files (same names; unilm keeps `relative_position_index`)."""
    import torch

    if any(".mlp.fc1_g." in k or ".mlp.norm." in k for k in sd):
        raise UnknownLayoutError(f"{raw.path}: a BEiT with a SwiGLU / normed MLP (BEiT-3 style); expected BEiT, BEiT "
                                 "v2 or data2vec-vision blocks")
    dropped = [k for k in sd if k.endswith("relative_position_index") or k.startswith(("mask_token", "lm_head."))]
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k in dropped:
            continue
        k = re.sub(r"\.gamma_([12])$", r".ls\1.gamma", k)
        out[k] = v
    for i in sorted({int(m.group(1)) for k in out if (m := re.match(r"blocks\.(\d+)\.attn\.q_bias$", k))}):
        b = f"blocks.{i}.attn."
        q, v = out.pop(b + "q_bias"), out.pop(b + "v_bias")
        out[b + "qkv.bias"] = torch.cat([q, torch.zeros_like(q), v])  # BEiT's k bias is fixed at 0
    hints: dict[str, Hint] = {
        "pos_interp": ("timm", "family: timm BEiT (bicubic, antialias)"),
        "rel_pos_interp": ("timm", "family: timm / unilm BEiT (geometric-progression table resampling)"),
        "pos_prefix": (1, "family: BEiT (the table covers the class token)"),
    }
    return Converted("beit", out, hints, dropped)


def _convert_hf(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    """transformers BeitModel / BeitForImageClassification / Data2VecVision*, file or in-memory names."""
    cfg = raw.config or {}
    model_type = str(cfg.get("model_type") or ("data2vec-vision" if any(k.startswith("data2vec_vision.") for k in sd)
                                               else "beit"))
    sd = {re.sub(r"^(beit|data2vec_vision)\.", "", k): v for k, v in sd.items()}
    for pattern, repl in _HF_V5:
        sd = {re.sub(pattern, repl, k): v for k, v in sd.items()}
    dropped = [k for k in sd if k.startswith(("embeddings.mask_token", "lm_head", "layernorm_lm"))]
    out = rename({k: v for k, v in sd.items()
                  if k not in dropped and not re.search(r"\.attention\.attention\.(query|key|value)\.", k)}, _HF_RULES)
    tmp: dict[str, torch.Tensor] = {}
    fuse_qkv({re.sub(r"\.(query|key|value)\.", lambda m: "." + m.group(1)[0] + ".", k): v for k, v in sd.items()},
             tmp, "encoder.layer.{i}.attention.attention.{n}")
    out.update(tmp)
    src = "metadata: config.json" if cfg else f"family: transformers {model_type} config defaults"
    hints: dict[str, Hint] = {
        "eps": (float(cfg.get("layer_norm_eps", 1e-12)), src if "layer_norm_eps" in cfg else
                "default: transformers BeitConfig layer_norm_eps 1e-12"),
        "pos_interp": ("hf", "family: transformers BEiT (interpolate_pos_encoding: bicubic)"),
        "rel_pos_interp": ("hf", "family: transformers BEiT (bilinear table resampling)"),
        "pos_prefix": (1, "family: BEiT (the table covers the class token)"),
    }
    act = cfg.get("hidden_act", "gelu")
    hints["mlp_kind"] = (HF_ACT.get(act, act), src)
    if cfg.get("num_attention_heads"):
        hints["num_heads"] = (int(cfg["num_attention_heads"]), src)
    if cfg.get("image_size"):
        s = cfg["image_size"]
        hints["pos_image_size"] = ((s, s) if isinstance(s, int) else tuple(s), src)
    labels = cfg.get("id2label")
    if isinstance(labels, dict):
        labels = tuple(str(v) for _, v in sorted(((int(k), v) for k, v in labels.items()), key=lambda kv: kv[0]))
    if labels and out.get("head.weight") is not None and len(labels) == out["head.weight"].shape[0]:
        hints["labels"] = (tuple(labels), src)
    if "fc_norm.weight" in out:
        hints["pooling"] = ("avg", "shape: pooler.layernorm (use_mean_pooling: the mean of the patches, then a norm)")
    else:
        hints["pooling"] = ("token", "family: transformers BEiT without mean pooling (the normed CLS token)")
    return Converted("hf-data2vec-vision" if model_type.startswith("data2vec") else "hf-beit", out, hints, dropped)
