"""Swin Transformer v1 / v2 checkpoints: torchvision (`features.N.M`), timm (`layers.S.blocks.B`, and the original
microsoft/Swin-Transformer files timm converts), transformers (`SwinModel`, `Swinv2Model` and their classifiers).

Every layout becomes the reference windowed model's keys (`vitviz.core.running.windowed`): `patch_embed.proj/norm`,
`layers.S.downsample.{reduction,norm}` (stage S > 0: the merging in front of it), `layers.S.blocks.B.{norm1,
attn.qkv, attn.proj, attn.relative_position_bias_table | attn.logit_scale + attn.cpb_mlp.0/2, norm2, mlp.fc1,
mlp.fc2}`, `norm`, `head.fc`. Swin v2's q/k/v bias is one `attn.qkv.bias` whose k part is zero (timm keeps a zero
k bias, torchvision zeroes it in the forward, transformers has none). Index and mask buffers are dropped (they are
recomputed), after their shapes have said what they can (the window).

The hints carry what each implementation's code decides and no tensor holds, with its source: the order in which a
shifted block pads and rolls, the rule that drops the shift at a small grid, the mask value, the LayerNorm eps, the
activation, the window of a Swin v2 (no tensor of timm's or transformers' sizes it), the pretrained window of its
continuous bias, the native size, preprocessing and labels.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, rename
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("swin", "timm-swin", "torchvision-swin", "hf-swin")
DETECT_ORDER = 10   # detection tries the families in this order, lowest first
WINDOWED = "swin"   # its files convert to the windowed reference model, swin layout
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "Swin v1 / v2"
# No PREPROCESS of its own: its sub-families take their prefix's recipe (timm-swin: timm's, ...)

_TV_ATTN = re.compile(r"^features\.\d+\.\d+\.attn\.(relative_position_bias_table|cpb_mlp\.0\.weight)$")
_TIMM_ATTN = re.compile(r"^layers\.\d+\.blocks\.\d+\.attn\.(relative_position_bias_table|cpb_mlp\.0\.weight)$")
_HF_ATTN = re.compile(r"^(?:swin\.|swinv2\.)?encoder\.layers\.\d+\.blocks\.\d+\.(?:attention|layernorm_before)\.")
_BUFFERS = ("relative_position_index", "relative_coords_table", "attn_mask")


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if "features.0.0.weight" in keys and any(_TV_ATTN.match(k) for k in keys):
        return "torchvision-swin"
    if any(_HF_ATTN.match(k) for k in keys) and any(k.endswith("embeddings.patch_embeddings.projection.weight")
                                                    for k in keys):
        return "hf-swin"
    if "patch_embed.proj.weight" in keys and any(_TIMM_ATTN.match(k) for k in keys):
        return "swin" if "layers.0.downsample.reduction.weight" in keys else "timm-swin"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    found = detect(set(sd), raw) or (family if family in ("timm-swin", "torchvision-swin", "hf-swin") else None)
    if found is None:
        raise UnknownLayoutError(f"{raw.path}: family {family!r} named, but this is no Swin layout (no "
                                 "layers.S.blocks.B.attn / features.N.M.attn / encoder.layers.S.blocks.B.attention)")
    if found == "torchvision-swin":
        return _torchvision(sd, raw)
    if found == "hf-swin":
        return _hf(sd, raw)
    return _timm(sd, raw, original=found == "swin")


# ------------------------------------------------------------------------------------------------ shared helpers

def _windows_from_buffers(sd: dict[str, torch.Tensor], pattern: str) -> dict[str, Hint]:
    """A window read off the shape of a stored index / coordinate buffer (before the buffers are dropped):
    'window:S.B' -> ((wh, ww), source), per block."""
    out: dict[str, Hint] = {}
    for key, t in sd.items():
        m = re.match(pattern, key)
        if not m:
            continue
        where = f"{m.group(1)}.{m.group(2)}"
        if key.endswith("relative_coords_table") and t.ndim == 4:   # (1, 2wh - 1, 2ww - 1, 2)
            out[f"window:{where}"] = (((t.shape[1] + 1) // 2, (t.shape[2] + 1) // 2), f"shape: {key} {tuple(t.shape)}")
        elif key.endswith("relative_position_index") and f"window:{where}" not in out:
            n = math.isqrt(math.isqrt(t.numel()))  # (n^2,) or (n, n) with n = wh * ww: a square window of side n^.5
            if n ** 4 == t.numel():
                out[f"window:{where}"] = ((n, n), f"shape: {key} {tuple(t.shape)}")
    return out


def _drop_buffers(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    kept = {k: v for k, v in sd.items() if not k.endswith(_BUFFERS)}
    return kept, sorted(set(sd) - set(kept))


def _zero_k_bias(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Swin v2 (a block with a logit scale) has no k bias: the k third of every qkv bias is zero."""
    out = dict(sd)
    for key in sd:
        if key.endswith(".attn.qkv.bias") and key.replace(".qkv.bias", ".logit_scale") in sd:
            b = sd[key].clone()
            third = b.numel() // 3
            b[third: 2 * third] = 0
            out[key] = b
    return out


