"""CLIP vision towers: OpenAI CLIP and open_clip files (`visual.conv1`, `visual.transformer.resblocks.N`, ...),
open_clip towers built on timm (`visual.trunk.*`), and Hugging Face `CLIPVisionModel` / `CLIPModel` folders.

The tower becomes the reference ViT with `norm_pre` (`ln_pre`), a bias-free patch embedding, LayerNorm eps 1e-5,
`ln_post` as the final norm and `proj` as an embedding head (`embed_out`): the output is the image embedding, shown
as features. A whole CLIP file also holds the text tower; its tensors are ignored, listed in `dropped` and said
in a warning. QuickGELU vs GELU is not in any tensor: open_clip's config beside the file decides, otherwise it is a
said guess (OpenAI's weights use QuickGELU).
"""
from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename_key
from vitviz.core.spec import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("clip", "hf-clip")
DETECT_ORDER = 70   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "CLIP image towers"
PREPROCESS = {"clip": Recipe(1.0, "bicubic", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "center"),
              "hf-clip": Recipe(1.0, "bicubic", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "center")}
REGISTERED_SIZES = True
NAME_HINTS = ((r"clip", "clip", 60),)
HF_MODEL_TYPES = {"clip": "hf-clip", "clip_vision_model": "hf-clip"}

_OC_RENAMES = [  # timm `_convert_openai_clip` (vision_transformer.py), in its order
    (r"^conv1\.", "patch_embed.proj."), (r"^ln_pre\.", "norm_pre."),
    (r"^transformer\.resblocks\.(\d+)\.", r"blocks.\1."),
    (r"\.ln_1\.", ".norm1."), (r"\.ln_2\.", ".norm2."), (r"\.attn\.in_proj_(weight|bias)$", r".attn.qkv.\1"),
    (r"\.attn\.out_proj\.", ".attn.proj."), (r"\.mlp\.c_fc\.", ".mlp.fc1."), (r"\.mlp\.c_proj\.", ".mlp.fc2."),
    (r"\.ls_([12])\.gamma$", r".ls\1.gamma"),
]
_HF_RENAMES = [
    (r"^embeddings\.patch_embedding\.", "patch_embed.proj."),
    (r"^pre_laye?rnorm\.", "norm_pre."),    # (CLIP's pre_layrnorm, OWL-ViT's pre_layernorm)
    (r"^encoder\.layers\.(\d+)\.", r"blocks.\1."), (r"\.layer_norm1\.", ".norm1."), (r"\.layer_norm2\.", ".norm2."),
    (r"\.self_attn\.(out_proj|projection_layer)\.", ".attn.proj."),    # (Janus's SigLIP: projection_layer)
    (r"^post_layernorm\.", "norm."),
]
# open_clip blocks other than the plain residual attention block, and heads the reference ViT has no place for
_UNSUPPORTED = ("ln_attn", "attn.ln_q", "attn.ln_k", "attn.head_scale", "attn.ln_inner", "attn.logit_scale",
                "mlp.ln", "attn_pool", "attn_pool_contrastive")


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if any(k.startswith("visual.") for k in keys) and ("visual.class_embedding" in keys or
                                                      any(k.startswith("visual.trunk.") for k in keys)):
        return "clip"
    if {"class_embedding", "conv1.weight"} <= keys and any(k.startswith("transformer.resblocks.") for k in keys):
        return "clip"
    stripped = {k.removeprefix("vision_model.") for k in keys}
    if "embeddings.class_embedding" in stripped and "embeddings.patch_embedding.weight" in stripped:
        return "hf-clip"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    if detect(set(sd), raw) == "hf-clip" or family == "hf-clip":
        return _convert_hf(sd, raw)
    return _convert_open_clip(sd, raw, overrides or {})


