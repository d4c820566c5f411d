"""transformers BLIP / BLIP-2 / InstructBLIP vision towers (`BlipVisionModel`, `Blip2VisionModel`,
`InstructBlipVisionModel`; keys with or without `vision_model.`) into the canonical layout.

A plain pre-norm ViT: a class token, a biased patch conv, a (1, N+1, D) position table, a fused q/k/v Linear
(`self_attn.qkv`, rows [Wq; Wk; Wv], as timm's) and `self_attn.projection`, no norm before the blocks and
`post_layernorm` at the end. Its pooled output applies `post_layernorm` a second time to the normed class token
(`pooled = LN(LN(x)[:, 0])`, as transformers computes it): the same LayerNorm is `fc_norm` after the token pooling.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename
from vitviz.core.reading.families.clip import hf_vision_hints
from vitviz.core.spec import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-blip",)
DETECT_ORDER = 65   # before clip (70): its embeddings carry CLIP's names, its blocks do not
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "BLIP / BLIP-2 / InstructBLIP vision towers"
PREPROCESS = {"hf-blip": Recipe(1.0, "bicubic", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "squash")}
NAME_HINTS = ((r"blip", "hf-blip", 70),)
HF_MODEL_TYPES = {"blip_vision_model": "hf-blip", "blip_2_vision_model": "hf-blip",
                  "instructblip_vision_model": "hf-blip"}

_RULES = [
    (r"^embeddings\.patch_embedding\.", "patch_embed.proj."), (r"^encoder\.layers\.(\d+)\.", r"blocks.\1."),
    (r"\.layer_norm1\.", ".norm1."), (r"\.layer_norm2\.", ".norm2."), (r"\.self_attn\.qkv\.", ".attn.qkv."),
    (r"\.self_attn\.projection\.", ".attn.proj."), (r"^post_layernorm\.", "norm."),
]


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    stripped = {k.removeprefix("vision_model.") for k in keys}
    if {"embeddings.class_embedding", "embeddings.position_embedding", "encoder.layers.0.self_attn.qkv.weight",
            "encoder.layers.0.self_attn.projection.weight"} <= stripped:
        return "hf-blip"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    vision = {k.removeprefix("vision_model."): v for k, v in sd.items()}
    out = rename({k: v for k, v in vision.items() if not k.startswith("embeddings.") or "patch_embedding" in k},
                 _RULES)
    out["cls_token"] = vision["embeddings.class_embedding"].reshape(1, 1, -1)   # (1, 1, D)
    out["pos_embed"] = vision["embeddings.position_embedding"].reshape(1, -1, out["cls_token"].shape[-1])  # (1, N+1, D)
    if "norm.weight" in out:   # the pooled output: post_layernorm again, on the normed class token
        out["fc_norm.weight"], out["fc_norm.bias"] = out["norm.weight"].clone(), out["norm.bias"].clone()
    cfg = raw.config or {}
    vcfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else cfg
    src = "metadata: config.json" + (" vision_config" if vcfg is not cfg else "")
    hints: dict[str, Hint] = hf_vision_hints(
        vcfg, src, default_act=("gelu", "default: transformers BlipVisionConfig hidden_act gelu"),
        default_eps=(1e-5, "default: transformers BlipVisionConfig layer_norm_eps"))
    hints["pos_prefix"] = (1, "family: BLIP (the table covers the class token)")
    hints["pos_interp"] = ("hf", "family: transformers BLIP (interpolate_pos_encoding: bicubic, no antialias)")
    hints["pooling"] = ("token", "family: BLIP (the pooled output is the class token)")
    return Converted("hf-blip", out, hints, [])