def _common(family: str, order: str, order_src: str, rule: str, rule_src: str, clamp: str,
            clamp_src: str) -> dict[str, Hint]:
    return {"order": (order, order_src), "shift_rule": (rule, rule_src), "clamp": (clamp, clamp_src),
            "shift": ("half", f"family: {family} shifts every second block of a stage by window // 2"),
            "mask_value": (-100.0, f"family: {family} masks the shifted windows with -100"),
            "mlp_kind": ("gelu", f"family: {family} Swin MLPs use exact GELU")}


# ---------------------------------------------------------------------------------------------------- torchvision

def torchvision_swin_weights(file_name: str) -> dict[str, Any] | None:
    """A torchvision Swin release by its torch-hub file name (e.g. 'swin_t-704ceda3.pth'), offline: {'arch',
    'weights', 'window', 'image_size', 'categories', 'crop', 'resize', 'interpolation', 'mean', 'std'} or None."""
    try:
        from torchvision.models import swin_transformer as tv
    except ImportError:  # torchvision is a dependency, but a broken install must not stop a file from opening
        return None
    base = file_name.split("/")[-1]
    for enum, window in ((tv.Swin_T_Weights, 7), (tv.Swin_S_Weights, 7), (tv.Swin_B_Weights, 7),
                         (tv.Swin_V2_T_Weights, 8), (tv.Swin_V2_S_Weights, 8), (tv.Swin_V2_B_Weights, 8)):
        for w in enum:
            if w.url.split("/")[-1] == base:
                t = w.transforms()
                return {"arch": enum.__name__.replace("_Weights", "").lower(), "weights": f"{enum.__name__}.{w.name}",
                        "window": window, "image_size": int(t.crop_size[0]), "categories": tuple(w.meta["categories"]),
                        "crop": int(t.crop_size[0]), "resize": int(t.resize_size[0]),
                        "interpolation": t.interpolation.value, "mean": tuple(t.mean), "std": tuple(t.std)}
    return None


