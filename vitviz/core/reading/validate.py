"""Checking what comes in before anything uses it: paths, the caller's overrides, metadata files, tensors.

Everything a file or a caller hands vitviz is checked here, once, at the door, so the code behind it can trust
types and ranges:

- paths: only regular files are opened (`vitviz.core.files.check_path`, the one check of every file vitviz reads
  by name: a FIFO, a device or a socket would block or never end), and names stay inside their folder (`inside`);
- overrides of `vitviz.load`: each one's type and range, normalised (`image_size="64"` is 64, never (6, 4);
  `heads=2.5` is refused, never truncated);
- config files beside the weights (`config.json`, `preprocessor_config.json`): every field vitviz reads, named
  with its file when it is of the wrong JSON type or out of range (`std [0, 0, 0]` fails here, at load, not at
  every image);
- tensors: what a file may not smuggle in (a broadcast view that would materialise as gigabytes, meta, sparse
  or quantized tensors) and what a model may not be built from (non-float or non-finite weights).

No torch at module level: the path checks serve the image reader too, which the GUI thread calls.
"""
from __future__ import annotations

import math
import numbers
import os
import re
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitviz.core.options import ACTIVATIONS, CROP_MODES, INTERPOLATIONS, OPTION, OPTIONS, Option
from vitviz.errors import MetadataError, OverrideError

if TYPE_CHECKING:
    import torch

    from vitviz.core.spec import ModelSpec

# A single broadcast tensor may materialise to this much more than its stored bytes (small expanded buffers,
# e.g. position ids, are harmless); beyond it the file is refused.
BROADCAST_SLACK = 1 << 20
MAX_DEPTH = 1024           # blocks; the deepest published ViTs have 48 (ViT-22B), 40 (ViT-g)
MAX_HEADS = 4096


class Invalid(ValueError):
    """A value of the wrong type or range; the message says what was expected."""


# ------------------------------------------------------------------------------------------------------ paths


def inside(folder: Path, name: str) -> Path | None:
    """`folder / name` when it stays inside `folder` (no absolute name, no `..` out of it, no symbolic link
    leading out of it), else None.

    A Hugging Face cache snapshot (`<cache>/models--ORG--NAME/snapshots/<commit>/`) keeps its files as symbolic
    links into the same repository's `blobs/` folder, as huggingface_hub lays it out: a link from the snapshot
    into that `blobs/` folder (and nowhere else) is inside too."""
    if not name or os.path.isabs(name) or "\x00" in name or "\\" in name:
        return None
    if os.path.normpath(name).split(os.sep)[0] == os.pardir:   # `..` out of the folder, whatever the links do
        return None
    root = folder.resolve()
    target = (folder / name).resolve()
    if target == root or root in target.parents:
        return target
    blobs = _snapshot_blobs(root)
    return target if blobs is not None and target.parent == blobs else None


def _snapshot_blobs(root: Path) -> Path | None:
    """The resolved `blobs/` folder of the HF cache repository whose snapshot `root` (resolved) is, or None when
    `root` is no snapshot folder (`models--*/snapshots/<commit>` beside `models--*/blobs`)."""
    snapshots = root.parent
    repo = snapshots.parent
    if snapshots.name != "snapshots" or not repo.name.startswith(("models--", "datasets--", "spaces--")):
        return None
    blobs = repo / "blobs"
    if not blobs.is_dir() or blobs.is_symlink():
        return None
    return blobs.resolve()


# ----------------------------------------------------------------------------------------------------- values


def show(value: Any) -> str:
    """A value as found, with its JSON type: `'four' (a string)`, `[4] (a list)`, `null`."""
    if value is None:
        return "null"
    kind = ("a boolean" if isinstance(value, bool) else "a string" if isinstance(value, str)
            else "a list" if isinstance(value, (list, tuple)) else "an object" if isinstance(value, Mapping)
            else "a number" if isinstance(value, numbers.Number) else f"a {type(value).__name__}")
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({kind})"


def as_count(value: Any, minimum: int = 1) -> int:
    """A whole number >= `minimum` from an int, a whole float (224.0) or a digit string ('224')."""
    n: int | None = None
    if isinstance(value, bool):
        n = None
    elif isinstance(value, numbers.Integral):
        n = int(value)
    elif isinstance(value, float) and math.isfinite(value) and value == int(value):
        n = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,18}\s*", value):
        n = int(value)
    if n is None or n < minimum:
        what = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"
        raise Invalid(f"expected {what}")
    return n


