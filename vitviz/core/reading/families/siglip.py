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
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename_key
from vitviz.core.reading.families.clip import _HF_RENAMES, _split_towers, fuse_qkv, hf_vision_hints
from vitviz.core.spec import INCEPTION_MEAN, INCEPTION_STD
from vitviz.core.reading.towers import BUCKETED

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-siglip", "hf-siglip2", "timm-naflex")
DETECT_ORDER = 80   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "SigLIP image towers"
PREPROCESS = {"siglip": Recipe(1.0, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "squash"),
              "hf-siglip": Recipe(1.0, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "squash"),
              "hf-siglip2": Recipe(1.0, "bilinear", INCEPTION_MEAN, INCEPTION_STD, "squash")}
REGISTERED_SIZES = True
NAME_HINTS = ((r"siglip", "siglip", 80),)
HF_MODEL_TYPES = {"siglip": "hf-siglip", "siglip_vision_model": "hf-siglip", "siglip2": "hf-siglip2",
                  "siglip2_vision_model": "hf-siglip2"}


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if {"embeds.proj.weight", "embeds.pos_embed"} <= keys and any(k.startswith("blocks.") for k in keys):
        return "timm-naflex"
    stripped = {k.removeprefix("vision_model.") for k in keys}
    if "embeddings.patch_embedding.weight" in stripped and "embeddings.class_embedding" not in stripped and \
            "embeddings.position_embedding.weight" in stripped and \
            any(k.startswith("encoder.layers.") for k in stripped):
        return "hf-siglip"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    if detect(set(sd), raw) == "timm-naflex" or family == "timm-naflex":
        return _convert_naflex(sd, raw)
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
            channels = int(vcfg.get("num_channels", 3))
            out["patch_embed.proj.weight"] = _linear_patch_to_conv(v, channels, raw, "SigLIP 2")
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
    elif model_type in BUCKETED:   # Idefics3 / SmolVLM: each patch looks its row up by bucketed coordinates
        hints["pos_interp"] = ("bucket", f"family: transformers {model_type} (position rows looked up by bucketed "
                                         "fractional patch coordinates)")
        _bucket_native(out)
    else:
        hints["pos_interp"] = ("hf", "family: transformers SigLIP (interpolate_pos_encoding: bicubic)")
    if "attn_pool.latent" not in out:
        hints["pooling"] = ("avg", "family: a SigLIP tower without its head (vision_use_head=False): the mean of the "
                                   "patch tokens")
        if model_type == "janus_vision_model":
            hints["pooling"] = ("avg", "family: Janus's SigLIP tower: the features shown are the mean of its normed "
                                       "tokens (its aligner takes every token); JanusVisionModel's pooler_output (the "
                                       "first token normed twice) is not computed")
    return Converted("hf-siglip2" if naflex else "hf-siglip", out, hints, dropped)


def _bucket_native(out: dict[str, torch.Tensor]) -> None:
    """The stored table in the row order Idefics3 / SmolVLM look it up at its own grid (the identity for most
    sizes, not for all: their float32 bucketing repeats a row at some, e.g. 25 patches a side). Other grids look
    their rows up in this table: exact where the native lookup is the identity (26 and 32 patches a side, the
    released models' sizes), not where it repeats a row."""
    from vitviz.core.posembed import bucket_ids

    table = out["pos_embed"]  # (1, n*n, D)
    n = int(round(table.shape[1] ** 0.5))
    if n * n == table.shape[1]:
        out["pos_embed"] = table[:, bucket_ids((n, n), (n, n))]


