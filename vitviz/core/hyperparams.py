"""Build a `ModelSpec` from canonical tensors, family hints, metadata and the caller's overrides.

Every inferred value records where it came from in `ModelSpec.provenance`.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import torch

from vitviz.core.checkpoint import RawCheckpoint
from vitviz.core.families import Converted
from vitviz.core.metadata import args_info, heads_from_dim, parse_model_name, torchvision_weights
from vitviz.core.spec import (
    IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, ModelSpec, Preprocess, whole_patches,
)
from vitviz.errors import InconsistentCheckpointError, VitvizError

OVERRIDES = ("heads", "family", "image_size", "eps", "mean", "std", "interpolation", "labels", "pos_interp",
             "act", "nest_key", "device", "resize", "crop_mode")

FAMILY_PREPROCESS = {  # checkpoint-formats.md §7 (crop_pct, interpolation, mean, std, mode)
    "timm": (0.9, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "center"),
    "deit": (0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
    "deit3": (0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
    "dino": (0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
    "dinov2": (0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
    "mae": (0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
    "torchvision": (0.875, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "center"),
    "hf": (1.0, "bilinear", INCEPTION_MEAN, INCEPTION_STD, "squash"),
    "seed": (1.0, "bilinear", (0.0,), (1.0,), "squash"),
}


class _Prov:
    """Collects (field, source) pairs."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def set(self, name: str, value: Any, source: str) -> Any:
        self.items[name] = source
        return value


def infer_spec(conv: Converted, raw: RawCheckpoint, overrides: dict[str, Any]) -> ModelSpec:
    """The full spec for `conv`; raises InconsistentCheckpointError when shapes contradict each other."""
    sd, hints, prov = conv.tensors, conv.hints, _Prov()
    where = str(raw.path)
    if "patch_embed.proj.weight" not in sd:
        raise InconsistentCheckpointError(f"{where}: ViT layout without a patch embedding "
                                          "(patch_embed.proj.weight); expected a complete model")
    w = sd["patch_embed.proj.weight"]
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise InconsistentCheckpointError(f"{where}: patch embedding has shape {tuple(w.shape)}; expected "
                                          "(embed_dim, channels, patch, patch)")
    dim, in_chans, patch = int(w.shape[0]), int(w.shape[1]), int(w.shape[-1])
    depth = len({int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))})
    if depth == 0:
        raise InconsistentCheckpointError(f"{where}: no transformer blocks (blocks.N.*) found")
    name, name_fields = _model_name(conv, raw)
    info = parse_model_name(name) if name else None
    margs = (raw.config or {}).get("model_args") or {}
    if margs.get("num_heads") and "num_heads" not in hints:
        hints = {**hints, "num_heads": (int(margs["num_heads"]), "metadata: config.json model_args")}
    heads = _heads(sd, hints, overrides, info, name, dim, prov, where)
    counts = _token_counts(sd)
    pos_prefix, pos_grid = _pos_layout(sd, hints, raw, conv, counts, patch, name_fields, info, prov, where,
                                       overrides.get("image_size"))
    fields = dict(
        family=overrides.get("family") or conv.family, source=where, patch_size=patch, embed_dim=dim,
        depth=depth, num_heads=heads, in_chans=in_chans, pos_prefix=pos_prefix, pos_grid=pos_grid,
        pos_embed="pos_embed" in sd, **counts, **_shape_flags(sd, hints, dim, prov),
    )
    fields["eps"] = _pick("eps", overrides, hints, 1e-6, prov, "default: timm LayerNorm eps")
    act = overrides.get("act")
    fields["mlp_kind"] = prov.set("mlp_kind", act, "override") if act else \
        _pick("mlp_kind", {}, hints, "gelu", prov, "default: exact GELU")
    fields["pos_interp"] = _pick("pos_interp", overrides, hints, "timm", prov, "default: timm recipe")
    fields["image_size"] = _image_size(overrides, conv.family, pos_grid, patch, prov)
    fields["preprocess"] = _preprocess(conv, raw, overrides, fields["image_size"], prov)
    fields["labels"] = _labels(conv, raw, overrides, fields["num_classes"], prov)
    for key in ("num_heads", "pos_grid", "pos_prefix"):
        prov.items.setdefault(key, "shape")
    return ModelSpec(**fields, provenance=tuple(sorted(prov.items.items())))


