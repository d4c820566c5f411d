"""Hyper-parameters that no tensor shape holds: num_heads tables, model-name parsing, torchvision weights.

Order of trust (DESIGN.md): metadata (config files, training `args`, file names) first, then shapes, then the
embed-dim table; the caller can override anything.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# embed_dim -> num_heads for the registered timm / DINO / torchvision ViTs (checkpoint-formats.md §6).
HEADS_BY_DIM = {192: 3, 256: 4, 320: 5, 384: 6, 512: 8, 640: 10, 768: 12, 832: 13, 896: 14, 1024: 16,
                1152: 16, 1280: 16, 1408: 16, 1664: 16, 2048: 16, 3072: 24}
SIZE_WORD_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "huge": 16, "giant": 16,
                   "gigantic": 16, "s": 6, "b": 12, "l": 16, "h": 16, "g": 24, "g2": 24}
# the width each size word names (ViT-g/14 is 1408 wide; DINOv2's 'vitg14' / giant2 1536): a name's size word fixes
# the head count only at that width -- timm's DINOv2 'vit_giant_patch14_dinov2' is 1536 wide with 24 heads, not
# ViT-g/14's 16, and 'vit_huge_plus_patch16_dinov3' 1280 wide with 20 (its registered count: `named_heads`)
SIZE_WORD_WIDTH = {"tiny": 192, "small": 384, "medium": 512, "base": 768, "large": 1024, "huge": 1280,
                   "giant": 1408, "gigantic": 1664, "s": 384, "b": 768, "l": 1024, "h": 1280, "g": 1536, "g2": 1536}


def heads_from_dim(dim: int) -> tuple[int, str]:
    """num_heads for an attention width (the embed dim, unless q/k/v are wider): the table, else head_dim 64,
    else the largest sensible split."""
    if dim in HEADS_BY_DIM:
        return HEADS_BY_DIM[dim], f"table: embed_dim {dim}"
    if dim % 64 == 0:
        return dim // 64, f"guess: width {dim} / head_dim 64 (nothing in the file gives the head count)"
    for hd in (32, 16, 8):
        if dim % hd == 0:
            return dim // hd, f"guess: width {dim} / head_dim {hd} (nothing in the file gives the head count)"
    return 1, f"guess: width {dim} has no usual head split (nothing in the file gives the head count)"


@dataclass(frozen=True)
class NameInfo:
    heads: int | None = None
    patch: int | None = None
    image: int | None = None
    width: int | None = None   # the width the size word names (`heads` holds only at it)


def _arch(name: str) -> str:
    """A model name's architecture: lower case, no folder, no pretrained tag ('timm/ViT_x.augreg' -> 'vit_x')."""
    return name.lower().split("/")[-1].split(".")[0]


def parse_model_name(name: str) -> NameInfo:
    """Read heads, patch and image size from names like 'vit_base_patch16_384', 'deit_small_distilled_patch16_224',
    'dinov2_vitl14_reg', 'vit_small' (DINO `args.arch`) or torchvision 'vit_b_16'."""
    n = _arch(name)
    heads = patch = image = word = None
    m = re.search(r"(tiny|small|medium|base|large|huge|giant|gigantic)", n)
    if m:
        word = m.group(1)
    m2 = re.search(r"(?:dinov2_)?vit([sblg]2?)(\d+)", n)
    if m2 and word is None:
        word, patch = m2.group(1), int(m2.group(2))
    m3 = re.match(r"vit_([blh])_(\d+)", n)
    if m3 and word is None:
        word, patch = m3.group(1), int(m3.group(2))
    if word is not None:
        heads = SIZE_WORD_HEADS[word]
    if (mp := re.search(r"patch(\d+)", n)):
        patch = int(mp.group(1))
    if (mi := re.search(r"patch\d+_(\d{2,4})", n)):
        image = int(mi.group(1))
    return NameInfo(heads, patch, image, SIZE_WORD_WIDTH.get(word) if word else None)


# torchvision's ViT builders: (width, heads), fixed in each builder
TORCHVISION_HEADS = {"vit_b_16": (768, 12), "vit_b_32": (768, 12), "vit_l_16": (1024, 16), "vit_l_32": (1024, 16),
                     "vit_h_14": (1280, 16)}