def _torchvision(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    stages = sorted({int(m.group(1)) for k in sd if (m := re.match(r"^features\.(\d+)\.\d+\.", k))
                     and int(m.group(1)) % 2 == 1})
    hints = _windows_from_buffers(sd, r"^features\.(\d+)\.(\d+)\.attn\.(?:relative_position_index|"
                                      r"relative_coords_table)$")
    hints = {f"window:{(int(k.split(':')[1].split('.')[0]) - 1) // 2}.{k.split('.')[-1]}": v for k, v in hints.items()}
    sd, dropped = _drop_buffers(sd)
    rules: list[tuple[str, str]] = [
        (r"^features\.0\.0\.", "patch_embed.proj."), (r"^features\.0\.2\.", "patch_embed.norm."),
        (r"^head\.", "head.fc."), (r"\.mlp\.0\.", ".mlp.fc1."), (r"\.mlp\.3\.", ".mlp.fc2.")]
    for s, feature in enumerate(stages):
        rules.append((rf"^features\.{feature}\.(\d+)\.", rf"layers.{s}.blocks.\1."))
        if s:
            rules.append((rf"^features\.{feature - 1}\.(reduction|norm)\.", rf"layers.{s}.downsample.\1."))
    sd = _zero_k_bias(rename(sd, rules))
    fam = "torchvision SwinTransformer"
    hints.update(_common(fam, "pad_roll", f"family: {fam} pads the grid to whole windows, then rolls it",
                         "fits", f"family: {fam} keeps its window and drops the shift along a side one padded "
                         "window covers", "none", f"family: {fam} pads instead of shrinking a window"))
    hints["eps"] = (1e-5, f"family: {fam} LayerNorm eps 1e-5")
    hints["eps_embed"] = (1e-5, f"family: {fam} LayerNorm eps 1e-5")
    hints["pretrained_windows"] = ((0, 0), f"family: {fam} normalises Swin v2 offsets by the window itself")
    tv = torchvision_swin_weights(raw.weights_file.name) if raw.weights_file else None
    if tv:
        named = f"named: torchvision {tv['arch']} ({tv['weights']}, file name)"
        hints["identity"] = (tv["arch"], named)
        hints["image_size"] = ((tv["image_size"],) * 2, named)
        hints["preprocess"] = (dict(crop=(tv["crop"],) * 2, resize=tv["resize"], interpolation=tv["interpolation"],
                                    mean=tv["mean"], std=tv["std"], mode="center"),
                               f"metadata: torchvision {tv['weights']}")
        hints["labels"] = (tv["categories"], f"metadata: torchvision {tv['weights']}")
    else:
        hints["image_size"] = ((224, 224), f"default: {fam}'s 224 px (swin_t/s/b; the v2 releases are 256 px)")
        hints["preprocess"] = (dict(crop=(224, 224), resize=232, interpolation="bicubic", mean=(0.485, 0.456, 0.406),
                                    std=(0.229, 0.224, 0.225), mode="center"),
                               f"family: {fam}'s eval recipe (resize 232, center crop 224, bicubic, ImageNet mean/std)")
    return Converted("torchvision-swin", sd, hints, dropped)


# ----------------------------------------------------------------------------------------------- timm / microsoft

_ARCH = re.compile(r"^swin(?:v2(?:_cr)?)?_\w+?(?:_patch(?P<patch>\d+))?_window(?P<win>\d+)(?:to(?P<win2>\d+))?"
                   r"_(?P<size>\d+)(?:to(?P<size2>\d+))?$")
# timm model_args vitviz reads (each changes the computation; the rest are flagged as unread)
_READ_ARGS = ("img_size", "patch_size", "in_chans", "num_classes", "global_pool", "embed_dim", "depths", "num_heads",
              "window_size", "mlp_ratio", "qkv_bias", "pretrained_window_sizes", "act_layer", "always_partition",
              "strict_img_size", "dynamic_img_size")
_IGNORED_ARGS = ("drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate", "weight_init", "pretrained_cfg",
                 "pretrained_cfg_overlay")


def parse_swin_name(name: str) -> dict[str, Any]:
    """What a timm Swin name fixes: 'swinv2_base_window12to16_192to256' -> {'window': 16, 'image_size': 256,
    'pretrained_window': 12, 'pretrained_size': 192, 'patch': 4}; {} when the name says nothing."""
    m = _ARCH.match(name.split(".")[0])
    if not m:
        return {}
    out: dict[str, Any] = {"window": int(m.group("win2") or m.group("win")),
                           "image_size": int(m.group("size2") or m.group("size")), "patch": int(m.group("patch") or 4)}
    if m.group("win2"):
        out["pretrained_window"], out["pretrained_size"] = int(m.group("win")), int(m.group("size"))
    return out


def _timm(sd: dict[str, torch.Tensor], raw: RawCheckpoint, original: bool) -> Converted:
    import torch

    hints = _windows_from_buffers(sd, r"^layers\.(\d+)\.blocks\.(\d+)\.attn\.(?:relative_position_index|"
                                      r"relative_coords_table)$")
    if original:  # microsoft/Swin-Transformer: the merging sits at the end of stage S; timm puts it at S + 1
        sd = rename(sd, [(r"^layers\.(\d+)\.downsample\.", lambda m: f"layers.{int(m.group(1)) + 1}.downsample."),
                         (r"^head\.(weight|bias)$", r"head.fc.\1")])
    sd, dropped = _drop_buffers(sd)
    out = {}
    for key, t in sd.items():   # Swin v2: q_bias and v_bias around a zero k bias
        if key.endswith(".attn.q_bias"):
            v = sd[key.replace(".q_bias", ".v_bias")]
            out[key.replace(".q_bias", ".qkv.bias")] = torch.cat([t, torch.zeros_like(t), v])
        elif not key.endswith(".attn.v_bias"):
            out[key] = t
    fam = "microsoft Swin-Transformer" if original else "timm SwinTransformer"
    cfg = raw.config or {}
    margs = cfg.get("model_args") or {}
    pcfg = cfg.get("pretrained_cfg") or {}
    arch = str(cfg.get("architecture") or pcfg.get("architecture") or "")
    named = parse_swin_name(arch)
    hints.update(_common(fam, "roll_pad", f"family: {fam} rolls the grid, then pads it to whole windows",
                         "built", f"family: {fam} keeps the windows and shifts it was built with",
                         "per_side", f"family: {fam} shrinks a window to a stage grid no larger than it, "
                         "and drops the shift there"))
    hints["eps"] = (1e-5, f"family: {fam} nn.LayerNorm eps 1e-5")
    hints["eps_embed"] = (1e-5, f"family: {fam} nn.LayerNorm eps 1e-5")
    if arch:
        hints["identity"] = (arch, f"named: timm architecture {arch!r} (config.json)")
    hints["preprocess"] = (dict(crop=(224, 224), resize=248, interpolation="bicubic", mean=(0.485, 0.456, 0.406),
                                std=(0.229, 0.224, 0.225), mode="center"),
                           f"family: {fam}'s default_cfg (crop_pct 0.9, bicubic, ImageNet mean/std)")
    where = "metadata: config.json model_args"
    if "window_size" in margs:
        hints["window"] = (margs["window_size"], f"{where} window_size")
    elif named:
        hints["window"] = (named["window"], f"named: timm architecture {arch!r}")
    if margs.get("img_size") is not None:
        hints["image_size"] = (_pair(margs["img_size"]), f"{where} img_size")
    elif pcfg.get("input_size"):
        hints["image_size"] = (tuple(pcfg["input_size"][-2:]), "metadata: config.json pretrained_cfg input_size")
    elif named:
        hints["image_size"] = ((named["image_size"],) * 2, f"named: timm architecture {arch!r}")
    else:
        hints["image_size"] = ((224, 224), f"default: {fam}'s 224 px (most releases; pass image_size=N)")
    if "pretrained_window_sizes" in margs:
        hints["pretrained_windows"] = (tuple(margs["pretrained_window_sizes"]), f"{where} pretrained_window_sizes")
    elif named.get("pretrained_window"):
        hints["pretrained_windows"] = (("from", named["pretrained_window"], named["pretrained_size"]),
                                       f"named: timm architecture {arch!r} (pretrained at window "
                                       f"{named['pretrained_window']}, {named['pretrained_size']} px)")
    else:
        hints["pretrained_windows"] = ((0, 0), f"default: {fam} pretrained_window_sizes 0 (the window itself)"
                                       if not arch else f"named: timm architecture {arch!r} (no pretrained window)")
    if margs.get("act_layer") not in (None, "gelu"):
        hints["mlp_kind"] = (str(margs["act_layer"]), f"{where} act_layer")
    if margs.get("always_partition"):
        hints["clamp"] = ("none", f"{where} always_partition")
    if margs.get("global_pool") not in (None, "avg"):
        raise UnknownLayoutError(f"{raw.path}: timm Swin with global_pool {margs['global_pool']!r}; vitviz's windowed "
                                 "model averages the last stage ('avg')")
    if margs.get("head_dim") is not None:
        raise UnknownLayoutError(f"{raw.path}: timm Swin with head_dim {margs['head_dim']}: heads of another width "
                                 "than the stage's are not supported")
    unread = sorted(k for k in margs if k not in _READ_ARGS + _IGNORED_ARGS)
    if unread:
        hints["model_args"] = (unread, f"assumed: timm model_args vitviz does not read ({', '.join(unread)}); each "
                               "may change the computation")
    return Converted("swin" if original else "timm-swin", out, hints, dropped)


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[-1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


# ---------------------------------------------------------------------------------------------------- transformers

def _hf(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    import torch

    sd = {re.sub(r"^(swin|swinv2)\.", "", k): v for k, v in sd.items()}
    v2 = any(k.endswith("logit_scale") for k in sd)
    sd, dropped = _drop_buffers(sd)
    dropped += [k for k in sd if k.endswith("mask_token")]
    sd = {k: v for k, v in sd.items() if not k.endswith("mask_token")}
    blk = r"^encoder\.layers\.(\d+)\.blocks\.(\d+)\."
    rules: list[tuple[str, Any]] = [
        (r"^embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
        (r"^embeddings\.norm\.", "patch_embed.norm."),
        (r"^embeddings\.position_embeddings$", "absolute_pos_embed"),
        (r"^encoder\.layers\.(\d+)\.downsample\.", lambda m: f"layers.{int(m.group(1)) + 1}.downsample."),
        (blk, r"layers.\1.blocks.\2."), (r"\.layernorm_before\.", ".norm1."), (r"\.layernorm_after\.", ".norm2."),
        (r"\.attention\.(?:self\.)?relative_position_bias(?:\.relative_position_bias)?_table$",
         ".attn.relative_position_bias_table"),
        (r"\.attention\.self\.logit_scale$", ".attn.logit_scale"),
        (r"\.attention\.self\.continuous_position_bias_mlp\.", ".attn.cpb_mlp."),
        (r"\.attention\.(?:output\.dense|o_proj)\.", ".attn.proj."),
        (r"\.intermediate\.dense\.", ".mlp.fc1."), (r"\.output\.dense\.", ".mlp.fc2."),
        (r"^layernorm\.", "norm."), (r"^classifier\.", "head.fc."),
    ]
    sd = rename(sd, rules)
    out: dict[str, torch.Tensor] = {}
    qkv = re.compile(r"^(.*)\.attention\.(?:self\.)?(query|key|value|q_proj|k_proj|v_proj)\.(weight|bias)$")
    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, t in sd.items():
        m = qkv.match(key)
        if m:
            role = {"query": "q", "key": "k", "value": "v", "q_proj": "q", "k_proj": "k", "v_proj": "v"}[m.group(2)]
            parts.setdefault((m.group(1), m.group(3)), {})[role] = t
        else:
            out[key] = t
    for (prefix, kind), found in parts.items():
        if kind == "bias" and "k" not in found and "q" in found:   # Swin v2: no k bias
            found["k"] = torch.zeros_like(found["q"])
        missing = [r for r in "qkv" if r not in found]
        if missing:
            raise UnknownLayoutError(f"{raw.path}: {prefix}.attention has no {'/'.join(missing)} {kind}")
        out[f"{prefix}.attn.qkv.{kind}"] = torch.cat([found["q"], found["k"], found["v"]])
    cfg = raw.config or {}
    fam = "transformers " + ("Swinv2Model" if v2 else "SwinModel")
    if v2:
        hints = _common(fam, "pad_roll", f"family: {fam} pads the grid to whole windows, then rolls it", "built",
                        f"family: {fam} keeps the windows and shifts it was built with", "square",
                        f"family: {fam} shrinks a window to a stage grid no larger than it (square, by the grid's "
                        "height), and drops the shift there")
        hints["mask_value"] = (-200.0, f"family: {fam} adds its shift mask twice (-100 each time)")
    else:
        hints = _common(fam, "pad_roll", f"family: {fam} pads the grid to whole windows, then rolls it", "min_side",
                        f"family: {fam} drops the shift of every block once the grid's shorter side fits in a "
                        "window, at each run", "none", f"family: {fam} pads instead of shrinking a window")
    if cfg.get("model_type"):
        hints["identity"] = (cfg["model_type"], f"named: transformers model_type {cfg['model_type']!r} (config.json)")
    if cfg.get("layer_norm_eps") is not None:
        hints["eps"] = (float(cfg["layer_norm_eps"]), "metadata: config.json layer_norm_eps")
    else:
        hints["eps"] = (1e-5, f"default: {fam} layer_norm_eps 1e-5")
    hints["eps_embed"] = (1e-5, f"family: {fam}'s patch-embedding and merging LayerNorms take nn.LayerNorm's 1e-5")
    if cfg.get("hidden_act") is not None:
        act = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
               "silu": "silu", "swish": "silu", "quick_gelu": "quick_gelu"}.get(str(cfg["hidden_act"]))
        if act is None:
            raise UnknownLayoutError(f"{raw.path}: config.json hidden_act {cfg['hidden_act']!r} is not supported")
        hints["mlp_kind"] = (act, "metadata: config.json hidden_act")
    if cfg.get("window_size") is not None:
        hints["window"] = (cfg["window_size"], "metadata: config.json window_size")
    if cfg.get("image_size") is not None:
        hints["image_size"] = (_pair(cfg["image_size"]), "metadata: config.json image_size")
    else:
        hints["image_size"] = ((224, 224), f"default: {fam} image_size 224")
    if v2:
        pws = cfg.get("pretrained_window_sizes")
        hints["pretrained_windows"] = (tuple(pws), "metadata: config.json pretrained_window_sizes") if pws else \
            ((0, 0), f"default: {fam} pretrained_window_sizes 0 (the window itself)")
    if cfg.get("id2label"):
        labels = cfg["id2label"]
        hints["labels"] = (tuple(labels[k] for k in sorted(labels, key=int)) if isinstance(labels, dict)
                           else tuple(labels), "metadata: config.json")
    hints["pos_interp"] = ("hf", f"family: {fam} resamples its position table bicubically "
                                 "(interpolate_pos_encoding)")
    hints["preprocess"] = (dict(crop=hints["image_size"][0], resize=min(hints["image_size"][0]),
                                interpolation="bicubic", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                                mode="squash"),
                           f"family: {fam}'s image processor (squashed to the model size, bicubic, ImageNet mean/std)")
    return Converted("hf-swin", out, hints, dropped)