def _model_name(conv: Converted, raw: RawCheckpoint) -> tuple[str, dict[str, Any]]:
    cfg = raw.config or {}
    if isinstance(cfg.get("architecture"), str):  # timm hub config.json
        return cfg["architecture"], {}
    name, fields = args_info(raw.meta)
    if not name and conv.family == "torchvision":
        tv = torchvision_weights(raw.weights_file.name if raw.weights_file else "")
        if tv:
            return tv["arch"], {"image_size": tv["image_size"], "source": f"metadata: file name ({tv['weights']})"}
    return name, fields


def _pick(name: str, overrides: dict[str, Any], hints: dict[str, Any], default: Any, prov: _Prov,
          default_src: str) -> Any:
    if overrides.get(name) is not None:
        return prov.set(name, overrides[name], "override")
    if name in hints:
        return prov.set(name, hints[name][0], hints[name][1])
    return prov.set(name, default, default_src)


def _heads(sd: dict[str, torch.Tensor], hints: dict[str, Any], overrides: dict[str, Any], info: Any,
           name: str, dim: int, prov: _Prov, where: str) -> int:
    cfg_heads = hints.get("num_heads")
    qn = sd.get("blocks.0.attn.q_norm.weight")
    if overrides.get("heads"):
        heads, src = int(overrides["heads"]), "override"
    elif cfg_heads:
        heads, src = cfg_heads
    elif info is not None and info.heads:
        heads, src = info.heads, f"metadata: model name {name!r}"
    elif qn is not None:
        heads, src = dim // int(qn.shape[0]), "shape: attn.q_norm.weight (head_dim)"
    elif hints.get("default_heads") and dim == hints["default_heads"][0][1]:
        heads, src = hints["default_heads"][0][0], hints["default_heads"][1]
    else:
        heads, src = heads_from_dim(dim)
    if heads <= 0 or dim % heads:
        raise InconsistentCheckpointError(f"{where}: {heads} heads ({src}) do not divide embed_dim {dim}; "
                                          "expected a head count that divides the embedding width (pass heads=N)")
    return prov.set("num_heads", int(heads), src)