def named_heads(name: str, width: int) -> tuple[int, str] | None:
    """The head count a model's name fixes at attention width `width`, with its source: timm's registered count
    for an architecture timm registers (`timm_heads`, generated from timm; at another width too, where it divides
    it: timm builds a name's registered arguments updated by model_args, so a changed width keeps the count), else
    the name's size word where `width` is the width it names; None where the name fixes nothing (a size word at
    another width: 'giant' is 16 heads at 1408, 24 at 1536)."""
    from vitviz.core.reading.timm_heads import TIMM_HEADS, TIMM_VERSION

    arch = _arch(name)
    known = TIMM_HEADS.get(arch) or TORCHVISION_HEADS.get(arch)
    if known is not None:
        registered, heads = known
        library = f"timm {TIMM_VERSION} registers" if arch in TIMM_HEADS else "torchvision builds"
        if registered == width:
            return heads, f"named model: {library} {arch!r} with {heads} heads ({width} wide)"
        # the library builds the name's own arguments, a width changed (timm's model_args) keeps the count
        if width % heads == 0:
            return heads, (f"named model: {library} {arch!r} with {heads} heads; the width here is "
                           f"{width} ({registered} registered), the head count its own")
        return None
    info = parse_model_name(name)
    if info.heads and info.width == width:
        return info.heads, f"metadata: model name {name!r}"
    return None


def torchvision_weights(file_name: str) -> dict[str, Any] | None:
    """Identify a torch-hub file name (e.g. 'vit_b_16-c867db91.pth') with torchvision's Weights enum, offline.

    Returns:
        {'arch', 'weights', 'categories', 'image_size', 'resize', 'crop', 'interpolation', 'mean', 'std',
        'num_params'} or None when the name is not a torchvision ViT file.
    """
    from torchvision.models import vision_transformer as tv

    base = file_name.split("/")[-1]
    for enum in (tv.ViT_B_16_Weights, tv.ViT_B_32_Weights, tv.ViT_L_16_Weights, tv.ViT_L_32_Weights,
                 tv.ViT_H_14_Weights):
        for w in enum:
            if w.url.split("/")[-1] == base:
                t = w.transforms()
                return {
                    "arch": enum.__name__.replace("_Weights", "").lower(), "weights": f"{enum.__name__}.{w.name}",
                    "categories": tuple(w.meta["categories"]), "image_size": int(w.meta["min_size"][0]),
                    "resize": int(t.resize_size[0]), "crop": int(t.crop_size[0]),
                    "interpolation": t.interpolation.value, "mean": tuple(t.mean), "std": tuple(t.std),
                    "num_params": int(w.meta["num_params"]),
                }
    return None


