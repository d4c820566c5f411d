"""Hugging Face SigLIP and SigLIP 2 vision towers (`SiglipVisionModel`, `SiglipModel`, `Siglip2VisionModel`,
`Siglip2Model`).

No class token; the pooled output is the MAP head (`head.probe` + an `nn.MultiheadAttention` + LayerNorm + MLP),
converted to timm's `attn_pool` layout (`latent`, `q`, `kv`, `proj`, `norm`, `mlp`), so its per-head attention
over the patches is captured as `AttentionResult.pool_attention`. SigLIP 2 (NaFlex) embeds flattened patches with a
Linear, in (p1, p2, c) order, folded here into the conv; its position table is resized bilinearly with antialias
(`pos_interp='bilinear_aa'`), which at the stored grid is the table itself: the fixed-size variant is exact, other
sizes follow transformers' resize.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from vitviz.core.checkpoint import RawCheckpoint
from vitviz.core.families.base import Converted, rename_key
from vitviz.core.families.clip import _HF_RENAMES, _split_towers, fuse_qkv, hf_vision_hints

NAMES = ("hf-siglip", "hf-siglip2")


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    stripped = {k.removeprefix("vision_model.") for k in keys}
    if "embeddings.patch_embedding.weight" in stripped and "embeddings.class_embedding" not in stripped and \
            "embeddings.position_embedding.weight" in stripped and \
            any(k.startswith("encoder.layers.") for k in stripped):
        return "hf-siglip"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    if any(k.startswith("vision_model.") for k in sd):
        vision, dropped = _split_towers(sd, ("vision_model.",), raw, "SigLIP")
    else:
        vision, dropped = dict(sd), []
    cfg = raw.config or {}
    vcfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else cfg
    src = "metadata: config.json" + (" vision_config" if vcfg is not cfg else "")
    model_type = str(vcfg.get("model_type") or cfg.get("model_type") or "")
    patch_w = vision["embeddings.patch_embedding.weight"]
    naflex = patch_w.ndim == 2 or model_type.startswith("siglip2")
    out: dict[str, torch.Tensor] = {}
    for k, v in vision.items():
        if k == "embeddings.position_embedding.weight":
            out["pos_embed"] = v.unsqueeze(0)  # (N, D) -> (1, N, D)
        elif k == "embeddings.patch_embedding.weight" and v.ndim == 2:
            out["patch_embed.proj.weight"] = _linear_patch_to_conv(v, vcfg, raw)
        elif k == "embeddings.position_ids":
            dropped.append(k)
        elif k.startswith("head.") or re.search(r"\.self_attn\.[qkv]_proj\.", k):
            continue
        else:
            out[rename_key(k, _HF_RENAMES)] = v
    fuse_qkv(vision, out, "encoder.layers.{i}.self_attn.{n}_proj")
    out.update(_map_head(vision))
    hints = hf_vision_hints(vcfg, src, default_act=("gelu_tanh", "default: transformers SiglipVisionConfig "
                                                                 "hidden_act gelu_pytorch_tanh"),
                            default_eps=(1e-6, "default: transformers SiglipVisionConfig layer_norm_eps"))
    hints["pos_prefix"] = (0, "family: SigLIP (no class token)")
    if naflex:
        hints["pos_interp"] = ("bilinear_aa", "family: transformers SigLIP 2 (position table resized bilinearly, "
                                              "antialias)")
        hints.pop("pos_image_size", None)  # NaFlex: the table's grid is the native size, not config.image_size
        hints["preprocess"] = ({"interpolation": "bilinear"}, "family: transformers Siglip2ImageProcessor")
    else:
        hints["pos_interp"] = ("hf", "family: transformers SigLIP (interpolate_pos_encoding: bicubic)")
    if "attn_pool.latent" not in out:
        hints["pooling"] = ("avg", "family: a SigLIP tower without its head (vision_use_head=False): the mean of the "
                                   "patch tokens")
    return Converted("hf-siglip2" if naflex else "hf-siglip", out, hints, dropped)


def _linear_patch_to_conv(w: torch.Tensor, vcfg: dict[str, Any], raw: RawCheckpoint) -> torch.Tensor:
    """SigLIP 2's Linear over flattened (p1, p2, c) patches (D, P*P*C) -> the equivalent conv weight (D, C, P, P)."""
    from vitviz.errors import InconsistentCheckpointError

    d, n = w.shape
    c = int(vcfg.get("num_channels", 3))
    p = int(round((n / c) ** 0.5))
    if p * p * c != n:
        raise InconsistentCheckpointError(f"{raw.path}: SigLIP 2 patch embedding of width {n} is not {c} channels x "
                                          "a square patch; expected num_channels * patch_size**2")
    return w.reshape(d, p, p, c).permute(0, 3, 1, 2).contiguous()  # (D, P, P, C) -> (D, C, P, P)


def _map_head(vision: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' `SiglipMultiheadAttentionPoolingHead` -> timm `attn_pool` keys (in_proj split into q and kv)."""
    if "head.probe" not in vision:
        return {}
    w, b = vision["head.attention.in_proj_weight"], vision["head.attention.in_proj_bias"]
    d = w.shape[1]
    out = {"attn_pool.latent": vision["head.probe"], "attn_pool.q.weight": w[:d], "attn_pool.q.bias": b[:d],
           "attn_pool.kv.weight": w[d:], "attn_pool.kv.bias": b[d:]}  # rows [Wq; Wk; Wv]
    for src, dst in (("head.attention.out_proj", "attn_pool.proj"), ("head.layernorm", "attn_pool.norm"),
                     ("head.mlp.fc1", "attn_pool.mlp.fc1"), ("head.mlp.fc2", "attn_pool.mlp.fc2")):
        for kind in ("weight", "bias"):
            out[f"{dst}.{kind}"] = vision[f"{src}.{kind}"]
    return out