def as_pair(value: Any, allow_three: bool = False) -> tuple[int, int]:
    """(h, w) from 224, '224', '224x320', [224, 320] (or [c, h, w] with `allow_three`)."""
    try:
        n = as_count(value)
        return (n, n)
    except Invalid:
        pass
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d{1,9})\s*[x×*,]\s*(\d{1,9})\s*", value)
        if m and int(m[1]) > 0 and int(m[2]) > 0:
            return (int(m[1]), int(m[2]))
    if isinstance(value, (list, tuple)) and len(value) in ((1, 2, 3) if allow_three else (1, 2)):
        try:
            vals = [as_count(v) for v in value]
        except Invalid:
            vals = []
        if vals:
            return (vals[-2], vals[-1]) if len(vals) >= 2 else (vals[0], vals[0])
    shapes = "N, 'HxW' or [H, W]" + (" or [C, H, W]" if allow_three else "")
    raise Invalid(f"expected a size in pixels: {shapes} with positive whole numbers")


def as_number(value: Any, low: float = 0.0, high: float = math.inf, low_open: bool = True) -> float:
    """A finite number in (`low`, `high`] (or [`low`, `high`] without `low_open`); numeric strings accepted."""
    x: float | None = None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            x = None
    bracket = "(" if low_open else "["
    if x is None or not math.isfinite(x) or x > high or x < low or (low_open and x == low):
        raise Invalid(f"expected a finite number in {bracket}{low:g}, {high:g}]")
    return x


def as_stats(value: Any, positive: bool) -> tuple[float, ...]:
    """Per-channel normalisation values: a number or a list of 1 or 3 finite numbers (all > 0 with
    `positive`)."""
    vals = [value] if isinstance(value, numbers.Real) and not isinstance(value, bool) else value
    ok = isinstance(vals, (list, tuple)) and len(vals) in (1, 3) and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) for v in vals)
    if ok and positive and any(float(v) <= 0 for v in vals):
        raise Invalid("expected values > 0 (a standard deviation divides the pixels)")
    if not ok:
        raise Invalid("expected 1 or 3 finite numbers (one per channel)")
    return tuple(float(v) for v in vals)