def _linear_patch_to_conv(w: torch.Tensor, channels: int, raw: RawCheckpoint, what: str,
                          channels_last: bool = True) -> torch.Tensor:
    """A Linear over flattened patches (D, P*P*C), in (p1, p2, c) order (`channels_last`: SigLIP 2's, NaFlexVit's
    `patchify_channels_last` default) or (c, p1, p2), -> the equivalent conv weight (D, C, P, P); `what` names the
    layout in a refusal."""
    from vitviz.errors import InconsistentCheckpointError

    d, n = w.shape
    p = int(round((n / channels) ** 0.5))
    if p * p * channels != n:
        raise InconsistentCheckpointError(f"{raw.path}: {what} patch embedding of width {n} is not {channels} "
                                          "channels x a square patch; expected channels * patch_size**2")
    if channels_last:
        return w.reshape(d, p, p, channels).permute(0, 3, 1, 2).contiguous()  # (D, P, P, C) -> (D, C, P, P)
    return w.reshape(d, channels, p, p).contiguous()


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


# ------------------------------------------------------------------------------------------- timm NaFlexVit
# timm's registered NaFlexVit configs with the standard blocks, learned 2-D table and plain patch Linear:
# (activation, position resampling recipe); the others (parallel blocks, factorised tables, RADIO) are refused
_NAFLEX_ARCHS = {"naflexvit_base_patch16_siglip": ("gelu_tanh", "bilinear_aa"),
                 "naflexvit_so400m_patch16_siglip": ("gelu_tanh", "bilinear_aa"),
                 "naflexvit_base_patch16_gap": ("gelu", "timm"), "naflexvit_base_patch16_map": ("gelu", "timm"),
                 "naflexvit_so150m2_patch16_reg1_gap": ("gelu", "timm"),
                 "naflexvit_so150m2_patch16_reg1_map": ("gelu", "timm")}
_NAFLEX_ARGS = frozenset(("pos_embed_interp_mode", "pos_embed_antialias", "patchify_channels_last", "embed_proj_type",
                          "pos_embed_grid_size", "enable_patch_interpolator", "pos_embed_use_grid_sample",
                          "pos_embed_ar_preserving", "pos_embed_align_corners"))


