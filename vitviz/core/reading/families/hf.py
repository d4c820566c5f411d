"""Hugging Face transformers ViT / DeiT / DINOv2 (with and without registers) into the canonical layout."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Recipe, rename
from vitviz.core.spec import INCEPTION_MEAN, INCEPTION_STD

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf",)
DETECT_ORDER = 50   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "transformers ViT, DeiT, DINOv2, MAE, MSN"
PREPROCESS = {"hf": Recipe(1.0, "bilinear", INCEPTION_MEAN, INCEPTION_STD, "squash")}
REGISTERED_SIZES = True
# No NAME_HINTS: its repositories name their model_type in config.json
HF_MODEL_TYPES = {"vit": "hf-vit", "deit": "hf-deit", "dinov2": "hf-dinov2", "dinov2_with_registers": "hf-dinov2",
                  "vit_mae": "hf-vit_mae", "vit_msn": "hf-vit_msn"}
# (input size, why): the size it is evaluated at when its position table was trained larger
EVAL_SIZE = {"hf-dinov2": (224, "DINOv2 evaluation size")}

HF_ACT = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
          "gelu_pytorch_tanh": "gelu_tanh", "gelu_accurate": "gelu_tanh", "quick_gelu": "quick_gelu",
          "relu": "relu", "silu": "silu", "swish": "silu", "tanh": "tanh"}
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

_RULES = [
    (r"^embeddings\.cls_token$", "cls_token"), (r"^embeddings\.distillation_token$", "dist_token"),
    (r"^embeddings\.register_tokens$", "reg_token"), (r"^embeddings\.position_embeddings$", "pos_embed"),
    (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"^encoder\.layer\.(\d+)\.", r"blocks.\1."),
    (r"\.layernorm_before\.", ".norm1."), (r"\.layernorm_after\.", ".norm2."),
    (r"\.attention\.output\.dense\.", ".attn.proj."),
    (r"\.intermediate\.dense\.", ".mlp.fc1."), (r"\.output\.dense\.", ".mlp.fc2."),
    (r"\.mlp\.weights_in\.", ".mlp.fc1."), (r"\.mlp\.weights_out\.", ".mlp.fc2."),
    (r"\.layer_scale([12])\.lambda1$", r".ls\1.gamma"),
    (r"^layernorm\.", "norm."), (r"^classifier\.", "head."), (r"^cls_classifier\.", "head."),
    (r"^distillation_classifier\.", "head_dist."),
]


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    stripped = {re.sub(r"^(vit|deit|dinov2|dinov2_with_registers)\.", "", k) for k in keys}
    if "embeddings.patch_embeddings.projection.weight" not in stripped:
        return None
    # transformers' own blocks (files: encoder.layer.N; transformers >= 5 in memory: layers.N); tutorials that
    # borrow the embedding names but write their own blocks are left to the structural reader
    return "hf" if any(re.match(r"^(encoder\.layer|layers)\.\d+\.", k) for k in stripped) else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    cfg = raw.config or {}
    model_type = str(cfg.get("model_type") or _guess_model_type(sd))
    sd = {re.sub(r"^(vit|deit|dinov2_with_registers|dinov2)\.", "", k): v for k, v in sd.items()}
    sd = {_legacy_name(k): v for k, v in sd.items()}
    dropped = [k for k in sd if k.startswith(("embeddings.mask_token", "pooler."))]
    sd = {k: v for k, v in sd.items() if k not in dropped}
    separate_qkv = re.compile(r"^(encoder\.layer\.\d+)\.attention\.attention\.(query|key|value)\.(weight|bias)$")
    out = rename({k: v for k, v in sd.items() if not separate_qkv.match(k)}, _RULES)   # q/k/v are fused below
    _fuse_qkv(sd, out)
    family = HF_MODEL_TYPES.get(model_type, f"hf-{model_type}")
    hints = _hf_hints(cfg, raw, model_type, out)
    if any(k.startswith("pooler.dense.") for k in dropped) and "pooling" not in hints:
        hints["pooling"] = ("token", f"family: HF {model_type}: the features shown are the normed CLS token of "
                                     "last_hidden_state; its pooler (pooler.dense + tanh: pooler_output) is not "
                                     "applied")
    return Converted(family, out, hints, dropped)


def _legacy_name(key: str) -> str:
    """transformers >= 5 in-memory names (`layers.N.attention.q_proj`) -> the names its files use."""
    key = re.sub(r"^layers\.(\d+)\.", r"encoder.layer.\1.", key)
    key = re.sub(r"\.attention\.q_proj\.", ".attention.attention.query.", key)
    key = re.sub(r"\.attention\.k_proj\.", ".attention.attention.key.", key)
    key = re.sub(r"\.attention\.v_proj\.", ".attention.attention.value.", key)
    return re.sub(r"\.attention\.o_proj\.", ".attention.output.dense.", key)


def _fuse_qkv(sd: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> None:
    import torch

    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(r"^encoder\.layer\.(\d+)\.attention\.attention\.", k))})
    for i in layers:
        base = f"encoder.layer.{i}.attention.attention."
        for kind in ("weight", "bias"):
            parts = [sd.get(f"{base}{n}.{kind}") for n in ("query", "key", "value")]
            if all(p is not None for p in parts):
                out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts, dim=0)  # rows [Wq; Wk; Wv]


def _guess_model_type(sd: dict[str, torch.Tensor]) -> str:
    keys = " ".join(sd)
    if "register_tokens" in keys:
        return "dinov2_with_registers"
    if "layer_scale1" in keys or "dinov2." in keys:
        return "dinov2"
    if "distillation_token" in keys:
        return "deit"
    return "vit"


def _hf_hints(cfg: dict[str, Any], raw: RawCheckpoint, model_type: str,
              out: dict[str, torch.Tensor]) -> dict[str, tuple[Any, str]]:
    src = "metadata: config.json"
    hints: dict[str, tuple[Any, str]] = {}
    if "num_attention_heads" in cfg:
        hints["num_heads"] = (int(cfg["num_attention_heads"]), src)
    hints["eps"] = (float(cfg["layer_norm_eps"]), src) if "layer_norm_eps" in cfg else \
        ((1e-6, "default: HF DINOv2") if model_type.startswith("dinov2") else (1e-12, "default: HF ViTConfig"))
    act = cfg.get("hidden_act", "gelu")
    if cfg.get("use_swiglu_ffn"):
        hints["mlp_kind"] = ("swiglu", src)
    elif isinstance(act, str):
        hints["mlp_kind"] = (HF_ACT.get(act, act), src)
    if "image_size" in cfg:
        s = cfg["image_size"]
        hints["pos_image_size"] = ((s, s) if isinstance(s, int) else tuple(s), src)
    labels = _id2label(cfg.get("id2label"))
    if labels and out.get("head.weight") is not None and len(labels) == out["head.weight"].shape[0]:
        hints["labels"] = (labels, src)
    hints["pos_prefix"] = (2 if model_type == "deit" else 1, f"family: HF {model_type}")
    hints["pos_interp"] = ("dinov2_reg" if model_type == "dinov2_with_registers" else "bilinear" if model_type == "dpt"
                           else "hf", f"family: HF {model_type}")
    head = out.get("head.weight")
    if model_type.startswith("dinov2") and head is not None and head.shape[1] == 2 * out["cls_token"].shape[-1]:
        hints["pooling"] = ("cls_avg", "shape: classifier takes [cls, mean(patches)]")
    pre = _hf_preprocess(raw.preprocessor)
    if pre:
        hints["preprocess"] = (pre, "metadata: preprocessor_config.json")
    return hints


def _id2label(value: Any) -> tuple[str, ...]:
    """config.json `id2label` as names in index order: a {index: name} dict, or the tuple the config check
    (`vitviz.core.reading.validate`) normalises it to."""
    if isinstance(value, dict):
        try:
            return tuple(str(v) for _, v in sorted(((int(k), v) for k, v in value.items()), key=lambda kv: kv[0]))
        except (TypeError, ValueError):
            return ()
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    return ()


def _hf_preprocess(pp: dict[str, Any] | None) -> dict[str, Any]:
    """Fields for `Preprocess` from a preprocessor_config.json (ViT squash, DeiT/BiT resize+crop)."""
    if not pp:
        return {}
    size = pp.get("size", 224)
    size = {"height": size, "width": size} if isinstance(size, int) else dict(size)
    out: dict[str, Any] = {"interpolation": PIL_RESAMPLE.get(int(pp.get("resample", 2)), "bilinear")}
    crop = pp.get("crop_size")
    crop = {"height": crop, "width": crop} if isinstance(crop, int) else crop
    if pp.get("do_center_crop") and crop:
        out["crop"] = (int(crop["height"]), int(crop["width"]))
        if "shortest_edge" in size:
            out["resize"], out["mode"] = int(size["shortest_edge"]), "center"
        else:  # DeiT: squash to size, then center crop
            out["resize"], out["mode"] = min(int(size["height"]), int(size["width"])), "squash_crop"
    elif "height" in size:
        out["crop"] = (int(size["height"]), int(size["width"]))
        out["resize"] = min(out["crop"])
        out["mode"] = "squash"
    if pp.get("do_normalize", True) and "image_mean" in pp:
        out["mean"], out["std"] = tuple(pp["image_mean"]), tuple(pp["image_std"])
    elif not pp.get("do_normalize", True):
        out["mean"], out["std"] = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    return out