def _split_towers(sd: dict[str, torch.Tensor], prefixes: tuple[str, ...], raw: RawCheckpoint,
                  what: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The vision tower's tensors (prefix stripped) and the text tower's keys (ignored, and said so)."""
    prefix = next((p for p in prefixes if any(k.startswith(p) for k in sd)), "")
    if not prefix:
        return sd, []
    vision = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    dropped = sorted(k for k in sd if not k.startswith(prefix))
    if dropped:
        stems = sorted({re.sub(r"\.\d+\..*", ".N...", k) for k in dropped})
        warnings.warn(f"{raw.path}: a whole {what} checkpoint: opened its vision tower ({len(vision)} tensors) and "
                      f"ignored the text tower and contrastive head ({len(dropped)} tensors: "
                      f"{', '.join(stems[:6])}{' ...' if len(stems) > 6 else ''})", UserWarning, stacklevel=4)
    return vision, dropped


def _open_clip_config(raw: RawCheckpoint) -> dict[str, Any]:
    """`model_cfg` of an open_clip_config.json beside the file (or a config stating `vision_cfg`)."""
    for name, data in raw.sidecars:
        cfg = data.get("model_cfg", data) if isinstance(data, dict) else {}
        if isinstance(cfg, dict) and isinstance(cfg.get("vision_cfg"), dict):
            return {**cfg, "_file": name}
    cfg = raw.config or {}
    if isinstance(cfg.get("model_cfg"), dict) and isinstance(cfg["model_cfg"].get("vision_cfg"), dict):
        return {**cfg["model_cfg"], "_file": "config.json"}
    return {}


def _convert_open_clip(sd: dict[str, torch.Tensor], raw: RawCheckpoint, overrides: dict[str, Any]) -> Converted:
    vision, dropped = _split_towers(sd, ("visual.",), raw, "CLIP")
    if any(k.startswith("trunk.") for k in vision):  # open_clip tower built on timm (SigLIP, ViT-SO400M, ...)
        return _convert_trunk(vision, raw, dropped, overrides)
    bad = sorted({u for k in vision for u in _UNSUPPORTED if f".{u}." in f".{k}" or k.startswith(u + ".")})
    if bad:
        raise UnknownLayoutError(
            f"{raw.path}: an open_clip vision tower with {', '.join(bad)}, which the reference ViT does not express "
            "(custom blocks with qk-norm / scaled-cosine attention / head scale, or a CoCa attentional pooler); "
            "expected the plain CLIP residual attention blocks")
    cfg = _open_clip_config(raw)
    vcfg = cfg.get("vision_cfg", {}) if cfg else {}
    src = f"metadata: {cfg.get('_file')} model_cfg" if cfg else ""
    out: dict[str, torch.Tensor] = {}
    final_after_pool = bool(vcfg.get("final_ln_after_pool"))
    for k, v in vision.items():
        if _embedding(k, v, ("class_embedding", "positional_embedding"), out):
            continue
        if k == "proj":
            out["head.weight"] = v.t().contiguous()  # (D, E) -> (E, D), no bias
        elif k.startswith("ln_post."):
            out[("fc_norm." if final_after_pool else "norm.") + k.split(".", 1)[1]] = v
        else:
            out[rename_key(k, _OC_RENAMES)] = v
    hints: dict[str, Hint] = {"eps": (1e-5, "family: CLIP (torch LayerNorm eps 1e-5)"),
                              "pos_prefix": (1, "family: CLIP (the table covers the class token)")}
    if "head.weight" in out:
        hints["embed_out"] = (True, "family: CLIP `proj`, the image-embedding projection")
    if cfg:
        hints.update(_oc_numerics(cfg, vcfg, src, raw))
    else:
        hints["mlp_kind"] = ("quick_gelu", "guess: no open_clip_config.json beside the file; OpenAI's CLIP weights "
                             "use QuickGELU (open_clip's own models without '-quickgelu' use GELU: pass act='gelu')")
    width = int(out["patch_embed.proj.weight"].shape[0]) if "patch_embed.proj.weight" in out else 0
    if vcfg.get("width") and vcfg.get("head_width"):
        hints["num_heads"] = (int(vcfg["width"]) // int(vcfg["head_width"]), f"{src}.vision_cfg width / head_width")
    elif vcfg:
        hints["num_heads"] = (int(vcfg.get("width", width)) // 64, f"{src}.vision_cfg (head_width 64, open_clip's "
                                                                    "default)")
    else:
        hints["dim_head"] = (64, "family: CLIP heads = width // 64 (OpenAI CLIP; open_clip's default head_width)")
    if vcfg.get("pool_type") == "avg":
        hints["pooling"] = ("avg", f"{src}.vision_cfg.pool_type")
    elif vcfg.get("pool_type") not in (None, "tok"):
        raise UnknownLayoutError(f"{raw.path}: open_clip pool_type {vcfg.get('pool_type')!r}; expected 'tok' or 'avg'")
    if vcfg.get("image_size"):
        s = vcfg["image_size"]
        hints["pos_image_size"] = ((s, s) if isinstance(s, int) else tuple(s), f"{src}.vision_cfg.image_size")
    hints["pos_interp"] = ("timm", "family: CLIP (open_clip resize_pos_embed: bicubic, antialias)")
    if cfg:  # the open_clip config names the model: its defaults are that model's facts (see hyperparams._identity)
        hints["open_clip_config"] = (cfg.get("_file"), f"{src} (vision_cfg)")
    return Converted("clip", out, hints, dropped)


def _oc_numerics(cfg: dict[str, Any], vcfg: dict[str, Any], src: str, raw: RawCheckpoint) -> dict[str, Hint]:
    """The activation and LayerNorm eps an open_clip config gives its tower: `quick_gelu` (QuickGELU, else
    nn.GELU), with `vision_cfg.act_kwargs` passed to it (GELU's approximate='tanh') and `vision_cfg.norm_kwargs`
    to every LayerNorm (eps). Keyword arguments the reference ViT cannot follow are refused, not ignored."""
    out: dict[str, Hint] = {}
    quick = bool(cfg.get("quick_gelu"))
    act_src = f"{src}.quick_gelu" if "quick_gelu" in cfg else f"{src} (no quick_gelu: open_clip's default nn.GELU)"
    act = "quick_gelu" if quick else "gelu"
    act_kwargs = vcfg.get("act_kwargs") or {}
    if act_kwargs:
        approx = act_kwargs.get("approximate", "none") if isinstance(act_kwargs, dict) else None
        if quick or set(act_kwargs) - {"approximate"} or approx not in ("none", "tanh"):
            raise UnknownLayoutError(f"{raw.path}: open_clip vision_cfg.act_kwargs {act_kwargs!r} for "
                                     f"{'QuickGELU' if quick else 'nn.GELU'}: an activation the reference ViT does "
                                     "not compute; expected none, or approximate 'none' / 'tanh' for nn.GELU")
        act, act_src = ("gelu_tanh" if approx == "tanh" else "gelu"), f"{src}.vision_cfg.act_kwargs (nn.GELU)"
    out["mlp_kind"] = (act, act_src)
    norm_kwargs = vcfg.get("norm_kwargs") or {}
    if norm_kwargs:
        eps = norm_kwargs.get("eps") if isinstance(norm_kwargs, dict) else None
        if set(norm_kwargs) - {"eps"} or not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps <= 0:
            raise UnknownLayoutError(f"{raw.path}: open_clip vision_cfg.norm_kwargs {norm_kwargs!r}: LayerNorm "
                                     "arguments the reference ViT does not follow; expected at most a positive eps")
        out["eps"] = (float(eps), f"{src}.vision_cfg.norm_kwargs.eps")
    return out


def _convert_trunk(vision: dict[str, torch.Tensor], raw: RawCheckpoint, dropped: list[str],
                   overrides: dict[str, Any]) -> Converted:
    """open_clip's `TimmModel` tower: `trunk.*` is a timm ViT, `head.proj` the embedding projection."""
    from vitviz.core.reading.families import timm as timm_family

    trunk = {k[len("trunk."):]: v for k, v in vision.items() if k.startswith("trunk.")}
    head = {k: v for k, v in vision.items() if not k.startswith("trunk.")}
    if set(head) - {"head.proj.weight", "head.proj.bias"}:
        raise UnknownLayoutError(f"{raw.path}: an open_clip timm tower with a head of {sorted(head)}; expected at most "
                                 "head.proj (a linear projection)")
    if "head.weight" in trunk or "head.bias" in trunk:
        raise UnknownLayoutError(f"{raw.path}: an open_clip timm tower with both a trunk classifier and a projection")
    conv = timm_family.convert(trunk, raw, None, overrides)
    if "head.proj.weight" in head:
        conv.tensors["head.weight"] = head["head.proj.weight"]
        if "head.proj.bias" in head:
            conv.tensors["head.bias"] = head["head.proj.bias"]
        conv.hints["embed_out"] = (True, "family: open_clip timm tower, head.proj is the image-embedding projection")
    conv.dropped += dropped
    conv.family = conv.family.replace("timm", "clip", 1) if conv.family.startswith("timm-") else conv.family
    return conv


def _embedding(k: str, v: torch.Tensor, names: tuple[str, str], out: dict[str, torch.Tensor]) -> bool:
    """Put CLIP's class embedding (D,) and position table (N+1, D), named `names` (open_clip's or transformers'),
    into `out` in timm's form, `cls_token` (1, 1, D) and `pos_embed` (1, N+1, D); False for any other key."""
    if k == names[0]:
        out["cls_token"] = v.reshape(1, 1, -1)
    elif k == names[1]:
        out["pos_embed"] = v.unsqueeze(0)
    return k in names


def _convert_hf(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    """transformers CLIPVisionModel (keys with or without `vision_model.`), CLIPVisionModelWithProjection and
    CLIPModel (`visual_projection` the embedding head; the text tower ignored)."""
    proj = sd.get("visual_projection.weight")
    if any(k.startswith("vision_model.") for k in sd):
        vision, dropped = _split_towers(sd, ("vision_model.",), raw, "CLIP")
        dropped = [k for k in dropped if k != "visual_projection.weight"]
    else:
        vision, dropped = {k: v for k, v in sd.items() if k != "visual_projection.weight"}, []
    # AltCLIP's files name the blocks `encoder.layer.N` (transformers' conversion mapping for it: layer. -> layers.)
    vision = {re.sub(r"^encoder\.layer\.(\d+)\.", r"encoder.layers.\1.", k): v for k, v in vision.items()}
    out: dict[str, torch.Tensor] = {}
    for k, v in vision.items():
        if _embedding(k, v, ("embeddings.class_embedding", "embeddings.position_embedding.weight"), out):
            continue
        if k == "embeddings.position_ids":
            dropped.append(k)
        elif re.search(r"\.self_attn\.[qkv]_proj\.", k):
            continue
        else:
            out[rename_key(k, _HF_RENAMES)] = v
    fuse_qkv(vision, out, "encoder.layers.{i}.self_attn.{n}_proj")
    if proj is not None:
        out["head.weight"] = proj
    cfg = raw.config or {}
    vcfg = cfg.get("vision_config") if isinstance(cfg.get("vision_config"), dict) else cfg
    src = "metadata: config.json" + (" vision_config" if vcfg is not cfg else "")
    hints = hf_vision_hints(vcfg, src, default_act=("quick_gelu", "default: transformers CLIPVisionConfig "
                                                                  "hidden_act quick_gelu"),
                            default_eps=(1e-5, "default: transformers CLIPVisionConfig layer_norm_eps"))
    hints["pos_prefix"] = (1, "family: CLIP (the table covers the class token)")
    hints["pos_interp"] = ("hf", "family: transformers CLIP (interpolate_pos_encoding: bicubic, no antialias)")
    if proj is not None:
        hints["embed_out"] = (True, "family: transformers CLIP visual_projection (image embedding)")
    return Converted("hf-clip", out, hints, dropped)


def fuse_qkv(sd: dict[str, torch.Tensor], out: dict[str, torch.Tensor], template: str) -> None:
    """Concatenate each block's separate q/k/v Linears into `blocks.N.attn.qkv`, rows [Wq; Wk; Wv].

    `template` names one of them with `{i}` (block index) and `{n}` ('q' | 'k' | 'v'), e.g.
    'encoder.layers.{i}.self_attn.{n}_proj'. A missing k bias (EVA, DINOv3) is zeros, as those models compute it.
    """
    import torch

    head, _, _ = template.partition("{i}")
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(re.escape(head) + r"(\d+)\.", k))})
    for i in layers:
        for kind in ("weight", "bias"):
            parts = [sd.get(f"{template.format(i=i, n=n)}.{kind}") for n in ("q", "k", "v")]
            if kind == "bias" and parts[0] is not None and parts[2] is not None and parts[1] is None:
                parts[1] = torch.zeros_like(parts[0])
            if all(p is not None for p in parts):
                out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts, dim=0)  # (3A, D) / (3A,)


HF_ACT = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh",
          "gelu_pytorch_tanh": "gelu_tanh", "gelu_accurate": "gelu_tanh", "quick_gelu": "quick_gelu", "relu": "relu",
          "silu": "silu", "swish": "silu"}


def hf_vision_hints(vcfg: dict[str, Any], src: str, default_act: Hint, default_eps: Hint) -> dict[str, Hint]:
    """Heads, activation, eps and image size from a transformers vision config (or the family's defaults)."""
    hints: dict[str, Hint] = {}
    if vcfg.get("num_attention_heads"):
        hints["num_heads"] = (int(vcfg["num_attention_heads"]), src)
    act = vcfg.get("hidden_act")
    hints["mlp_kind"] = (HF_ACT.get(act, act), src) if isinstance(act, str) else default_act
    hints["eps"] = (float(vcfg["layer_norm_eps"]), src) if "layer_norm_eps" in vcfg else default_eps
    if vcfg.get("image_size"):
        s = vcfg["image_size"]
        hints["pos_image_size"] = ((s, s) if isinstance(s, int) else tuple(s), src)
    return hints
