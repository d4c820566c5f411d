"""timm-layout checkpoints: timm, DeiT (1, distilled, III), DINO v1, DINOv2 original, MAE, old timm.

The canonical layout is timm's, so conversion is a few renames plus the sub-family, which decides the
position-embedding interpolation recipe and the preprocessing defaults.
"""
from __future__ import annotations

import re

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, blocks_are_canonical, rename as _rename
from vitviz.core.spec import (
    IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD,
)

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("timm", "deit", "deit3", "dino", "dinov2", "mae")
DETECT_ORDER = 110   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "timm ViT, DeiT, DINO, DINOv2, MAE"
PREPROCESS = {"timm": Recipe(0.9, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "center"),
              "deit": Recipe(0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
              "deit3": Recipe(0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
              "dino": Recipe(0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
              "dinov2": Recipe(0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
              "mae": Recipe(0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
              # the CLIP and SigLIP image towers timm writes (its open_clip / big_vision ports)
              "timm-clip": Recipe(1.0, "bicubic", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "center"),
              "timm-siglip": Recipe(1.0, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "squash")}
REGISTERED_SIZES = True
NAME_HINTS = ((r"dinov2", "dinov2", 90), (r"deit3|deit_3", "deit3", 40), (r"deit", "deit", 30),
              (r"dino", "dino", 20), (r"mae(?=.*vit)|vit(?=.*mae)", "mae", 10),
              # CaiT: timm's cait_*, which vitviz runs with timm's own code (talking heads, class attention)
              (r"cait", "cait", 10), (r"vit", "timm", 0))
EVAL_SIZE = {"dinov2": (224, "DINOv2 evaluation size")}
TIMM_LAYOUT_FAMILIES = NAMES


_RENAMES = [(r"^blocks\.\d+\.(\d+)\.", r"blocks.\1."),        # DINOv2 chunked blocks
            (r"\.gamma_([12])$", r".ls\1.gamma"),               # DeiT III layer scale
            (r"\.mlp\.w12\.", ".mlp.fc1."), (r"\.mlp\.w3\.", ".mlp.fc2."),  # DINOv2 SwiGLU
            (r"^register_tokens$", "reg_token")]


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    """timm naming with blocks the reference loads as they are; timm-like files with other block names (e.g. an
    `nn.MultiheadAttention` or `mlp.0` inside `blocks.N`) are left to the structural reader."""
    if "patch_embed.proj.weight" in keys and any(".attn.qkv.weight" in k for k in keys):
        renamed = _rename({k: None for k in keys}, _RENAMES)  # type: ignore[arg-type]
        if blocks_are_canonical(set(renamed)):
            return "timm"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    """timm, DeiT (1, distilled, III), DINO v1, DINOv2 original, MAE, WZ / old timm: timm naming already.

    `family` (one of the timm-layout families) overrides the detected sub-family.
    """
    keys = set(sd)
    hints: dict[str, Hint] = {}
    dropped = [k for k in keys if k.startswith(("decoder", "mask_token", "head.mlp.", "head.last_layer."))]
    sd = {k: v for k, v in sd.items() if k not in dropped}
    sd = _rename(sd, _RENAMES)
    family = family if family in TIMM_LAYOUT_FAMILIES else _timm_subfamily(keys, raw)
    if "register_tokens" in keys:  # DINOv2 original: pos covers cls only; registers inserted after
        hints["pos_prefix"] = (1, "shape: register_tokens (the DINOv2 layout: register tokens get no position "
                                  "embedding)")
    if isinstance((raw.config or {}).get("architecture"), str):  # a timm hub folder: timm runs it, whoever trained it
        hints["pos_interp"] = ("timm", f"named: timm architecture {raw.config['architecture']!r} (config.json): "
                                       "timm resamples the table (bicubic, antialias)")
    elif family == "dinov2":
        hints["pos_interp"] = ("dinov2_reg" if "register_tokens" in keys else "dinov2", "family: DINOv2")
    elif family == "dino":
        hints["pos_interp"] = ("dino", "family: DINO")
    elif family in ("deit", "deit3", "mae"):
        hints["pos_interp"] = ("deit", f"family: {family} (bicubic, size=, align_corners=False)")
    if any(".mlp.w12." in k for k in keys):
        hints["mlp_kind"] = ("swiglu", "shape: mlp.w12 (DINOv2 SwiGLU)")
    name = _architecture(raw)
    if "mlp_kind" not in hints and _packed_swiglu(sd):  # timm SwiGLUPacked: gate and value packed in fc1
        hints["mlp_kind"] = ("swiglu", f"named: timm builds {name.split('.')[0]} with SwiGLUPacked and SiLU"
                             if "dinov2" in name or "tipsv2" in name else
                             "assumed: mlp.fc1 is twice mlp.fc2's input, a gated MLP (timm SwiGLUPacked), gated with "
                             "SiLU as timm's DINOv2-g (its act_layer is in no tensor)")
    if family == "timm" and "norm_pre.weight" in keys and name and not _clip_like(name) \
            and "attn_pool.latent" not in keys:
        hints["eps"] = (1e-6, f"named: timm builds {name.split('.')[0]} with its LayerNorm default eps 1e-6 (pre_norm "
                              "alone does not change it; only the registered *_clip_* towers pass eps 1e-5)")
    elif family == "timm" and ("norm_pre.weight" in keys or "attn_pool.latent" in keys or "siglip" in name):
        family = _tower_hints(sd, raw, hints)
    elif name.startswith("beit3_"):
        hints["eps"] = (1e-5, f"named: timm builds {name.split('.')[0]} with LayerNorm eps 1e-5")
    if "_rpn_" in name:
        hints["block_norm"] = ("res_post", f"named: timm builds {name.split('.')[0]} with ResPostBlock (x + "
                                           "norm(f(x)): each sub-layer's output normed inside the residual)")
    if family == "timm" and (not name or "dinov2" in name):
        _dinov2_port(sd, hints)
    hints.update(model_args_hints(raw, sd, hints, "vit"))
    if family in ("timm", "mae", "timm-clip") and "pooling" not in hints and "attn_pool.latent" not in keys:
        # (MAE's own models_vit names, fine-tuned with global_pool=True: the mean and fc_norm, its only pooling)
        mae = name.split(".")[0] in ("vit_base_patch16", "vit_large_patch16", "vit_huge_patch14")
        hints["pooling"] = _train_args_pool(raw, keys) or _pooling_convention(keys, "" if mae else name)
    if not name and any(f"{k}.weight" in sd for k in ("norm", "fc_norm")):
        eps = float(hints.get("eps", (1e-6,))[0])
        hints["eps_final"] = (eps, f"assumed: the final norm uses the blocks' eps {eps:g}, as timm builds it (a "
                                   "hand-written ViT in timm's names may build it with another, e.g. nn.LayerNorm's "
                                   "1e-5 after 1e-6 blocks; nothing names the model)")
    return Converted(family, sd, hints, dropped)


def _train_args_pool(raw: RawCheckpoint, keys: set[str]) -> Hint | None:
    """The pooling timm's train.py was told (`--gp`, saved in the checkpoint's `args`): None when it gave none."""
    args = raw.meta.get("args") if isinstance(raw.meta.get("args"), dict) else {}
    gp = args.get("gp")
    if gp == "token" and "cls_token" not in keys:
        return None
    return (gp, "metadata: training args gp (timm train.py --gp)") if gp in ("token", "avg", "max", "avgmax") else None


def _pooling_convention(keys: set[str], name: str = "") -> Hint:
    """timm's `global_pool` is in no tensor: 'token' and 'avg' with `fc_norm=False` hold the same tensors, and so
    do 'avg', 'max', 'avgmax' (and `pool_include_prefix`) with an fc_norm. The pooling the key layout suggests is
    a convention of the layout (a fact when a config or the training args name the model) -- except an fc_norm
    under a named timm ViT (`name`): its registered default pools the class token without one, so the global_pool
    it was created with is unknown ('avg', 'max' or 'avgmax'), an assumption even with the name."""
    if "fc_norm.weight" in keys:
        said = (f"assumed: {name.split('.')[0]} has an fc_norm, so it was created with a global_pool other than "
                "its default; which one is in no tensor: " if name else "layout: ")
        return ("avg", f"{said}fc_norm: the mean of the patch tokens, then fc_norm (timm global_pool='avg', MAE); "
                       "timm's 'max' and 'avgmax', and pool_include_prefix, hold the same tensors (pass "
                       "pooling='max' / 'avgmax' / 'avg_all')")
    if "cls_token" in keys:
        return ("token", "layout: a class token and no fc_norm: the class token (timm's default global_pool='token'); "
                         "global_pool='avg' with fc_norm=False holds the same tensors (pass pooling='avg')")
    return ("avg", "layout: no class token: the mean of the patch tokens (timm global_pool='avg'); 'max' and "
                   "'avgmax' with fc_norm=False hold the same tensors (pass pooling='max' / 'avgmax')")


def _packed_swiglu(sd: dict[str, torch.Tensor]) -> bool:
    fc1, fc2 = sd.get("blocks.0.mlp.fc1.weight"), sd.get("blocks.0.mlp.fc2.weight")
    return fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]


def _clip_like(name: str) -> bool:
    """A registered timm CLIP tower (`vit_*_clip_*`, built with LayerNorm eps 1e-5) or a SigLIP one."""
    base = name.split(".")[0]
    return "_clip_" in base or base.endswith("_clip") or "siglip" in base


def _dinov2_port(sd: dict[str, torch.Tensor], hints: dict[str, Hint]) -> None:
    """timm's port of DINOv2 (`vit_*_patch14_dinov2`, `vit_*_patch14_reg4_dinov2`: patch 14, layer scale, a
    37x37 table for 518 px) preprocesses as timm's DINOv2 configs say: ImageNet mean/std, bicubic, crop_pct 1.0
    at 518 px -- not timm's ViT default (mean/std 0.5, crop_pct 0.9)."""
    w, pos = sd.get("patch_embed.proj.weight"), sd.get("pos_embed")
    if w is None or pos is None or w.shape[-1] != 14 or "blocks.0.ls1.gamma" not in sd or "cls_token" not in sd:
        return
    if int(pos.shape[1]) not in (37 * 37, 37 * 37 + 1):
        return
    hints["preprocess"] = ({"crop": (518, 518), "resize": 518, "mode": "center", "interpolation": "bicubic",
                            "mean": IMAGENET_MEAN, "std": IMAGENET_STD},
                           "family: timm's DINOv2 (a patch-14 table of 37x37 with layer scale: ImageNet mean/std, "
                           "bicubic, crop_pct 1.0 at 518 px)")


# timm activation names (`timm.layers.get_act_layer`) the reference ViT computes
TIMM_ACTS = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "gelutanh": "gelu_tanh", "quick_gelu": "quick_gelu",
             "quickgelu": "quick_gelu", "relu": "relu", "silu": "silu", "swish": "silu", "tanh": "tanh"}
# constructor arguments of timm's VisionTransformer and Eva whose effect the tensors show (keys, shapes), that
# never change what a loaded model computes at its own size, or that other readers read (the RoPE settings)
_SHAPE_ARGS = frozenset((
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias",
    "qk_norm", "scale_attn_norm", "scale_mlp_norm", "proj_bias", "init_values", "class_token", "reg_tokens",
    "pre_norm", "final_norm", "fc_norm", "pos_embed", "qkv_fused", "swiglu_mlp", "swiglu_align_to", "scale_mlp",
    "scale_attn_inner", "num_reg_tokens", "use_abs_pos_emb", "use_pre_transformer_norm",
    "use_post_transformer_norm", "use_fc_norm", "attn_pool_mlp_ratio", "attn_pool_num_heads",
    "attn_only_layer_scale", "rope_temperature", "rope_grid_offset", "rope_grid_indexing", "rope_rotate_half",
    "ref_feat_shape", "rope_type"))
_NO_EFFECT_ARGS = frozenset(("weight_init", "fix_init", "dynamic_img_size", "dynamic_img_pad", "device", "dtype",
                             "head_init_scale", "rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords",
                             "drop_rate", "drop_path_rate", "pretrained_cfg", "pretrained_cfg_overlay"))


def model_args_hints(raw: RawCheckpoint, sd: dict[str, torch.Tensor], hints: dict[str, Hint],
                     cls: str, read_by_caller: frozenset[str] = frozenset()) -> dict[str, Hint]:
    """What timm's config.json `model_args` (the arguments the model was created with) say that no tensor shows:
    the activation (`act_layer`), pooling (`global_pool`, `pool_include_prefix`), whether the position table
    covers the prefix tokens (`no_embed_class`), the norm layer; for Eva (`cls='eva'`) also post-norm blocks and
    grouped kv heads (`read_by_caller`: arguments the calling reader reads itself). An argument that could change
    the outputs and that vitviz does not read is an assumed entry naming it (flagged); an activation or pooling
    the reference ViT cannot compute is refused."""
    from vitviz.errors import UnknownLayoutError

    cfg = raw.config or {}
    margs = cfg.get("model_args") if isinstance(cfg.get("model_args"), dict) else {}
    src = "metadata: config.json model_args"
    out: dict[str, Hint] = {}
    handled = set(_SHAPE_ARGS | _NO_EFFECT_ARGS | read_by_caller)
    act = margs.get("act_layer")
    if act is not None and cls == "vit":
        handled.add("act_layer")
        kind = TIMM_ACTS.get(str(act).lower().replace("-", "_"))
        swiglu = hints.get("mlp_kind", ("",))[0] == "swiglu"
        if swiglu and kind == "silu":
            out["mlp_kind"] = ("swiglu", f"{src}.act_layer {act!r} with a gated MLP (SwiGLU)")
        elif kind is None or swiglu:
            raise UnknownLayoutError(f"{raw.path}: config.json model_args.act_layer {act!r}"
                                     f"{' in a gated MLP' if swiglu else ''} is an activation the reference ViT does "
                                     f"not compute; expected one of {', '.join(sorted(set(TIMM_ACTS.values())))}")
        else:
            out["mlp_kind"] = (kind, f"{src}.act_layer")
    pool, pool_src = (margs["global_pool"], f"{src}.global_pool") if "global_pool" in margs else \
        (cfg.get("global_pool"), "metadata: config.json global_pool")
    handled |= {"global_pool", "pool_include_prefix"}
    include = bool(margs.get("pool_include_prefix"))
    if isinstance(pool, str) and "attn_pool.latent" not in sd:
        if pool == "avg":
            out["pooling"] = ("avg_all" if include else "avg", pool_src + (" with pool_include_prefix" if include
                                                                           else ""))
        elif pool == "token" and "cls_token" in sd:
            out["pooling"] = ("token", pool_src)
        elif pool in ("avgmax", "max") and not include:
            out["pooling"] = (pool, pool_src)
        elif pool in ("avgmax", "max", "prr"):
            raise UnknownLayoutError(f"{raw.path}: config.json global_pool {pool!r}"
                                     f"{' with pool_include_prefix' if include else ''}: a pooling the reference "
                                     "ViT does not compute (it pools 'token', 'avg', 'avg_all', 'max', 'avgmax' or "
                                     "'map')")
    elif pool == "map" and include and "attn_pool.latent" in sd:
        out["pool_prefix"] = (True, f"{src}.pool_include_prefix")
    if "no_embed_class" in margs:
        handled.add("no_embed_class")
        n_prefix = int("cls_token" in sd) + int("dist_token" in sd) + \
            (int(sd["reg_token"].shape[1]) if "reg_token" in sd else 0)
        if n_prefix and "pos_embed" in sd and "pos_prefix" not in hints:
            out["pos_prefix"] = (0 if margs["no_embed_class"] else n_prefix, f"{src}.no_embed_class")
    norm = margs.get("norm_layer")
    if isinstance(norm, str):
        handled.add("norm_layer")
        if norm.lower() in ("layernorm", "layer_norm"):
            out["eps"] = (1e-6, f"{src}.norm_layer {norm!r} (timm's LayerNorm, eps 1e-6)")
        else:
            raise UnknownLayoutError(f"{raw.path}: config.json model_args.norm_layer {norm!r}: the reference ViT "
                                     "computes LayerNorm only")
    if cls == "eva":
        handled |= {"use_rot_pos_emb", "use_post_norm", "num_kv_heads", "attn_type"}
        if margs.get("use_post_norm"):
            out["block_norm"] = ("res_post", f"{src}.use_post_norm (x + norm(f(x)) in every block)")
        heads, kv = margs.get("num_heads"), margs.get("num_kv_heads")
        if kv is not None and heads is not None and kv != heads:
            raise UnknownLayoutError(f"{raw.path}: config.json model_args.num_kv_heads {kv} != num_heads {heads}: "
                                     "grouped-query attention, which the reference ViT does not express")
        if margs.get("attn_type") not in (None, "eva", "rope"):
            handled.discard("attn_type")
    unread = [k for k in margs if k not in handled and not k.endswith(("_drop_rate", "drop_path_rate"))]
    if unread:  # one flag for them all, naming each and the setting it most likely changes
        said = ", ".join(f"{k} = {margs[k]!r} (likely the {_field_for(k)})" for k in unread)
        out["model_args"] = (tuple(unread), f"assumed: config.json model_args {said}: arguments vitviz does not "
                                            "read, which may change the model's numbers")
    return out


def _field_for(key: str) -> str:
    """The setting an unread timm argument most likely changes, for its flag."""
    k = key.lower()
    if "act" in k or "mlp" in k:
        return "mlp_kind"
    if "norm" in k or "eps" in k:
        return "eps"
    if "attn" in k or "qk" in k or "head" in k:
        return "attn_scale"
    return "block_norm"


# timm SigLIP towers built with tanh-GELU (the SigLIP 2 era); every other `vit_*_siglip_*` uses exact GELU
SIGLIP_TANH = frozenset(f"vit_{n}" for n in (
    "base_patch32_siglip_256", "large_patch16_siglip_512", "so400m_patch16_siglip_256", "so400m_patch16_siglip_384",
    "so400m_patch16_siglip_512", "giantopt_patch16_siglip_256", "giantopt_patch16_siglip_384",
    "base_patch32_siglip_gap_256", "large_patch16_siglip_gap_512", "so400m_patch16_siglip_gap_256",
    "so400m_patch16_siglip_gap_384", "so400m_patch16_siglip_gap_512", "giantopt_patch16_siglip_gap_256",
    "giantopt_patch16_siglip_gap_384"))


def _architecture(raw: RawCheckpoint) -> str:
    """The timm model name a config beside the file or the training args give ('' when none)."""
    cfg = raw.config or {}
    name = cfg.get("architecture") if isinstance(cfg.get("architecture"), str) else ""
    args = raw.meta.get("args") if isinstance(raw.meta.get("args"), dict) else {}
    return str(name or raw.meta.get("arch") or args.get("model") or "").lower()


def _tower_hints(sd: dict[str, torch.Tensor], raw: RawCheckpoint, hints: dict[str, Hint]) -> str:
    """timm's CLIP-style (`pre_norm`: `norm_pre`, no patch bias, LayerNorm eps 1e-5, GELU or QuickGELU, the head
    a projection) and SigLIP-style (`global_pool='map'`: the MAP head `attn_pool`, tanh-GELU) towers."""
    name = _architecture(raw)
    named = f"metadata: model name {name!r}" if name else ""
    if "attn_pool.latent" in sd or "siglip" in name:
        if "siglip" in name:
            tanh = name.split(".")[0] in SIGLIP_TANH
            hints["mlp_kind"] = ("gelu_tanh" if tanh else "gelu", f"{named} (timm builds this SigLIP tower with "
                                 f"{'tanh-GELU' if tanh else 'exact GELU'})")
        elif not name:
            hints["mlp_kind"] = ("gelu_tanh", "guess: a timm ViT with a MAP head (attn_pool) and no config is a "
                                 "SigLIP tower; timm builds the SigLIP 2 era ones with tanh-GELU, the older "
                                 "vit_*_siglip_* with exact GELU (pass act='gelu' for those)")
        return "timm-siglip"
    if name:  # a *_clip_* architecture (others are read in convert)
        hints["eps"] = (1e-5, f"named: timm builds {name.split('.')[0]} (a *_clip_* tower) with LayerNorm eps 1e-5")
    else:
        hints["eps"] = (1e-5, "guess: a CLIP-style timm tower (norm_pre, no patch bias) without a config: timm's "
                              "*_clip_* towers use LayerNorm eps 1e-5, its other pre_norm ViTs eps 1e-6 (pass "
                              "eps=1e-6 for those)")
    if "quickgelu" in name:
        hints["mlp_kind"] = ("quick_gelu", named)
    elif "clip" in name:
        hints["mlp_kind"] = ("gelu", named)
    elif not name:
        hints["mlp_kind"] = ("gelu", "guess: a CLIP-style timm tower (norm_pre) without a config; timm's *_clip_* "
                             "models use GELU, its *_clip_quickgelu_* ones (OpenAI weights) QuickGELU")
    bias = sd.get("head.bias")
    if "head.weight" in sd and (bias is None or not bool(bias.any())):
        hints["embed_out"] = (True, "shape: a CLIP-style head without bias (or an all-zero one, as timm converts "
                                    "CLIP's proj) is the image-embedding projection")
        if bias is not None:
            sd.pop("head.bias")
    return "timm-clip"


def _timm_subfamily(keys: set[str], raw: RawCheckpoint) -> str:
    arch = str(raw.meta.get("arch") or (raw.meta.get("args") or {}).get("model")
               or (raw.meta.get("args") or {}).get("arch") or "")
    if "mask_token" in keys or "register_tokens" in keys or any(re.match(r"blocks\.\d+\.\d+\.", k) for k in keys):
        return "dinov2"
    if any(k.endswith("gamma_1") for k in keys) or arch.startswith("deit3"):
        return "deit3"
    if "dist_token" in keys or arch.startswith("deit"):
        return "deit"
    if raw.nest_key in ("teacher", "student") or "patch_size" in (raw.meta.get("args") or {}):
        return "dino"
    if "fc_norm.weight" in keys and "cls_token" in keys and "norm.weight" not in keys:
        return "mae"
    return "timm"


# ------------------------------------------------------------------------------- what a timm model object states

_TIMM_POOLS = {"token": "token", "avg": "avg", "max": "max", "avgmax": "avgmax"}


def _is_timm(obj: Any) -> bool:
    return type(obj).__module__.startswith("timm.")


def read_object(module: torch.nn.Module, what: str) -> dict[str, tuple[Any, str]]:
    """What a timm model object states that its tensors do not (`vitviz.core.reading.objects`): its `global_pool`
    (in no tensor: 'token' and 'avg' hold the same ones) and, for timm `Block`s, that they are pre-norm.

    Raises:
        VitvizError: a max pooling over the prefix tokens (`pool_include_prefix`), which the reference ViT does not
            compute (its own code runs instead).
    """
    from vitviz.errors import VitvizError

    out: dict[str, tuple[Any, str]] = {}
    pool = getattr(module, "global_pool", None)
    if isinstance(pool, str) and _is_timm(module) and pool in _TIMM_POOLS:
        include = bool(getattr(module, "pool_include_prefix", False)) and pool != "token"  # token: no reduction
        if include and pool != "avg":   # the reference ViT pools no max over the prefix tokens: its own code runs
            raise VitvizError(f"{what}'s global_pool {pool!r} with pool_include_prefix: a pooling the reference "
                              "ViT does not compute")
        out["pooling"] = ("avg_all" if include else _TIMM_POOLS[pool], f"model object: {what}'s global_pool "
                          f"{pool!r}" + (" with pool_include_prefix" if include else ""))
    if any(type(m).__name__ == "Block" and _is_timm(m) for m in module.modules()):
        out["block_norm"] = ("pre", f"model object: {what}'s blocks are pre-norm by their class")
    return out


def object_config(module: torch.nn.Module) -> dict[str, Any] | None:
    """The config a timm model object carries, as a timm hub folder's config.json says it: its architecture and
    pretrained config (the input size it was built at, not the registry's default), and for a Swin the windows it
    was built with (`model_args`); None for an object that is not timm's."""
    cfg = getattr(module, "pretrained_cfg", None)
    if not (isinstance(cfg, dict) and cfg.get("architecture")):
        return None
    cfg = dict(cfg)
    size = getattr(getattr(module, "patch_embed", None), "img_size", None)
    if size is not None:  # the registry's size is the default; the model may have been built at another
        cfg["input_size"] = (cfg.get("input_size", (3,))[0], *tuple(size))
    config: dict[str, Any] = {"architecture": cfg["architecture"], "pretrained_cfg": cfg}
    window_args = _window_args(module)
    if window_args:   # the windows it was built with, not its architecture's registered ones
        config["model_args"] = window_args
    return config


def _window_args(module: torch.nn.Module) -> dict[str, Any]:
    """A timm Swin object's window size and its stages' pretrained window sizes, as the model_args of a hub folder
    say them (built with window_size=4, a `swinv2_*_window12_*` model's windows are 4, not its name's 12)."""
    blocks = [m for m in module.modules() if "Block" in type(m).__name__ and hasattr(m, "window_size")]
    if not blocks:
        return {}
    side = blocks[0].window_size
    side = tuple(side) if isinstance(side, (tuple, list)) else (side, side)
    args: dict[str, Any] = {"window_size": side[0] if side[0] == side[1] else list(side)}
    pretrained = []
    for stage in getattr(module, "layers", ()):
        attn = getattr(next(iter(getattr(stage, "blocks", ())), None), "attn", None)
        pw = getattr(attn, "pretrained_window_size", None)
        if pw is not None:
            pretrained.append(int(pw[0]) if isinstance(pw, (tuple, list)) else int(pw))
    if pretrained:
        args["pretrained_window_sizes"] = pretrained
    return args