def _convert_naflex(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    """timm's `NaFlexVit` (`naflexvit_*`, e.g. SigLIP 2 NaFlex): `embeds.proj` (a Linear over (p1, p2, c)
    patches, or a conv), `embeds.pos_embed` (1, gh, gw, D) added to the patches only, then `embeds.cls_token` /
    `reg_token` in front; timm's own blocks, norms and MAP head. At one image of a whole number of patches (what
    vitviz feeds) no patch is padding, so no attention mask applies: the model is timm's exactly. What no tensor
    shows (activation, eps, resampling) comes from the architecture named in config.json and its `model_args`."""
    from vitviz.core.reading.families.base import blocks_are_canonical
    from vitviz.core.reading.families.timm import model_args_hints
    from vitviz.errors import UnknownLayoutError

    cfg = raw.config or {}
    name = cfg.get("architecture") if isinstance(cfg.get("architecture"), str) else ""
    base = name.split(".")[0]
    margs = cfg.get("model_args") if isinstance(cfg.get("model_args"), dict) else {}
    src = "metadata: config.json model_args"
    odd = sorted({k for k in sd if k.startswith("embeds.") and k not in (
        "embeds.proj.weight", "embeds.proj.bias", "embeds.pos_embed", "embeds.cls_token", "embeds.reg_token",
        "embeds.norm.weight", "embeds.norm.bias")})
    if odd or not blocks_are_canonical({k for k in sd if k.startswith("blocks.")}) or \
            (base.startswith("naflexvit_") and base not in _NAFLEX_ARCHS):
        raise UnknownLayoutError(f"{raw.path}: a timm NaFlexVit{' ' + repr(base) if base else ''} with "
                                 f"{', '.join(odd[:3]) or 'blocks, tables or a registered config'} the reference ViT "
                                 "does not express (supported: the learned 2-D table and timm's plain blocks, "
                                 f"e.g. {', '.join(sorted(_NAFLEX_ARCHS)[:3])}); use --code FILE.py:FACTORY")
    if margs.get("pos_embed_align_corners") or margs.get("pos_embed_ar_preserving") \
            or margs.get("pos_embed_use_grid_sample"):
        raise UnknownLayoutError(f"{raw.path}: a timm NaFlexVit that resamples its table with align_corners / "
                                 "aspect-ratio preservation / grid_sample, which vitviz does not compute yet")
    dropped: list[str] = []
    out: dict[str, torch.Tensor] = {}
    hints: dict[str, Hint] = {}
    for k, v in sd.items():
        if k == "embeds.proj.weight" and v.ndim == 2:
            last = bool(margs.get("patchify_channels_last", True))
            out["patch_embed.proj.weight"] = _linear_patch_to_conv(v, int(margs.get("in_chans", 3)), raw,
                                                                   "NaFlexVit", channels_last=last)
        elif k == "embeds.pos_embed":
            gh, gw = int(v.shape[1]), int(v.shape[2])
            out["pos_embed"] = v.reshape(1, gh * gw, v.shape[-1])  # (1, gh, gw, D) -> (1, N, D)
            hints["pos_grid_shape"] = ((gh, gw), f"shape: embeds.pos_embed {tuple(v.shape)}")
        else:
            k = {"embeds.proj.weight": "patch_embed.proj.weight", "embeds.proj.bias": "patch_embed.proj.bias",
                 "embeds.cls_token": "cls_token", "embeds.reg_token": "reg_token",
                 "embeds.norm.weight": "patch_embed.norm.weight", "embeds.norm.bias": "patch_embed.norm.bias"}.get(k, k)
            out[k] = v
    if "cls_token" in out or "reg_token" in out:
        hints["pos_prefix"] = (0, "shape: embeds.pos_embed is a (1, gh, gw, D) grid: NaFlexVit adds positions to "
                                  "the patches only, then puts its prefix tokens in front")
    act, recipe = _NAFLEX_ARCHS.get(base, ("gelu", "timm"))
    if base:
        hints["mlp_kind"] = (act, f"named: timm builds {base} with {act}")
        hints["eps"] = (1e-6, f"named: timm builds {base} with its LayerNorm default eps 1e-6")
        hints["pos_interp"] = (recipe, f"named: timm's {base} resamples its table "
                                       f"{'bilinearly' if recipe == 'bilinear_aa' else 'bicubically'}, antialiased")
    else:
        hints["mlp_kind"] = ("gelu", "guess: timm NaFlexVit's default exact GELU (its SigLIP 2 configs use "
                                     "tanh-GELU: pass act='gelu_tanh' for those)")
        hints["eps"] = (1e-6, "guess: timm NaFlexVit's LayerNorm default eps 1e-6 (nothing names the model)")
    mode = margs.get("pos_embed_interp_mode")
    if mode in ("bilinear", "bicubic") and margs.get("pos_embed_antialias", True):
        hints["pos_interp"] = ("bilinear_aa" if mode == "bilinear" else "timm", f"{src}.pos_embed_interp_mode")
    if "attn_pool.latent" in out:
        heads = margs.get("attn_pool_num_heads")
        hints["pool_heads"] = (int(heads), f"{src}.attn_pool_num_heads") if heads else \
            (0, "named: timm's NaFlexVit MAP head has the model's head count" if base else
             "guess: the model's head count (timm's NaFlexVit default)")
        hints["pool_prefix"] = (bool(margs.get("pool_include_prefix")), f"{src}.pool_include_prefix"
                                if "pool_include_prefix" in margs else
                                "named: timm's NaFlexVit MAP head sees the patches only" if base else
                                "guess: the MAP head sees the patches only (timm's NaFlexVit default)")
    hints.update(model_args_hints(raw, out, hints, "vit", _NAFLEX_ARGS))
    if "attn_pool.latent" in out:  # timm's AttentionPoolLatent uses the model's act_layer
        hints["pool_act"] = (hints["mlp_kind"][0], hints["mlp_kind"][1] + " (the MAP head's MLP too)")
    return Converted("timm-naflex", out, hints, dropped)