def as_choice(value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise Invalid(f"expected one of {', '.join(choices)}")
    return value


def as_labels(value: Any) -> tuple[str, ...]:
    """Class names: a list of names, or an {index: name} mapping with whole-number indices."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, numbers.Number)) for v in value):
        return tuple(str(v) for v in value)
    if isinstance(value, Mapping):
        try:
            items = sorted(((as_count(k, 0), v) for k, v in value.items()), key=lambda kv: kv[0])
        except Invalid:
            raise Invalid("expected an {index: name} mapping whose keys are whole numbers ('0', '1', ...)") \
                from None
        if all(isinstance(v, (str, numbers.Number)) for _, v in items):
            return tuple(str(v) for _, v in items)
    raise Invalid("expected a list of class names or an {index: name} mapping")


def as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid("expected true or false")
    return value


def as_text(value: Any) -> str:
    if not isinstance(value, str):
        raise Invalid("expected a string")
    return value


# -------------------------------------------------------------------------------------------------- overrides


# The largest `resize` (shorter side, px): beyond it even a square image would exceed the 200 MP an image may
# have (`vitviz.core.running.images.MAX_PIXELS`), so no image could ever be resized to it.
MAX_RESIZE = 14142


def _resize(v: Any) -> int:
    n = as_count(v)
    if n > MAX_RESIZE:
        raise Invalid(f"expected at most {MAX_RESIZE} px (the shorter side; {n}x{n} px is more than the 200 MP an "
                      "image may have)")
    return n


def _device(v: Any) -> Any:
    if isinstance(v, str) or type(v).__name__ == "device":
        return v
    raise Invalid("expected 'auto', 'cpu', 'cuda' or 'cuda:N'")


def _heads_override(v: Any) -> int:
    n = as_count(v)  # 2.5 is refused, never truncated
    if n > MAX_HEADS:
        raise Invalid(f"expected at most {MAX_HEADS}")
    return n


def _as_is(v: Any) -> Any:
    return v


# Each kind of value an override takes (`vitviz.core.options.Option.value`) -> its check, given the option. `family`
# is checked against the caller's family names in `check_overrides`; `window` and `blocks` by the windowed loader,
# against the model's stages and blocks.
VALUE_CHECKS: dict[str, Callable[[Option, Any], Any]] = {
    "heads": lambda o, v: _heads_override(v),
    "size": lambda o, v: as_pair(v),
    "number": lambda o, v: as_number(v, o.bounds[0], o.bounds[1], low_open=o.low_open),
    "stats": lambda o, v: as_stats(v, positive=False),
    "positive_stats": lambda o, v: as_stats(v, positive=True),
    "choice": lambda o, v: as_choice(v, o.choices),
    "labels": lambda o, v: as_labels(v),
    "text": lambda o, v: as_text(v),
    "device": lambda o, v: _device(v),
    "resize": lambda o, v: _resize(v),
    "count": lambda o, v: as_count(v, int(o.bounds[0])),
    "bool": lambda o, v: as_bool(v),
    "channels": lambda o, v: _channel_count(v),
    "window": lambda o, v: _as_is(v),
    "blocks": lambda o, v: _as_is(v),
}


def check_overrides(overrides: dict[str, Any], families: Collection[str]) -> dict[str, Any]:
    """The overrides of `vitviz.load` checked and normalised (None values dropped), each by its `Option` in
    `vitviz.core.options.OPTIONS`; `families` are the family names the loader knows (passed in: they are the family
    modules', which import torch). A keyword no option names passes as it is (`load` refuses unknown ones first).

    Raises:
        OverrideError: naming the override, what was given and what was expected.
    """
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        option = OPTION.get(key)
        if option is None:
            out[key] = value
            continue
        try:
            if option.value == "family":
                name = as_text(value)
                if name.split(":")[0].split("-")[0] not in families:
                    raise Invalid(f"expected one of {', '.join(sorted(families))}")
                out[key] = name
            else:
                out[key] = VALUE_CHECKS[option.value](option, value)
        except Invalid as e:
            text, _, kind = show(value).partition(" (")
            found = f" (found {kind[:-1]})" if kind else ""
            raise OverrideError(f"override {key} {text}; {e}{found}") from None
    return out


def check_route(overrides: Mapping[str, Any], route: str, where: str, why: str = "") -> None:
    """Refuse the overrides given (not None) that the loading `route` does not take (`Option.routes`): a value the
    user set must never be ignored without a word. `why` says what the route is ('a windowed model (Swin, SAM)').

    Raises:
        OverrideError: naming them, the route and what it takes.
    """
    off = [k for k, v in overrides.items() if v is not None and k in OPTION and route not in OPTION[k].routes]
    if off:
        takes = ", ".join(o.name for o in OPTIONS if route in o.routes)
        names = ", ".join(f"{k}=" + (f" (CLI {OPTION[k].cli_flag})" if OPTION[k].cli_flag else "") for k in off)
        raise OverrideError(f"{where}: {names} {'does' if len(off) == 1 else 'do'} not apply to {why or route}; "
                            f"it takes {takes}")


# ------------------------------------------------------------------------------------------------ config files

# config.json fields (HF transformers and timm hub) -> their check. A value of the wrong type is an error naming
# the file and the field; fields not listed are not read by vitviz and pass as they are.
# transformers' activation names vitviz computes (each family's HF_ACT maps them to `MLP_KINDS`); any other --
# 'gelu_10', clipped to [-10, 10], among them -- is refused here, at the door, naming the file and the field.
_HF_ACTS = ("gelu", "gelu_python", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "gelu_accurate",
            "relu", "silu", "swish", "tanh")


def _channel_count(v: Any) -> int:
    n = as_count(v)
    if n > 64:
        raise Invalid("expected an input channel count of at most 64")
    return n


def _positive_pair_or_count(v: Any) -> Any:
    """An int, or [h, w]: what `image_size` / `img_size` fields hold (kept in their shape, normalised)."""
    if isinstance(v, (list, tuple)):
        return list(as_pair(v))
    return as_count(v)


def _input_size(v: Any) -> list[int]:
    if not isinstance(v, (list, tuple)) or len(v) not in (2, 3):
        raise Invalid("expected [channels, height, width]")
    try:
        return [as_count(x) for x in v]
    except Invalid:
        raise Invalid("expected [channels, height, width] of positive whole numbers") from None


def _act(v: Any) -> str:
    return as_choice(v, tuple(dict.fromkeys(_HF_ACTS + ACTIVATIONS)))


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`check`, with null accepted as 'not given' (where the reader treats a missing field and null alike)."""
    return lambda v: None if v is None else check(v)


def _rope_base(v: Any) -> float:
    """A RoPE base (timm `rope_temperature`, HF `rope_theta`): its logarithm divides the frequencies, so 0, a
    negative or a non-finite base would make every attention map NaN."""
    return as_number(v, 0.0, 1e300)


def _finite(v: Any) -> float:
    """Any finite number (timm `rope_grid_offset` is added to the patch coordinates)."""
    return as_number(v, -1e9, 1e9, low_open=False)


def _grid(v: Any) -> Any:
    """A grid of patches (EVA `ref_feat_shape`): N, or [H, W] of positive whole numbers."""
    try:
        return _positive_pair_or_count(v)
    except Invalid:
        raise Invalid("expected a grid of patches: N or [H, W], positive whole numbers") from None


def _bounded_count(high: int, minimum: int = 1) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        n = as_count(v, minimum)
        if n > high:
            raise Invalid(f"expected a whole number from {minimum} to {high}")
        return n
    return check


_POSITIVE = as_count
_CONFIG_FIELDS: dict[str, Callable[[Any], Any]] = {
    "architecture": as_text, "model_type": as_text,
    "num_attention_heads": _POSITIVE, "hidden_size": _POSITIVE, "num_hidden_layers": _POSITIVE,
    "intermediate_size": _POSITIVE, "num_channels": _POSITIVE, "patch_size": _positive_pair_or_count,
    "image_size": _positive_pair_or_count, "layer_norm_eps": lambda v: as_number(v, 0.0, 1.0),
    "hidden_act": _act, "id2label": as_labels, "label_names": as_labels, "num_labels": lambda v: as_count(v, 0),
    "num_classes": lambda v: as_count(v, 0), "use_swiglu_ffn": as_bool, "num_register_tokens": lambda v: as_count(v, 0),
    "rope_theta": _rope_base, "use_gated_mlp": _optional(as_bool),   # transformers DINOv3
}
def _heads(v: Any) -> Any:
    """A head count, or one per stage (timm Swin's `num_heads`: a list)."""
    if isinstance(v, (list, tuple)) and v:
        try:
            return [as_count(x) for x in v]
        except Invalid:
            raise Invalid("expected a positive whole number, or one per stage") from None
    return as_count(v)


_MODEL_ARGS_FIELDS: dict[str, Callable[[Any], Any]] = {
    "num_heads": _heads, "img_size": _positive_pair_or_count, "patch_size": _positive_pair_or_count,
    "embed_dim": _POSITIVE, "depth": _POSITIVE, "in_chans": _POSITIVE, "num_classes": lambda v: as_count(v, 0),
    "reg_tokens": lambda v: as_count(v, 0), "global_pool": as_text, "class_token": as_bool,
    "no_embed_class": as_bool, "mlp_ratio": lambda v: as_number(v, 0.0, 1e3),
    # timm Eva (DINOv3, EVA-02, Perception Encoder) and NaFlexVit: RoPE and the MAP head
    "rope_temperature": _optional(_rope_base), "rope_grid_offset": _optional(_finite),
    "ref_feat_shape": _optional(_grid), "rope_rotate_half": _optional(as_bool),
    "rope_grid_indexing": _optional(lambda v: as_choice(v, ("ij", "xy"))),
    "attn_pool_num_heads": _optional(_bounded_count(MAX_HEADS, 0)),
}

# open_clip's model_cfg (open_clip_config.json, or a config stating one): the fields vitviz reads to build the
# vision tower's spec and, for a text prompt, the text tower (whose causal mask is context_length^2 floats).
MAX_CONTEXT = 8192   # text tokens; CLIP uses 77, SigLIP 64-256
_VISION_CFG_FIELDS: dict[str, Callable[[Any], Any]] = {
    "width": _POSITIVE, "head_width": _POSITIVE, "layers": _bounded_count(MAX_DEPTH),
    "image_size": _positive_pair_or_count, "patch_size": _positive_pair_or_count,
    "mlp_ratio": lambda v: as_number(v, 0.0, 1e3), "pool_type": _optional(as_text),
    "final_ln_after_pool": _optional(as_bool), "ls_init_value": _optional(lambda v: as_number(v, -1e6, 1e6)),
}
_TEXT_CFG_FIELDS: dict[str, Callable[[Any], Any]] = {
    "context_length": _bounded_count(MAX_CONTEXT), "vocab_size": _POSITIVE, "width": _POSITIVE,
    "heads": _bounded_count(MAX_HEADS), "layers": _bounded_count(MAX_DEPTH),
    "mlp_ratio": lambda v: as_number(v, 0.0, 1e3), "hf_tokenizer_name": _optional(as_text),
    "hf_model_name": _optional(as_text),
}
_OPEN_CLIP_FIELDS: dict[str, Callable[[Any], Any]] = {
    "embed_dim": _POSITIVE, "quick_gelu": _optional(as_bool), "custom_text": _optional(as_bool),
}


def check_open_clip_config(cfg: Any, path: Path, prefix: str = "") -> dict[str, Any]:
    """An open_clip `model_cfg` (`prefix` says where it sits in the file, e.g. 'model_cfg.') with every field
    vitviz reads checked: the vision tower's width, head width (a divisor of the width), layers, image and patch
    size; the text tower's context length (at most MAX_CONTEXT), vocabulary, width, heads (a divisor of the width)
    and layers.

    Raises:
        MetadataError: naming the file and the field.
    """
    if not isinstance(cfg, dict):
        raise MetadataError(f"{path}: field '{prefix.rstrip('.') or 'model_cfg'}' is {show(cfg)}; expected a JSON "
                            "object")
    out = _check_fields(cfg, _OPEN_CLIP_FIELDS, path, prefix)
    for key, fields in (("vision_cfg", _VISION_CFG_FIELDS), ("text_cfg", _TEXT_CFG_FIELDS)):
        if key not in out:
            continue
        if not isinstance(out[key], dict):
            raise MetadataError(f"{path}: field '{prefix}{key}' is {show(out[key])}; expected a JSON object")
        sub = out[key] = _check_fields(out[key], fields, path, f"{prefix}{key}.")
        per_head = "head_width" if key == "vision_cfg" else "heads"
        if "width" in sub and per_head in sub:
            width, n = sub["width"], sub[per_head]
            if (width % n if per_head == "heads" else width % n or n > width):
                what = "a divisor of" if per_head == "head_width" else "a number of heads that divides"
                raise MetadataError(f"{path}: field '{prefix}{key}.{per_head}' is {n} with {key}.width {width}; "
                                    f"expected {what} the width")
    return out


def _pretrained_fields() -> dict[str, Callable[[Any], Any]]:
    return {
        "input_size": _input_size, "crop_pct": lambda v: as_number(v, 0.0, 1.0),
        "interpolation": lambda v: as_choice(v, INTERPOLATIONS),
        "mean": lambda v: as_stats(v, positive=False), "std": lambda v: as_stats(v, positive=True),
        "crop_mode": as_text, "num_classes": lambda v: as_count(v, 0), "label_names": as_labels,
        "architecture": as_text,
    }


def _check_fields(data: Mapping[str, Any], fields: Mapping[str, Callable[[Any], Any]], path: Path,
                  prefix: str = "") -> dict[str, Any]:
    out = dict(data)
    for key, check in fields.items():
        if key in data:
            try:
                out[key] = check(data[key])
            except Invalid as e:
                raise MetadataError(f"{path}: field '{prefix}{key}' is {show(data[key])}; {e}") from None
    return out


def check_config(data: Any, path: Path) -> dict[str, Any]:
    """A parsed `config.json` (HF transformers or timm hub) with every field vitviz reads checked and normalised.

    Raises:
        MetadataError: the file is not a JSON object, or a field has the wrong type or range (named).
    """
    if not isinstance(data, dict):
        raise MetadataError(f"{path}: holds {show(data)}; expected a JSON object of model settings")
    out = _check_fields(data, _CONFIG_FIELDS, path)
    for key, fields in (("model_args", _MODEL_ARGS_FIELDS), ("pretrained_cfg", _pretrained_fields()),
                        ("vision_config", _CONFIG_FIELDS)):  # vision_config: CLIP / SigLIP image towers
        if key in out and out[key] is not None:
            if not isinstance(out[key], dict):
                raise MetadataError(f"{path}: field '{key}' is {show(out[key])}; expected a JSON object")
            out[key] = _check_fields(out[key], fields, path, f"{key}.")
    if isinstance(out.get("model_cfg"), dict) and "vision_cfg" in out["model_cfg"]:   # an open_clip model config
        out["model_cfg"] = check_open_clip_config(out["model_cfg"], path, "model_cfg.")
    return out


def _size_field(v: Any) -> Any:
    """HF `size` / `crop_size`: N, or {height, width} / {shortest_edge} with positive whole numbers."""
    if isinstance(v, Mapping):
        if ("height" in v) != ("width" in v):
            raise Invalid("expected both \"height\" and \"width\"")
        return {k: (as_count(x) if k in ("height", "width", "shortest_edge", "longest_edge") and x is not None
                    else x) for k, x in v.items()}
    return as_count(v)


def _resample(v: Any) -> int:
    code = as_count(v, 0)
    if code > 5:
        raise Invalid("expected a PIL resampling code 0-5")
    return code


_PREPROCESSOR_FIELDS: dict[str, Callable[[Any], Any]] = {
    "size": _size_field, "crop_size": _size_field, "resample": _resample,
    "do_center_crop": as_bool, "do_normalize": as_bool, "do_resize": as_bool, "do_rescale": as_bool,
    "image_mean": lambda v: as_stats(v, positive=False), "image_std": lambda v: as_stats(v, positive=True),
    "rescale_factor": lambda v: as_number(v, 0.0, 1.0),
}


def check_preprocessor(data: Any, path: Path) -> dict[str, Any]:
    """A parsed `preprocessor_config.json` with every field vitviz reads checked (sizes, resample, mean/std).

    Raises:
        MetadataError: naming the file and the field.
    """
    if not isinstance(data, dict):
        raise MetadataError(f"{path}: holds {show(data)}; expected a JSON object of preprocessing settings")
    out = _check_fields(data, _PREPROCESSOR_FIELDS, path)
    if out.get("do_normalize", True) and ("image_mean" in out) != ("image_std" in out):
        have, lack = ("image_mean", "image_std") if "image_mean" in out else ("image_std", "image_mean")
        raise MetadataError(f"{path}: has '{have}' but no '{lack}'; expected both (or do_normalize: false)")
    return out


def training_args(meta: dict[str, Any], where: Path) -> dict[str, Any]:
    """Training-checkpoint metadata with `args`/`hparams`/`config`/`cfg` that are not mappings dropped (with a
    warning naming the file): readers look things up in them by name."""
    out = dict(meta)
    for key in ("args", "hparams", "hyper_parameters", "config", "cfg"):
        if key in out and not isinstance(out[key], dict):
            warnings.warn(f"{where}: '{key}' in the checkpoint is {show(out[key])}, not a mapping of settings; "
                          "ignored", stacklevel=3)
            del out[key]
    return out


# ------------------------------------------------------------------------------------------------------ tensors


def check_stored_tensors(tensors: Mapping[str, Any], where: Any) -> None:
    """Refuse tensors read from a file that are not plain, materialised data: meta, sparse and quantized tensors,
    and broadcast views (`expand`, `as_strided`) whose size is far beyond the bytes the file holds for them --
    loading such a tensor into a model would allocate its full size from a small file.

    Raises:
        CorruptCheckpointError: naming the tensor, its shape and what it holds.
    """
    import torch

    from vitviz.errors import CorruptCheckpointError

    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            continue
        shape = tuple(t.shape)
        if t.is_meta:
            raise CorruptCheckpointError(f"{where}: tensor {name!r} {shape} is a meta tensor (a shape without "
                                         "data); expected weights with their values")
        if t.layout != torch.strided:
            raise CorruptCheckpointError(f"{where}: tensor {name!r} {shape} is {str(t.layout).split('.')[-1]}; "
                                         "expected dense weights (call .to_dense() before saving)")
        if t.is_quantized:
            raise CorruptCheckpointError(f"{where}: tensor {name!r} {shape} is quantized ({t.dtype}); expected "
                                         "float weights (call .dequantize() before saving)")
        need = t.numel() * t.element_size()
        held = t.untyped_storage().nbytes()
        if t.numel() and _extent(t) > held:
            raise CorruptCheckpointError(f"{where}: tensor {name!r} {shape} reaches past its stored data "
                                         f"({held} bytes); expected a complete tensor")
        if need > held + BROADCAST_SLACK:
            raise CorruptCheckpointError(
                f"{where}: tensor {name!r} {shape} would take {_size(need)} but the file holds {_size(held)} for "
                "it (a broadcast view made with expand or as_strided); refused, as loading it would allocate the "
                "full size; expected a tensor with its own data (save t.contiguous())")


def _extent(t: "torch.Tensor") -> int:
    """Bytes of storage a strided tensor reaches: offset + the farthest element, + 1."""
    far = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    return (far + 1) * t.element_size()


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


# Canonical keys whose dimensionality the spec is read from (before the model exists to check shapes).
_CANONICAL_NDIM = ((re.compile(r"^(cls_token|dist_token|reg_token|pos_embed)$"), 3),
                   (re.compile(r"^patch_embed\.proj\.weight$"), 4),
                   (re.compile(r"^(head|head_dist|pre_logits\.fc)\.weight$"), 2),
                   (re.compile(r"^blocks\.\d+\.(attn\.(qkv|proj)|mlp\.fc[12])\.weight$"), 2),
                   (re.compile(r"^blocks\.\d+\.(norm[12]|attn\.[qk]_norm)\.(weight|bias)$"), 1),
                   (re.compile(r"^(norm|fc_norm|norm_extra)\.(weight|bias)$"), 1))


def check_canonical(tensors: Mapping[str, "torch.Tensor"], where: Any) -> None:
    """Each canonical tensor has the number of dimensions the reference ViT gives it (a 1-D `reg_token` is a
    broken file, not an index error), and the prefix tokens are one batch row.

    Raises:
        InconsistentCheckpointError: naming the tensor, its shape and the expected layout.
    """
    from vitviz.errors import InconsistentCheckpointError

    for name, t in tensors.items():
        for pattern, ndim in _CANONICAL_NDIM:
            if pattern.match(name) and (t.ndim != ndim or (ndim == 3 and t.shape[0] != 1)):
                layout = {4: "(embed_dim, channels, patch, patch)", 2: "(out, in)", 1: "(width,)"}.get(
                    ndim, "(1, tokens, embed_dim)")
                raise InconsistentCheckpointError(f"{where}: {name} has shape {tuple(t.shape)}; expected "
                                                  f"{ndim} dimensions {layout}")


def check_exact_tensors(own: Mapping[str, "torch.Tensor"], sd: Mapping[str, "torch.Tensor"], where: Any,
                        model: str = "") -> None:
    """Every tensor the model has is in `sd` with its shape, and nothing else is; else an
    InconsistentCheckpointError listing them (`model` names the model for the tensors it has no place for)."""
    from vitviz.errors import InconsistentCheckpointError

    missing = sorted(set(own) - set(sd))
    extra = sorted(set(sd) - set(own))
    wrong = [f"{k}: file {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
             for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or extra or wrong:
        parts = []
        if wrong:
            parts.append(f"shapes that contradict the rest of the file: {'; '.join(wrong[:5])}")
        if missing:
            parts.append(f"missing tensors: {', '.join(missing[:8])}")
            norms = [k for k in missing if re.search(r"(^|\.)(norm\w*|ln_\w+|fc_norm)\.bias$", k)]
            if norms and len(norms) == len(missing) and all(k[:-5] + ".weight" in sd for k in norms):
                parts.append("its norms have a weight and no bias: RMSNorm, or LayerNorm(bias=False), which "
                             "vitviz's reference ViT does not build (its own code can run it: --code FILE.py:FACTORY)")
        if extra:
            parts.append((f"tensors {model} has no place for" if model else "unexpected tensors")
                         + f": {', '.join(extra[:8])}")
        raise InconsistentCheckpointError(f"{where}: " + " | ".join(parts))


def check_weights(tensors: Mapping[str, "torch.Tensor"], where: Any) -> None:
    """Refuse weights a model cannot be built from: complex, boolean or integer dtypes (a float model would
    silently cast them) and non-finite values in any tensor the attention depends on. NaN or infinity only in
    the classifier head (`head`, `head_dist`, `pre_logits`) is said as a warning: the attention is unaffected,
    the class scores are not.

    Raises:
        InconsistentCheckpointError: naming the tensors.
    """
    import torch

    from vitviz.errors import InconsistentCheckpointError

    wrong = [f"{k} ({str(t.dtype).replace('torch.', '')})" for k, t in tensors.items() if not t.is_floating_point()]
    if wrong:
        raise InconsistentCheckpointError(
            f"{where}: {len(wrong)} weight tensor(s) are not floating point: {', '.join(wrong[:6])}"
            f"{' ...' if len(wrong) > 6 else ''}; expected float32/float16/bfloat16 weights (complex, bool and "
            "integer tensors are not model weights)")
    bad: list[str] = []
    for k, t in tensors.items():
        if t.numel() and not bool(torch.isfinite(t).all()):
            n = int((~torch.isfinite(t)).sum())
            bad.append(f"{k} ({n} of {t.numel()} values)")
    if not bad:
        return
    head_only = all(b.startswith(("head.", "head_dist.", "pre_logits.")) for b in bad)
    text = f"{where}: NaN or infinite weights in {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''}"
    if head_only:
        warnings.warn(f"{text}; the attention maps are unaffected, the class scores will be NaN", stacklevel=3)
        return
    raise InconsistentCheckpointError(f"{text}; expected finite weights (a diverged or damaged checkpoint: every "
                                      "attention map would be NaN)")


# The largest |value| a normalised pixel may take: real recipes reach ~5 (MNIST: 2.8, ImageNet: 2.6); a model fed
# values of 1e6 and more has a wrong mean or std, and float32 overflows soon after (std 1e-30 -> NaN attention).
MAX_NORMALIZED = 1e6


def normalized_reach(mean: Sequence[float], std: Sequence[float]) -> float:
    """The largest |(p - mean) / std| over pixels p in [0, 1] and the channels (a non-finite value: inf)."""
    n = max(len(mean), len(std))
    out = 0.0
    for i in range(n):
        m, sd = float(mean[i % len(mean)]), float(std[i % len(std)])
        if not (math.isfinite(m) and math.isfinite(sd)) or sd == 0:
            return math.inf
        out = max(out, abs(0.0 - m) / abs(sd), abs(1.0 - m) / abs(sd))
    return out if math.isfinite(out) else math.inf


def check_finite_forward(attn: Any, x: Any, spec: "ModelSpec", where: Any = "") -> None:
    """Refuse NaN or infinite attention from a forward pass (it would be drawn and written as maps of nothing),
    naming the setting that produced it when vitviz can tell: the input (its normalisation), the RoPE base or grid
    offset, the attention scale, the LayerNorm eps -- each with where it came from.

    `attn` is the captured (B, L, H, T or rows, T) array, `x` the (B, C, H, W) model input. One float64 sum over
    `attn` finds a NaN anywhere (a softmax row sums to 1): about a copy's time, no extra memory.

    Raises:
        NonFiniteError: naming the first layer with non-finite values and the likely cause.
    """
    import numpy as np

    from vitviz.errors import NonFiniteError

    arr = np.asarray(attn)
    if arr.size == 0 or math.isfinite(float(arr.sum(dtype=np.float64))):
        return
    layers = arr.reshape(arr.shape[0], arr.shape[1], -1) if arr.ndim >= 3 else arr.reshape(1, 1, -1)
    bad_layers = [int(i) for i in np.nonzero(~np.isfinite(layers).all(axis=(0, 2)))[0]]
    first = bad_layers[0] if bad_layers else 0
    count = int((~np.isfinite(arr)).sum())
    causes = _nonfinite_causes(x, spec)
    text = (f"{where + ': ' if where else ''}the forward pass gave NaN or infinite attention ({count:,} of "
            f"{arr.size:,} values, from layer {first}"
            f"{f' on, in {len(bad_layers)} layers' if len(bad_layers) > 1 else ''}); ")
    if causes:
        text += "caused by " + "; ".join(causes)
    else:
        settings = [f"eps {spec.eps:g} ({spec.source_of('eps')})"]
        if spec.attn_scale:
            settings.append(f"attention scale {spec.attn_scale:g} ({spec.source_of('attn_scale')})")
        if spec.rope:
            settings.append(f"RoPE base {spec.rope_theta:g} ({spec.source_of('rope_theta')})")
        text += ("no setting is out of range (" + ", ".join(settings) + "); please report this model as a vitviz "
                 "bug")
    raise NonFiniteError(text + "; expected finite attention maps -- nothing was drawn or written from them")


def _nonfinite_causes(x: Any, spec: "ModelSpec") -> list[str]:
    """The settings of `spec` (and the input `x`) that make a forward pass non-finite, in words."""
    import numpy as np

    causes = []
    arr = np.asarray(x.detach().float().cpu() if hasattr(x, "detach") else x)
    pp = spec.preprocess
    norm = f"mean {pp.mean}, std {pp.std} ({spec.source_of('preprocess')})"
    if arr.size and not np.isfinite(arr).all():
        causes.append(f"the input, which holds NaN or infinity after normalisation ({norm})")
    elif arr.size and float(np.abs(arr).max()) > MAX_NORMALIZED:
        causes.append(f"the input, whose values reach {float(np.abs(arr).max()):.3g} (an image is normalised with "
                      f"{norm}); expected model inputs within +-{MAX_NORMALIZED:g}")
    if spec.rope:
        if not (math.isfinite(spec.rope_theta) and spec.rope_theta > 0):
            causes.append(f"the RoPE base rope_theta {spec.rope_theta!r} ({spec.source_of('rope_theta')}); expected "
                          "a finite number > 0")
        if not math.isfinite(spec.rope_offset):
            causes.append(f"the RoPE grid offset {spec.rope_offset!r} ({spec.source_of('rope_offset')}); expected "
                          "a finite number")
    if spec.attn_scale and not math.isfinite(spec.attn_scale):
        causes.append(f"the attention scale {spec.attn_scale!r} ({spec.source_of('attn_scale')})")
    if not (math.isfinite(spec.eps) and spec.eps > 0):
        causes.append(f"the LayerNorm eps {spec.eps!r} ({spec.source_of('eps')}); expected a number > 0")
    return causes


def check_spec(spec: "ModelSpec", where: Any) -> None:
    """Ranges no tensor shape can promise: depth and the preprocessing recipe (named with where it came from),
    so a bad value fails at load, not at every image.

    Raises:
        InconsistentCheckpointError / MetadataError: naming the field and its source.
    """
    from vitviz.errors import InconsistentCheckpointError

    if spec.depth > MAX_DEPTH:
        raise InconsistentCheckpointError(f"{where}: {spec.depth} transformer blocks; expected at most {MAX_DEPTH}")
    pp = spec.preprocess
    source = spec.source_of("preprocess") or "the family's recipe"
    problems = []
    try:
        as_stats(list(pp.mean), positive=False)
    except Invalid as e:
        problems.append(f"mean {pp.mean}: {e}")
    try:
        as_stats(list(pp.std), positive=True)
    except Invalid as e:
        problems.append(f"std {pp.std}: {e}")
    for what, values in (("mean", pp.mean), ("std", pp.std)):
        if len(values) == 3 and spec.in_chans not in (1, 3):
            problems.append(f"{what} {values}: 3 values for a {spec.in_chans}-channel model")
    if min(pp.crop) < 1 or pp.resize < 1:
        problems.append(f"crop {pp.crop} / resize {pp.resize}: expected positive sizes")
    if pp.interpolation not in INTERPOLATIONS:
        problems.append(f"interpolation {pp.interpolation!r}: expected one of {', '.join(INTERPOLATIONS)}")
    if pp.mode not in CROP_MODES:
        problems.append(f"mode {pp.mode!r}: expected one of {', '.join(CROP_MODES)}")
    if not problems:
        reach = normalized_reach(pp.mean, pp.std)
        if reach > MAX_NORMALIZED:
            problems.append(f"mean {pp.mean} / std {pp.std}: pixels in [0, 1] would become values up to "
                            f"{reach:.3g} (float32 overflows into NaN attention); expected a normalisation that "
                            f"keeps them within +-{MAX_NORMALIZED:g} (e.g. ImageNet's mean 0.485,0.456,0.406, "
                            "std 0.229,0.224,0.225)")
    if problems:
        raise MetadataError(f"{where}: preprocessing ({source}): {'; '.join(problems)}")