def _token_counts(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    reg = sd.get("reg_token")
    return dict(cls_token="cls_token" in sd, dist_token="dist_token" in sd,
                reg_tokens=int(reg.shape[1]) if reg is not None else 0)


def _shape_flags(sd: dict[str, torch.Tensor], hints: dict[str, Any], dim: int, prov: _Prov) -> dict[str, Any]:
    head = sd.get("head.weight")
    pre = sd.get("pre_logits.fc.weight")
    flags = dict(
        mlp_hidden=int(sd["blocks.0.mlp.fc1.weight"].shape[0]) if "blocks.0.mlp.fc1.weight" in sd else 4 * dim,
        num_classes=int(head.shape[0]) if head is not None else 0,
        qkv_bias="blocks.0.attn.qkv.bias" in sd, qk_norm="blocks.0.attn.q_norm.weight" in sd,
        layer_scale="blocks.0.ls1.gamma" in sd, patch_bias="patch_embed.proj.bias" in sd,
        final_norm="norm.weight" in sd, fc_norm="fc_norm.weight" in sd,
        pre_logits=int(pre.shape[0]) if pre is not None else 0, head_dist="head_dist.weight" in sd,
    )
    if "pooling" in hints:
        flags["pooling"] = prov.set("pooling", hints["pooling"][0], hints["pooling"][1])
    elif flags["fc_norm"] or "cls_token" not in sd:
        flags["pooling"] = prov.set("pooling", "avg", "shape: fc_norm or no cls_token -> average of patches")
    else:
        flags["pooling"] = prov.set("pooling", "token", "shape: cls_token")
    return flags


def _pos_layout(sd: dict[str, torch.Tensor], hints: dict[str, Any], raw: RawCheckpoint, conv: Converted,
                counts: dict[str, Any], patch: int, name_fields: dict[str, Any], info: Any, prov: _Prov,
                where: str, requested: Any = None) -> tuple[int, tuple[int, int]]:
    """How many prefix tokens the position embedding covers, and the grid it was trained at.

    Without metadata the grid is taken as square, unless the caller's `image_size` fits the embedding: then a
    non-square training size is read from it.
    """
    n_prefix = int(counts["cls_token"]) + int(counts["dist_token"]) + counts["reg_tokens"]
    size, size_src = _stored_image_size(hints, raw, name_fields, info)
    if size is None and requested and "pos_embed" in sd:
        req = (int(requested), int(requested)) if isinstance(requested, (int, float)) else tuple(map(int, requested))
        n = (req[0] // patch) * (req[1] // patch)
        if int(sd["pos_embed"].shape[1]) - n in ([hints["pos_prefix"][0]] if "pos_prefix" in hints else [n_prefix, 0]):
            size, size_src = req, "override: image_size fits the position embedding"
    pos = sd.get("pos_embed")
    if pos is None:
        grid = (size[0] // patch, size[1] // patch) if size else (14, 14)
        return 0, prov.set("pos_grid", grid, size_src if size else "default")
    length = int(pos.shape[1])
    options = [hints["pos_prefix"][0]] if "pos_prefix" in hints else [n_prefix, 0]
    for k in options:
        n = length - k
        if size:
            grid = (size[0] // patch, size[1] // patch)
            if grid[0] * grid[1] == n:
                prov.set("pos_prefix", k, hints.get("pos_prefix", (0, "shape: pos_embed length"))[1])
                return k, prov.set("pos_grid", grid, size_src)
        elif n > 0 and math.isqrt(n) ** 2 == n:
            prov.set("pos_prefix", k, hints.get("pos_prefix", (0, "shape: pos_embed length"))[1])
            return k, prov.set("pos_grid", (math.isqrt(n),) * 2, "shape: pos_embed length (square grid)")
    expect = f"image size {size} ({size_src}) with patch {patch}" if size else "a square grid"
    raise InconsistentCheckpointError(
        f"{where}: pos_embed has {length} rows, which does not fit {expect} plus {options} prefix tokens "
        f"({n_prefix} prefix tokens in the file); pass image_size=(h, w) if the model was trained non-square")


def _stored_image_size(hints: dict[str, Any], raw: RawCheckpoint, name_fields: dict[str, Any],
                       info: Any) -> tuple[tuple[int, int] | None, str]:
    if "pos_image_size" in hints:
        return tuple(hints["pos_image_size"][0]), hints["pos_image_size"][1]
    cfg = raw.config or {}
    margs = cfg.get("model_args") or {}
    pcfg = cfg.get("pretrained_cfg") or {}
    if margs.get("img_size"):
        s = margs["img_size"]
        return ((s, s) if isinstance(s, int) else tuple(s)), "metadata: config.json model_args"
    if pcfg.get("input_size"):
        return tuple(pcfg["input_size"][-2:]), "metadata: config.json pretrained_cfg"
    if name_fields.get("image_size"):
        s = name_fields["image_size"]
        return (s, s), name_fields.get("source", "metadata: training args")
    if info is not None and info.image:
        return (info.image, info.image), "metadata: model name"
    return None, ""


def _image_size(overrides: dict[str, Any], family: str, pos_grid: tuple[int, int], patch: int,
                prov: _Prov) -> tuple[int, int]:
    s = overrides.get("image_size")
    if s:
        size = (int(s), int(s)) if isinstance(s, (int, float)) else (int(s[0]), int(s[1]))
        if min(size) < patch:
            raise VitvizError(f"image_size {size} is smaller than one {patch} px patch")
        whole = whole_patches(size, patch)
        if whole != size:  # the patch embedding drops the remainder: say so instead of keeping a size never used
            return prov.set("image_size", whole, f"override {size[0]}x{size[1]}, rounded down to whole {patch} px "
                                                 "patches")
        return prov.set("image_size", size, "override")
    if family in ("dinov2", "hf-dinov2") and pos_grid[0] * patch > 224:
        return prov.set("image_size", (224, 224), "default: DINOv2 evaluation size (position embedding resampled)")
    return prov.set("image_size", (pos_grid[0] * patch, pos_grid[1] * patch), "shape: position embedding grid")


def _preprocess(conv: Converted, raw: RawCheckpoint, overrides: dict[str, Any], size: tuple[int, int],
                prov: _Prov) -> Preprocess:
    fam = conv.family.split("-")[0]
    crop_pct, interp, mean, std, mode = FAMILY_PREPROCESS.get(fam, FAMILY_PREPROCESS["timm"])
    fields: dict[str, Any] = dict(crop=size, resize=int(math.floor(min(size) / crop_pct)), interpolation=interp,
                                  mean=mean, std=std, mode=mode)
    src = f"default: {conv.family} family"
    tv = torchvision_weights(raw.weights_file.name) if conv.family == "torchvision" and raw.weights_file else None
    pcfg = (raw.config or {}).get("pretrained_cfg") or {}
    if tv:
        fields.update(resize=tv["resize"], crop=(tv["crop"],) * 2, interpolation=tv["interpolation"],
                      mean=tv["mean"], std=tv["std"])
        src = f"metadata: torchvision {tv['weights']}"
    elif pcfg:
        pct = float(pcfg.get("crop_pct", crop_pct))
        fields.update(resize=int(math.floor(min(size) / pct)), interpolation=pcfg.get("interpolation", interp),
                      mean=tuple(pcfg.get("mean", mean)), std=tuple(pcfg.get("std", std)))
        fields["mode"] = "squash" if pcfg.get("crop_mode") == "squash" else "center"
        src = "metadata: config.json pretrained_cfg"
    elif "preprocess" in conv.hints:
        fields.update(conv.hints["preprocess"][0])
        src = conv.hints["preprocess"][1]
    pp = Preprocess(**fields)
    if tuple(pp.crop) != tuple(size):
        pp = pp.at_size(size) if overrides.get("image_size") else replace(pp, crop=tuple(size))
    for key in ("mean", "std"):
        values = overrides.get(key)
        if values is not None and len(tuple(values)) not in (1, 3):
            raise VitvizError(f"{key} override has {len(tuple(values))} values; expected 1 or 3 (one per channel)")
    for key in ("mean", "std", "interpolation", "resize"):
        if overrides.get(key) is not None:
            pp = replace(pp, **{key: tuple(overrides[key]) if key in ("mean", "std") else overrides[key]})
            src += f"; {key} overridden"
    prov.set("preprocess", pp, src)
    return pp


def _labels(conv: Converted, raw: RawCheckpoint, overrides: dict[str, Any], num_classes: int,
            prov: _Prov) -> tuple[str, ...]:
    cfg = raw.config or {}
    tv = torchvision_weights(raw.weights_file.name) if conv.family == "torchvision" and raw.weights_file else None
    candidates: list[tuple[Any, str]] = [
        (overrides.get("labels"), "override"), (conv.hints.get("labels", (None,))[0], "metadata: config.json"),
        (raw.labels, "metadata: class_indices.json"),
        (tv["categories"] if tv else None, "metadata: torchvision weights"),
        (cfg.get("label_names"), "metadata: config.json label_names"),
    ]
    for labels, src in candidates:
        if labels:
            labels = tuple(labels.values()) if isinstance(labels, dict) else tuple(map(str, labels))
            if len(labels) == num_classes:
                return prov.set("labels", labels, src)
    if num_classes == 1000:
        from torchvision.models._meta import _IMAGENET_CATEGORIES

        return prov.set("labels", tuple(_IMAGENET_CATEGORIES), "guess: 1000 classes -> ImageNet-1k names")
    return prov.set("labels", (), "none")