def args_info(meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The model name and useful fields from a training checkpoint's `arch`/`args`."""
    args = meta.get("args") or {}
    if not isinstance(args, dict):
        args = {}
    name = str(meta.get("arch") or args.get("model") or args.get("arch") or "")
    fields = {}
    for key in ("img_size", "input_size"):
        v = args.get(key)
        if isinstance(v, (list, tuple)) and v:
            v = v[-1]
        if as_int(v) is not None:  # a size of the wrong type or range is not a size: ignored
            fields["image_size"] = as_int(v)
    if as_int(args.get("patch_size")) is not None:
        fields["patch_size"] = as_int(args["patch_size"])
    return name, fields


# ---------------------------------------------------------------------------------------- metadata beside weights
# Names people give hyper-parameters in training args, hparams and config files (matched case-insensitively).
HEADS_KEYS = ("num_heads", "heads", "n_heads", "nheads", "n_head", "nhead", "num_attention_heads", "attention_heads",
              "num_head", "attn_heads")
DIM_HEAD_KEYS = ("dim_head", "head_dim", "d_head", "attention_head_dim", "head_width")
IMAGE_KEYS = ("image_size", "img_size", "input_size", "image_res", "img_res", "resolution", "input_resolution",
              "imsize", "image_shape", "img_shape")
CHANNEL_KEYS = ("in_chans", "in_channels", "channels", "num_channels", "n_channels", "input_channels",
                "img_channels", "image_channels")
PATCH_KEYS = ("patch_size", "patch", "patch_sz")
MEAN_KEYS = ("mean", "image_mean", "norm_mean", "normalize_mean", "pixel_mean", "img_mean", "data_mean")
STD_KEYS = ("std", "image_std", "norm_std", "normalize_std", "pixel_std", "img_std", "data_std")
POOL_KEYS = ("pool", "pooling", "global_pool", "pool_type")
ACT_KEYS = ("activation", "act", "act_layer", "hidden_act", "mlp_act")
NORM_FIRST_KEYS = ("norm_first", "pre_norm", "prenorm")
EPS_KEYS = ("layer_norm_eps", "norm_eps", "ln_eps", "layernorm_eps")  # not bare `eps`: often the optimizer's
LABEL_KEYS = ("classes", "class_names", "labels", "idx_to_class", "class_to_idx", "label_names", "id2label")


def metadata_sources(meta: dict[str, Any], sidecars: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Where hyper-parameters may be written, most trusted first: the checkpoint's own entries (top-level values
    such as `image_size` or `classes` before those nested in `args`, `hparams`, `config`), then the text configs
    beside the file."""
    own = {k: v for k, v in meta.items() if k not in ("epoch", "version")}
    return ([("checkpoint", own)] if own else []) + list(sidecars)


def find_value(sources: list[tuple[str, dict[str, Any]]], names: tuple[str, ...], accept: Any = None,
               depth: int = 4) -> tuple[Any, str] | None:
    """The first value stored under one of `names` in `sources` (nested dicts searched, shallow keys first),
    with 'metadata: <source> <key path>'; `accept(value) -> value | None` filters and converts."""
    wanted = {n.lower() for n in names}
    for label, data in sources:
        found = _search(data, wanted, accept, depth, "")
        if found is not None:
            return found[0], f"metadata: {label} {found[1]}"
    return None


def _search(data: dict[str, Any], wanted: set[str], accept: Any, depth: int,
            path: str) -> tuple[Any, str] | None:
    nested = []
    for key, value in data.items():
        name = str(key)
        if name.lower() in wanted and value is not None:
            value = accept(value) if accept else value
            if value is not None:
                return value, f"{path}{name}"
        if isinstance(value, dict) and depth > 1:
            nested.append((name, value))
    for name, value in nested:
        found = _search(value, wanted, accept, depth - 1, f"{path}{name}.")
        if found is not None:
            return found
    return None


def as_int(value: Any) -> int | None:
    """A positive int from an int or a numeric string, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        return int(value)
    return None


def as_size(value: Any) -> tuple[int, int] | None:
    """(h, w) from 28, '28', [28, 28], (3, 224, 224) or '224x320'."""
    if (n := as_int(value)) is not None:
        return (n, n)
    if isinstance(value, (list, tuple)) and value and all(as_int(v) for v in value):
        vals = [int(v) for v in value]
        return (vals[-2], vals[-1]) if len(vals) >= 2 else (vals[0], vals[0])
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*[x×*,]\s*\d+\s*", value):
        h, w = re.split(r"[x×*,]", value.strip())
        return (int(h), int(w))
    return None


def as_stats(value: Any) -> tuple[float, ...] | None:
    """Normalisation statistics: a number or a list of 1 or 3 numbers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return (float(value),)
    if isinstance(value, (list, tuple)) and len(value) in (1, 3) and \
            all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return tuple(float(v) for v in value)
    return None


def as_labels(value: Any) -> tuple[str, ...] | None:
    """Class names from a list, {index: name} or {name: index} (torchvision ImageFolder `class_to_idx`)."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, int)) for v in value):
        return tuple(str(v) for v in value)
    if isinstance(value, dict) and value:
        items = list(value.items())
        if all(as_int(v) is not None or v == 0 for _, v in items):  # name -> index
            try:
                return tuple(str(k) for k, _ in sorted(items, key=lambda kv: int(kv[1])))
            except (TypeError, ValueError):
                return None
        try:  # index -> name
            return tuple(str(v) for _, v in sorted(items, key=lambda kv: int(kv[0])))
        except (TypeError, ValueError):
            return None
    return None
