"""The describer: what a user's module is -- patch embedding, input size and channels, tokens, grid, prefix tokens
and their place, output kind, preprocessing, labels -- read from its modules and attributes and from probe forward
passes under the recorder (`describe`). `vitviz.core.running.live.model.load_live` wraps what it finds as a `LiveModel`.
"""
from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import is_lazy

from vitviz.core.reading.hyperparams import imagenet_labels, warn_guesses
from vitviz.core.running.live.errors import (
    LiveModelError, LiveWarning, NoAttentionError, UserCodeError, _forward_error, user_call,
)
from vitviz.core.running.live.packing import PackedTower, merge_size
from vitviz.core.running.live.record import (
    AttentionLayout, _evaluating, _layer_summary, _prefix_first, _Recorder, _refuse_non_finite, _run,
    _skipped_summary,
)
from vitviz.core.options import LIVE, only_for
from vitviz.core.running.runtime import CHECK_FROM, available_memory, format_bytes, resolve_device
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD, ModelSpec, Preprocess, whole_patches
from vitviz.errors import DeviceError, NonFiniteError

# Overrides only the live path takes (`vitviz.core.options.OPTIONS`; the others are the reference route's).
LIVE_OVERRIDES = only_for(LIVE)
_JOIN_MAX = 16     # (as the recorder's) the most queries of a pooling or class-attention call
_MAX_PREFIX = 64   # more "prefix" tokens than this means the grid is wrong, not that there are 65 registers


# ---------------------------------------------------------------------------------------------------------------
# What the module is: patch embedding, channels, position table, output


@dataclass(frozen=True)
class PatchEmbedding:
    """The module that cuts the image into patches: its name, (ph, pw), input channels and width."""

    name: str
    patch: tuple[int, int]
    in_chans: int
    dim: int
    kind: str

    def describe(self) -> str:
        return f"{self.kind} ({self.patch[0]}x{self.patch[1]} px patches, {self.in_chans} -> {self.dim})"


def find_patch_embedding(module: nn.Module) -> PatchEmbedding | None:
    """The first patch embedding in `module`: a Conv2d with stride == kernel (> 1), or a Rearrange of
    '(h p1) (w p2)' / an Unfold with stride == kernel followed by a Linear over the flattened patches. Where the
    module states its input channels (`_stated_channels`), a convolution taking another count is not it (the
    spatial reduction inside SegFormer's, GLPN's and PVTv2's attention, behind an overlapping stem)."""
    mods = list(module.named_modules())
    stated = _stated_channels(module)
    for i, (name, m) in enumerate(mods):
        if isinstance(m, nn.Conv2d) and tuple(m.kernel_size) == tuple(m.stride) and min(m.kernel_size) > 1 \
                and m.groups == 1 and tuple(m.dilation) == (1, 1) and m.padding in ((0, 0), "valid") \
                and (stated is None or m.in_channels == stated[0]):
            return PatchEmbedding(name, (int(m.kernel_size[0]), int(m.kernel_size[1])), m.in_channels,
                                  m.out_channels, f"Conv2d {name}")
        patch = _unfolded_patch(m)
        if patch is None:
            continue
        linear = next(((n, lin) for n, lin in mods[i + 1:] if isinstance(lin, nn.Linear)), None)
        if linear is not None and linear[1].in_features % (patch[0] * patch[1]) == 0:
            return PatchEmbedding(name or linear[0], patch, linear[1].in_features // (patch[0] * patch[1]),
                                  linear[1].out_features, f"{type(m).__name__} {name} + Linear {linear[0]}")
    return None


def _unfolded_patch(m: nn.Module) -> tuple[int, int] | None:
    """(ph, pw) of an einops Rearrange 'b c (h p1) (w p2) -> ...' or an nn.Unfold(kernel, stride=kernel)."""
    if isinstance(m, nn.Unfold):
        k = m.kernel_size if isinstance(m.kernel_size, tuple) else (m.kernel_size,) * 2
        s = m.stride if isinstance(m.stride, tuple) else (m.stride,) * 2
        return (int(k[0]), int(k[1])) if tuple(k) == tuple(s) and min(k) > 1 else None
    pattern, lengths = getattr(m, "pattern", None), getattr(m, "axes_lengths", None)
    if not isinstance(pattern, str) or not isinstance(lengths, dict) or "->" not in pattern:
        return None
    groups = re.findall(r"\(\s*\w+\s+(\w+)\s*\)", pattern.split("->")[0])
    if len(groups) == 2 and all(isinstance(lengths.get(g), int) for g in groups):
        return (int(lengths[groups[0]]), int(lengths[groups[1]]))
    return None


_CHANNEL_ATTRS = ("in_chans", "in_channels", "num_channels", "channels", "n_channels", "input_channels")
_STAT_NAMES = ("mean", "std", "pixel_mean", "pixel_std", "image_mean", "image_std", "norm_mean", "norm_std")


def _channels(module: nn.Module, embed: PatchEmbedding | None, overrides: Mapping[str, Any],
              patch_attr: int | None) -> list[tuple[int, str]]:
    """The input channel counts to probe with, most likely first, each with its source: the patch embedding, an
    attribute or config that says it, the model's own normalisation statistics, its first Conv2d, or a Linear over
    C x p x p pixels before anything else; only when nothing states it, 3 and then 1 (never 3 by habit alone: a
    1-channel model's forward refuses 3 channels, and the next is tried)."""
    if overrides.get("in_chans") is not None:
        return [(int(overrides["in_chans"]), "override")]
    if embed is not None:
        return [(embed.in_chans, f"shape: {embed.describe()}")]
    stated = _stated_channels(module)
    if stated is not None:
        return [stated]
    stats = [(len(tuple(v)), src) for v, src in _stated_statistics(module)]
    if stats:
        return [stats[0]]
    params = [(n, m) for n, m in module.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    conv = next(((n, m) for n, m in params if isinstance(m, nn.Conv2d)), None)
    if conv is not None:
        return [(conv[1].in_channels, f"shape: the first Conv2d, {conv[0]}, takes {conv[1].in_channels} channel(s)")]
    if params and isinstance(params[0][1], nn.Linear):   # patches cut in the forward, projected by this Linear
        name, lin = params[0]
        for c in (3, 1):
            p = math.isqrt(lin.in_features // c)
            if lin.in_features % c == 0 and p > 1 and p * p * c == lin.in_features \
                    and patch_attr in (None, p):
                return [(c, f"shape: the first Linear, {name}, takes {lin.in_features} = {c} x {p} x {p} pixels")]
    return [(3, "guess: 3 channels (RGB): nothing in the module states its input channels"),
            (1, "guess: 1 channel: nothing in the module states its input channels, and its forward refused 3")]


def _stated_channels(module: nn.Module) -> tuple[int, str] | None:
    """(input channels, source) an attribute of the module or its config states (1 to 4), else None."""
    for where, obj in (("", module), ("config.", getattr(module, "config", None))):
        for attr in _CHANNEL_ATTRS:
            try:
                value = getattr(obj, attr, None)
            except Exception:  # noqa: BLE001 - a property that fails (a transformers backbone's `channels` before
                continue       # its stages are set: IndexError) states nothing
            if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4:
                return value, f"attribute: {where}{attr}"
    return None


def _stated_statistics(module: nn.Module) -> list[tuple[tuple[float, ...], str]]:
    """Normalisation means/stds the module carries: timm's pretrained_cfg, open_clip's, or a buffer or attribute
    named like one (a model that normalises its own input)."""
    found: list[tuple[tuple[float, ...], str]] = []
    pcfg = getattr(module, "pretrained_cfg", None)
    if isinstance(pcfg, dict) and pcfg.get("mean"):
        found.append((tuple(pcfg["mean"]), "metadata: pretrained_cfg mean"))
    clip = _clip_statistics(module)
    if clip is not None:
        found.append((tuple(clip["mean"]), "metadata: preprocess_cfg / image_mean"))
    for name, value in [*module.named_buffers(), *((n, getattr(module, n, None)) for n in _STAT_NAMES)]:
        if name.rsplit(".", 1)[-1] not in _STAT_NAMES:
            continue
        if isinstance(value, torch.Tensor) and value.numel() in (1, 3) and value.is_floating_point():
            found.append((tuple(float(v) for v in value.flatten()), f"attribute: its {name} ({value.numel()} "
                                                                     "value(s): one per channel)"))
        elif isinstance(value, (tuple, list)) and len(value) in (1, 3) and all(isinstance(v, float) for v in value):
            found.append((tuple(value), f"attribute: its {name} ({len(value)} value(s): one per channel)"))
    return found


def _pos_table(module: nn.Module, dim: int) -> tuple[str, int] | None:
    """(name, rows) of a learned position table: a (N, D) or (1, N, D) parameter or buffer whose name says 'pos'
    (of width `dim`; any width when `dim` is 0)."""
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if "pos" in name.lower() and not is_lazy(t) and (t.dim() == 2 or (t.dim() == 3 and t.shape[0] == 1)) \
                and (t.shape[-1] == dim if dim else t.shape[-1] > 4) and t.shape[-2] > 1 and t.is_floating_point():
            return name, int(t.shape[-2])
    return None


_CLS_LEAVES = ("cls", "cls_token", "class_token", "class_embedding", "cls_embedding", "cls_tok", "cls_tokens",
               "class_tokens", "cls_emb", "clf_token")


def _prefix_params(module: nn.Module, dim: int) -> dict[str, int]:
    """Learned prefix tokens by kind ('cls', 'dist', 'reg') with their row counts, from parameter names (of width
    `dim`; any width when `dim` is 0)."""
    found: dict[str, int] = {}
    for name, p in module.named_parameters():
        if is_lazy(p) or not p.dim():   # a Lazy module's parameter before its first forward; a scalar (a gate)
            continue
        leaf = name.rsplit(".", 1)[-1].lower()
        width = dim or int(p.shape[-1])
        if not width or p.shape[-1] != width or p.numel() // width > _MAX_PREFIX:
            continue
        kind = "dist" if "dist" in leaf and "token" in leaf else "reg" if leaf.startswith(("reg", "register")) \
            else "cls" if leaf in _CLS_LEAVES else None
        if kind:
            found[kind] = found.get(kind, 0) + p.numel() // width
    return found


def _size_attribute(module: nn.Module, embed: PatchEmbedding | None) -> tuple[tuple[int, int], str] | None:
    """The input size a module states: `img_size`/`image_size`/`input_size` on it, its patch embedding (or that
    one's parent), or `config.image_size`."""
    places: list[tuple[str, Any]] = [("", module)]
    if embed is not None:
        parent = embed.name.rsplit(".", 1)[0] if "." in embed.name else ""
        places += [(embed.name, module.get_submodule(embed.name)), (parent, module.get_submodule(parent))]
    for where, obj in places:
        for attr in ("img_size", "image_size", "input_size", "img_dim", "image_res"):
            size = _as_size(getattr(obj, attr, None))
            if size:
                return size, f"attribute: {where + '.' if where else ''}{attr}"
    size = _as_size(getattr(getattr(module, "config", None), "image_size", None))
    if size:
        return size, "metadata: config.image_size"
    tokens, stride = _as_size(getattr(module, "tokens_spatial_shape", None)), \
        _as_size(getattr(module, "patch_stride", None))
    if tokens and stride:   # timm Hiera: its token grid and the patch stride, the size its position table fits
        return (tokens[0] * stride[0], tokens[1] * stride[1]), "attribute: tokens_spatial_shape x patch_stride"
    return None


def _as_size(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 3 and all(isinstance(v, int) for v in value) \
            and value[0] in (1, 3, 4):
        value = value[1:]   # timm's (C, H, W) input_size
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return (int(value[0]), int(value[1]))
    return None


_EMBEDDING_KEYS = ("image_embeds", "pooler_output", "embeddings", "embedding", "embeds", "features", "feats",
                   "feature", "last_hidden_state", "hidden_states", "z")
_EMBEDDING_NAMES = re.compile(r"proj|embed|bottleneck|feat|encod", re.IGNORECASE)


def _main_output(out: Any, prefer: torch.Tensor | None = None) -> tuple[torch.Tensor | None, str]:
    """The tensor of a forward's result that vitviz shows, and what it is ('output', a key such as 'logits', or
    'output[i]'): a tensor; of a dict or HF ModelOutput its `logits`, else the value that is `prefer` (the last
    nn.Linear's output), else an embedding (`image_embeds`, `pooler_output`, `last_hidden_state`), else its first
    (B, K) tensor; of a tuple or list the element that is `prefer`, else the first (B, K) tensor, else the first
    tensor."""
    if isinstance(out, torch.Tensor):
        return out, "output"
    if isinstance(out, Mapping) or hasattr(out, "keys") and hasattr(out, "get"):
        items = [(str(k), v) for k, v in out.items() if isinstance(v, torch.Tensor)]
        ranked = [kv for kv in items if kv[0] == "logits"] + [kv for kv in items if kv[1] is prefer] \
            + [kv for k in ("image_embeds", "pooler_output", "last_hidden_state") for kv in items if kv[0] == k] \
            + [kv for kv in items if kv[1].dim() == 2] + items
        return (ranked[0][1], ranked[0][0]) if ranked else (None, "")
    if isinstance(out, (tuple, list)):
        items2 = [(f"output[{i}]", t) for i, t in enumerate(out) if isinstance(t, torch.Tensor)]
        ranked2 = [kv for kv in items2 if kv[1] is prefer] + [kv for kv in items2 if kv[1].dim() == 2] + items2
        return (ranked2[0][1], ranked2[0][0]) if ranked2 else (None, "")
    value = getattr(out, "logits", None)
    return (value, "logits") if isinstance(value, torch.Tensor) else (None, "")


def _take(out: Any, what: str) -> torch.Tensor | None:
    """The tensor `what` ('output', 'output[i]' or a key, as `_main_output` named it on the probe) of a result."""
    if what == "output":
        return out if isinstance(out, torch.Tensor) else None
    index = re.fullmatch(r"output\[(\d+)\]", what)
    try:
        value = out[int(index.group(1))] if index else (out[what] if isinstance(out, Mapping) or
                                                         hasattr(out, "keys") else getattr(out, what))
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return value if isinstance(value, torch.Tensor) else None


def _per_image(t: torch.Tensor | None, batch: int, num_prefix: int, first: int = 0) -> torch.Tensor:
    """(B, K) from a forward's main tensor: (B, K) as is, token features (B, N, D) pooled (the prefix token at
    `first` with a prefix, else the mean); anything else gives (B, 0)."""
    if t is None:
        return torch.zeros(batch, 0)
    if t.dim() == 3 and t.shape[0] == batch:
        return t[:, first] if num_prefix else t.mean(dim=1)
    if t.dim() == 2 and t.shape[0] == batch:
        return t
    return torch.zeros(batch, 0)


def _probe_input(batch: int, chans: int, size: tuple[int, int], device: torch.device, dtype: torch.dtype,
                 seed: int) -> torch.Tensor:
    """A seeded, image-like random input (B, C, H, W): unit variance, as a normalised image is."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, chans, *size, generator=g).to(device, dtype)


# ---------------------------------------------------------------------------------------------------------------
# Lazy modules: shapes from one dry forward


def lazy_modules(module: nn.Module) -> list[str]:
    """The names of `module`'s Lazy modules (nn.LazyLinear, nn.LazyConv2d, ...) still without shapes: their
    parameters are `UninitializedParameter`s until a forward pass gives them their input widths."""
    return [name or "(the model itself)" for name, m in module.named_modules()
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()]


def materialise_lazy(module: nn.Module, overrides: Mapping[str, Any], source: str,
                     tensors: Mapping[str, torch.Tensor] | None = None) -> str:
    """Give a module's Lazy modules their shapes by one dry forward of a probe input, as torch's docs ask before a
    state dict is loaded or the parameters are used; '' when it has none left uninitialized, else what was run
    (for the provenance).

    The probe is the size the module states or its position table allows (as `describe` probes), and its channel
    count the one a weights file's tensor for a Lazy patch convolution shows (`tensors`), else the module's, else
    3 then 1. The dry run is in eval mode, without gradients, and with the global random state put back: the
    initial values it draws are replaced by the weights file, or are the model's own random initialisation.

    Raises:
        UserCodeError: no probe input went through its forward, or Lazy modules stayed uninitialized after it;
            the message names them and what to pass.
    """
    lazy = lazy_modules(module)
    if not lazy:
        return ""
    embed = find_patch_embedding(module)
    patch_attr = None if embed is not None else _as_size(getattr(module, "patch_size", None))
    side = patch_attr[0] if patch_attr and patch_attr[0] == patch_attr[1] and patch_attr[0] > 1 else None
    sizes, _patch = _geometry(module, embed, side, overrides, {}, source)
    chans = _lazy_channels(module, embed, overrides, side, tensors)
    here = next((p.device for p in module.parameters()), torch.device("cpu"))
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    shown = ", ".join(f"{n} ({type(module.get_submodule(n) if n != '(the model itself)' else module).__name__})"
                      for n in lazy[:4]) + (f" and {len(lazy) - 4} more" if len(lazy) > 4 else "")
    refused: list[str] = []
    for size, _src in sizes:
        for c, c_src in chans:
            x = _probe_input(1, c, size, here, dtype, seed=0)
            try:
                with torch.random.fork_rng(devices=[]), torch.no_grad(), _evaluating(module):
                    user_call(lambda: module(x), source, "its forward (a dry run that gives its Lazy modules their "
                                                         "shapes)", f"a probe input of shape {tuple(x.shape)}")
            except UserCodeError as e:
                if not _forward_error(e):
                    raise
                refused.append(f"{c} x {size[0]}x{size[1]} ({type(e.__cause__).__name__})")
                continue
            left = lazy_modules(module)
            if left:
                raise UserCodeError(f"{source}: its Lazy modules {', '.join(left[:4])} still have no shapes after a "
                                    f"dry forward of a {tuple(x.shape)} input (its forward does not call them?); "
                                    "expected every Lazy module to be given its shape by one forward pass: run one "
                                    "forward in your factory before returning the model")
            return (f"its Lazy modules ({shown}) given their shapes by one dry forward of a {tuple(x.shape)} input "
                    f"(channels: {c_src})")
    raise UserCodeError(f"{source}: it has Lazy modules without shapes ({shown}), which need one forward pass "
                        f"before weights can be loaded into them, and its forward refused every probe input tried "
                        f"(channels x size: {', '.join(refused[:6])}); pass image_size= (--image-size) and in_chans= "
                        "(--in-chans) for the input it expects, or run one forward in your factory before returning "
                        "the model (torch's dry run for Lazy modules)")


def _lazy_channels(module: nn.Module, embed: PatchEmbedding | None, overrides: Mapping[str, Any],
                   patch_attr: int | None,
                   tensors: Mapping[str, torch.Tensor] | None) -> list[tuple[int, str]]:
    """The channel counts to try for a dry run: the override; a Lazy patch convolution's weight in the weights
    file ((D, C / groups, p, p)); the module's own (`_channels`, its Lazy layers' zero widths left out); 3, 1."""
    if overrides.get("in_chans") is not None:
        return [(int(overrides["in_chans"]), "override")]
    found: list[tuple[int, str]] = []
    if embed is not None and not embed.in_chans and tensors:
        conv = module.get_submodule(embed.name)
        key = next((k for k in tensors if k == f"{embed.name}.weight" or k.endswith(f".{embed.name}.weight")), None)
        if key is not None and tensors[key].dim() == 4:
            c = int(tensors[key].shape[1]) * int(getattr(conv, "groups", 1))
            found.append((c, f"shape: the weights file's {key} {tuple(tensors[key].shape)}"))
    if embed is None or embed.in_chans:
        found += [(c, src) for c, src in _channels(module, embed, overrides, patch_attr) if c > 0]
    found += [(3, "guess: 3 channels (RGB)"), (1, "guess: 1 channel")]
    seen: set[int] = set()
    return [(c, src) for c, src in found if not (c in seen or seen.add(c))]


# ---------------------------------------------------------------------------------------------------------------
# Describing a module: the probes and what they show


@dataclass(frozen=True)
class Description:
    """What the probes found a module to be, for `LiveModel`: its spec, the device it runs on, the captured layers
    (module name, mechanism) and the attention calls skipped, its output ('logits' | 'features' | 'none') and
    which of its results that is (`what`), its position table's name, and how its attention is laid out."""

    spec: ModelSpec
    device: torch.device
    layers: list[tuple[str, str]]
    skipped: list[tuple[str, str, tuple[int, ...]]]
    output: str
    pos_name: str | None
    layout: AttentionLayout
    what: str


# Attention modules whose maps the live path records but does not yet show as the model computes them (the zoo
# sweep, scripts/trial_zoo.py, found none of VOLO's layers equal to its own softmax; ConViT's gated layers were
# recorded as two layers each, and a run disagreed with the probe on which): refused rather than shown.
UNPROVEN_ATTENTION = {"OutlookAttention": "VOLO's outlook attention (each position attends over a k x k "
                                          "neighbourhood folded into channels)",
                      "GPSA": "ConViT's gated positional self-attention (each head's weights mix a content softmax "
                              "and a positional softmax by a learned gate, then are renormalised)"}


def _refuse_unproven(module: nn.Module, source: str) -> None:
    """Refuse a module holding attention the live path is known not to show exactly (`UNPROVEN_ATTENTION`)."""
    found = {type(m).__name__ for m in module.modules()} & set(UNPROVEN_ATTENTION)
    if found:
        name = sorted(found)[0]
        raise LiveModelError(
            f"{source}: {type(module).__name__} holds {name} modules, {UNPROVEN_ATTENTION[name]}: vitviz's live "
            "path does not show them exactly yet (its maps disagreed with the model's own softmax), so it shows "
            "nothing rather than a wrong map; no other route reads this model yet")


def describe(module: nn.Module, overrides: Mapping[str, Any], source: str | None = None,
             how: str = "") -> Description:
    """Describe `module` by its probe forward passes (see `vitviz.core.running.live.model.load_live`, which wraps it)."""
    source = source or f"<{type(module).__name__} object>"
    _refuse_unproven(module, source)
    prov: dict[str, str] = {}
    lazy = materialise_lazy(module, overrides, source)
    _refuse_meta(module, source)
    device = _place(module, overrides.get("device"), source)
    _refuse_non_finite_weights(module, source)
    packed = isinstance(module, PackedTower)    # packed patches + grid_thw (Qwen-VL): wrapped to take images
    # (its patches are cut by the wrapper: a stride == kernel convolution inside, GLM-4V's merger, is none)
    embed = None if packed else find_patch_embedding(module)
    patch_attr = None if embed is not None else _as_size(getattr(module, "patch_size", None))
    patch_attr_side = patch_attr[0] if patch_attr and patch_attr[0] == patch_attr[1] and patch_attr[0] > 1 else None
    sizes, patch = _geometry(module, embed, patch_attr_side, overrides, prov, source)
    if packed and overrides.get("image_size") is None and overrides.get("grid") is None:
        sizes = [(module.image_size, module.side_source)]
    chans = _channels(module, embed, overrides, patch_attr_side)
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    group_heads = int(overrides["heads"]) if overrides.get("heads") else None
    x, out, recorder, (size, in_chans) = _probe(module, sizes, chans, patch, device, dtype, prov, source, group_heads,
                                                chunks=packed)
    if recorder.unsure:
        raise NoAttentionError.said(*_unsure(source, recorder, group_heads))
    if not recorder.layers and recorder.windowed:
        raise NoAttentionError.said(*_only_windows(source, recorder))
    if not recorder.layers:
        raise NoAttentionError.said(*_nothing_seen(source, tuple(x.shape), recorder))
    # a packed tower runs one image at a time (a batch of two shows nothing more: it has no prefix tokens)
    check = _Recorder(1) if packed else _check_probe(module, x, size, in_chans, device, dtype, source, recorder,
                                                     group_heads)
    per_image = check is not None and check.batch == 1     # its attention comes one image at a time
    if per_image:
        check = None
    folded = _fold_order(recorder, check)
    try:
        tokens, patch, grid, prefix, order = _tokens(recorder, check, size, patch, overrides, prov, source, module)
    except LiveModelError as unfit:
        if embed is None or overrides.get("grid") is not None or overrides.get("image_size"):
            raise
        # the patch module may not be all the downsampling (a stem of several stride == kernel convolutions): the
        # patch size from the token count and the input size, as without a patch module -- a whole multiple of
        # the module's patches, or the error stands (window attention, fewer tokens than patches)
        try:
            found = _tokens(recorder, check, size, None, overrides, dict(prov), source, module)
        except LiveModelError:
            raise unfit from None
        if found[1] <= embed.patch[0] or found[1] % embed.patch[0]:
            raise
        tokens, patch, grid, prefix, order = found
        _tokens(recorder, check, size, None, overrides, prov, source, module)   # its provenance
        prov["patch_size"] = prov["patch_size"].replace("; no patch module: the patches are cut in the forward", "") \
            + (f"; {embed.describe()}, the first patch-like module, makes {size[0] // embed.patch[0]}x"
               f"{size[1] // embed.patch[1]} patches, which its attention's tokens do not fit: more downsampling "
               "follows it (a convolutional stem)")
        embed = None
    _check_prefix(overrides.get("num_prefix"), prefix, tokens, grid, source)
    if packed:
        order = module.order(size)
        prov["token_order"] = (f"{type(module.tower).__name__}'s sequence: merge blocks of {module.merge}x"
                               f"{module.merge} patches in raster order, as its image processor packs them"
                               + ("; then reordered into its attention windows (its own window index)"
                                  if module.windowed() else "") + "; shown on the image's grid, row by row")
    index = [i for i, m in enumerate(recorder.maps) if m.shape[-1] == tokens]
    skipped = recorder.skipped + [(*recorder.layers[i], tuple(m.shape)) for i, m in enumerate(recorder.maps)
                                  if m.shape[-1] != tokens]
    joins = _class_layers(recorder, check, tokens, order, prov, source)
    skipped += joins.unused
    # every layer in the order the forward computed it: (module, mechanism, (1, H, T, T) map on the full grid)
    merged = sorted([((i, 1), *recorder.layers[i], _laid(recorder.maps[i], joins.joined, 0)) for i in index] +
                    [((at, 0), name, mech, _laid(m, joins.joined, joins.joined, joins.at))
                     for at, name, mech, m in joins.kept], key=lambda e: e[0])
    layers = [(name, mech) for _, name, mech, _m in merged]
    tokens, prefix = tokens + joins.joined, prefix + joins.joined
    heads = {int(m.shape[1]) for *_, m in merged}
    if len(heads) > 1:
        seen = "; ".join(f"{name} {int(m.shape[1])} heads over {int(m.shape[-1])} tokens"
                         for _, name, _mech, m in merged[:6]) + (" ..." if len(merged) > 6 else "")
        raise LiveModelError(
            f"{source}: its attention layers over the same {tokens} tokens have different head counts "
            f"{sorted(heads)} ({seen}); a model run by its own code is shown as one stack of layers with one head "
            "count (a hierarchical model's stages -- DaViT, Hiera, PVT -- or attention over channels, which is not "
            "spatial, can look like this). Next: vitviz shows stages with their own head counts for the windowed "
            "models it reads by file (Swin, SAM / ViTDet: open the checkpoint file); for this model class there is "
            "no route yet")
    num_heads = heads.pop()
    if overrides.get("heads") and int(overrides["heads"]) != num_heads:
        raise LiveModelError(f"{source}: heads={overrides['heads']} was given, but its attention has {num_heads} "
                             f"heads ({_layer_summary(layers)})")
    kept = torch.stack([m for *_, m in merged], dim=1)    # (1, L, H, T, T)
    _refuse_non_finite(kept.numpy(), layers, source, f"a probe input of shape {tuple(x.shape)}")
    grouped = [perm for i, perm in recorder.grouped if recorder.maps[i].shape[-1] == tokens]
    two_d = [i for i in index if i in recorder.two_d_layers]
    if two_d and len(two_d) != len(index):
        raise LiveModelError(f"{source}: {len(two_d)} of its {len(index)} attention layers come as 2-D (T, T) maps "
                             "(one per image per head) and the others batched; vitviz needs one layout for every "
                             f"layer ({_layer_summary(layers)})")
    layout = AttentionLayout(per_head=bool(grouped), heads=num_heads, perms=tuple(grouped),
                             head_major=folded.startswith("head-major"), order=order, per_image=per_image,
                             two_d=bool(two_d), heads_first=bool(recorder.heads_first),
                             applied=frozenset(n for n in recorder.applied if n in {name for name, _ in layers}),
                             joined=joins.joined, joined_at=joins.at)
    prov["num_heads"] = f"capture: attention maps of shape {tuple(kept[:, 0].shape)}"
    prov["depth"] = f"capture: {_layer_summary(layers)}"
    dim = embed.dim if embed else module.dim if packed else _token_width(module)
    names = _prefix_names(module, dim, prefix)
    where = "last in the sequence, shown first" if order else \
        "joining at the class-attention layers, shown first" if joins.joined else "first in the sequence"
    prov["num_prefix"] = (f"capture: T={tokens} tokens - {grid[0]}x{grid[1]} patches = {prefix} prefix token(s), "
                          f"taken as {', '.join(names) or 'none'} ({where})")
    main, what = _main_output(out, recorder.last_linear)
    if main is not None and main.is_floating_point() and not bool(torch.isfinite(main).all()):
        raise NonFiniteError(f"{source}: its output ({what}) on a probe input of shape {tuple(x.shape)} holds NaN "
                             "or infinity; expected a model whose forward computes finite numbers")
    kind, num_classes = _output_kind(main, what, recorder, overrides, prov)
    prov["embed_dim"] = f"shape: {embed.describe()}" if embed else \
        (f"shape: the token width {dim}" if dim else "unknown: no patch embedding found")
    pos = None if packed else _pos_table(module, dim)
    pos_prefix = 0
    if packed:
        prov["pos_embed"] = ("none shown: its positions are computed for each grid in its forward (2-D rotary "
                             "positions, an interpolated table)")
    elif pos is not None and pos[1] in (tokens, grid[0] * grid[1]):
        pos_prefix = prefix if pos[1] == tokens else 0
        prov["pos_embed"] = f"shape: {pos[0]} ({pos[1]} rows: {pos_prefix} prefix + {grid[0]}x{grid[1]} patches)"
    else:
        prov["pos_embed"] = "none: no learned (N, D) position table with one row per token" + \
            (f" ({pos[0]} has {pos[1]} rows)" if pos else "")
        pos = None
    pp = _preprocess(module, size, in_chans, overrides, prov)
    labels = _labels(module, overrides, num_classes, prov)
    not_used = "not used: the module's own code runs"
    for name in ("eps", "mlp_kind", "mlp_hidden", "qkv_bias", "qk_norm", "layer_scale", "pooling", "final_norm",
                 "fc_norm", "pre_logits"):
        prov.setdefault(name, not_used)
    counts = Counter(m for _, m in layers)
    notes = list(recorder.notes) + ([lazy] if lazy else [])
    said = _what_differs(recorder, layers, tokens - joins.joined) + list(joins.said) + \
        _not_shown(recorder, skipped, tokens)
    for note in said:
        warnings.warn(f"{source}: {note}", LiveWarning, stacklevel=3)
    notes += said
    if packed:
        notes.append(module.what)
        windows = [f"{i} ({name})" for i, (name, m) in enumerate(layers) if "windows" in m]
        if windows:
            notes.append(f"layers {', '.join(windows)} attend within windows ({module.windowed() or 'measured'})")
    elif per_image:
        notes.append("its attention is computed one image at a time ((H, T, T) maps, a loop over the batch): "
                     "a batch is run through it one image at a time")
    elif two_d:
        notes.append(f"its attention is computed one 2-D (T, T) map per image per head (loops over both): "
                     f"{recorder.maps[two_d[0]].shape[1]} heads per layer, read in call order {folded}")
    elif folded:
        notes.append(f"the heads folded into the batch ((B*H, T, T) maps) are read {folded}")
    runs = type(module.tower if packed else module).__name__
    prov["path"] = (f"live: {runs}'s own forward runs; attention captured from "
                    f"{', '.join(f'{n} x {m}' for m, n in counts.items())}" + (f" ({how})" if how else "")
                    + ("; " + "; ".join(notes) if notes else ""))
    spec = ModelSpec(
        family="live", source=source, image_size=size, patch_size=patch, embed_dim=dim, depth=len(layers),
        num_heads=num_heads, in_chans=in_chans, num_classes=num_classes, cls_token="cls" in names,
        dist_token="dist" in names, reg_tokens=sum(n.startswith("reg") for n in names), pos_embed=pos is not None,
        pos_prefix=pos_prefix, pos_grid=grid, preprocess=pp, labels=labels,
        num_params=sum(p.numel() for p in module.parameters()), provenance=tuple(prov.items()))
    warn_guesses(spec)  # what nothing in the module stated (preprocessing, input size), said loudly
    return Description(spec, device, layers, skipped, kind, pos[0] if pos else None, layout, what)


@dataclass(frozen=True)
class _Joins:
    """Class-attention layers the probe saw (`_class_layers`): how many tokens join late (0: none), where they are
    among the keys (None: first), the layers kept ((index among the square layers, module, mechanism,
    (1, H, J, T + J) map)), the calls not shown (as `LiveModel.skipped` lists them) and what is said."""

    joined: int = 0
    at: tuple[int, ...] | None = None
    kept: tuple[tuple[int, str, str, torch.Tensor], ...] = ()
    unused: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    said: tuple[str, ...] = ()


def _class_layers(recorder: _Recorder, check: _Recorder | None, tokens: int, order: tuple[int, ...] | None,
                  prov: dict[str, str], source: str) -> _Joins:
    """The class-attention layers among the probe's calls: J queries (a CLS token that joins late, as CaiT's) over
    [them, the T tokens of the self-attention layers], the same J in every one. Where the joining tokens are among
    the keys is measured on the batch of two: in the first such layer their own scores do not depend on the image
    (a learned token's query and key); unmeasured, first (as CaiT concatenates [CLS, patches]), said."""
    fits = [c for c in recorder.class_maps if c[3].shape[-1] - c[3].shape[-2] == tokens]
    unused = tuple((name, mech, tuple(m.shape)) for _, name, mech, m, _s in recorder.class_maps
                   if m.shape[-1] - m.shape[-2] != tokens)
    counts = {int(c[3].shape[-2]) for c in fits}
    if not fits or len(counts) > 1 or order is not None:
        why = "" if not fits else (" (class-attention layers with different query counts, or with prefix tokens "
                                   "in the self-attention: not shown)")
        return _Joins(unused=unused + tuple((n, m, tuple(p.shape)) for _, n, m, p, _s in fits), said=(
            (f"{len(fits)} class-attention call(s) not shown{why}",) if fits else ()))
    j = counts.pop()
    at, how = None, "not measured (no batch of two), taken first, as CaiT concatenates [CLS, patches]"
    mine = [c for c in check.class_maps if c[3].shape[-1] - c[3].shape[-2] == tokens] if check is not None else []
    if mine and mine[0][4] is not None:
        s = mine[0][4]                                                        # (2, H, J, T + J)
        same = ((s[0] - s[1]).abs() <= 1e-4 * (1.0 + s[0].abs())).all(dim=0).all(dim=0)
        found = tuple(int(i) for i in torch.nonzero(same).flatten())
        if len(found) == j:
            at = None if found == tuple(range(j)) else found
            how = (f"measured: key(s) {', '.join(map(str, found))} of the first class-attention layer, whose scores "
                   "do not depend on the image (a learned token's query and key)")
        else:
            how = (f"taken first, as CaiT concatenates [CLS, patches]: the first class-attention layer's scores did "
                   f"not single out {j} image-independent key(s) ({len(found)} found)")
    prov["token_order"] = (f"capture: {j} token(s) join at the class-attention layers ({fits[0][1]} ...), the only "
                           f"queries there, over [them, the {tokens} tokens]; shown first; among the keys {how}")
    said = (f"{len(fits)} class-attention layer(s) ({fits[0][1]} ...): only the {j} token(s) that join there query, "
            f"over [them, the {tokens} tokens] -- shown as row(s) 0..{j - 1} of the T x T map (the other rows are "
            f"zero: those tokens pass through unchanged); in the self-attention layers before them the joining "
            "token(s) are not there yet (their rows and columns are zero)")
    return _Joins(j, at, tuple((i, n, m, p) for i, n, m, p, _s in fits), unused, (said,))


def _laid(m: torch.Tensor, joined: int, queries: int, at: tuple[int, ...] | None = None) -> torch.Tensor:
    """A probe map (1, H, q, k) on the full (T, T) grid of a model whose `joined` tokens join late (see
    `AttentionLayout.joined`): a self-attention map (queries 0) in the lower right, a class-attention map's rows on
    top, its keys in the order `at` gives."""
    if not joined:
        return m
    t = int(m.shape[-1]) + (joined if not queries else 0)
    full = m.new_zeros(*m.shape[:-2], t, t)
    if queries:
        full[..., :queries, :] = m[..., list(at) + [i for i in range(t) if i not in at]] if at is not None else m
    else:
        full[..., joined:, joined:] = m
    return full


def _what_differs(recorder: _Recorder, layers: list[tuple[str, str]], tokens: int) -> list[str]:
    """What the probe saw the module do that the shown maps are not: a shown layer's softmax output changed before
    it is applied to the values (talking heads, a re-normalisation, dropout in eval mode), and (T, T) scores over
    the image tokens that no softmax over their last axis followed (sigmoid or ReLU attention, a softmax over the
    other axis), left out."""
    shown = {name for name, _ in layers}
    applied = {name: how for name, how in recorder.applied.items() if name in shown}
    changed = {name: how for name, how in recorder.changed.items() if name not in applied and (
               name in shown or any(name.startswith(f"{s}.") or s.startswith(f"{name}.") for s in shown))}
    said = []
    if applied:
        where = ", ".join(f"{name} (by {how})" for name, how in list(applied.items())[:4]) + \
            (f" and {len(applied) - 4} more" if len(applied) > 4 else "")
        said.append(f"in {where}, the softmax's output is changed before it weights the values (talking heads mix "
                    "the heads' probabilities): the maps shown for those layers are the weights applied to the "
                    "values, taken where they meet them -- not a softmax: their rows need not sum to 1 and may "
                    "hold negative values")
    if changed:
        where = ", ".join(f"{name} (by {how})" for name, how in list(changed.items())[:4]) + \
            (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        said.append(f"in {where}, the weights applied to the values are the softmax's output changed afterwards "
                    "(talking heads, a re-normalisation, dropout in eval mode?): the maps shown are the softmax's "
                    "probabilities, not the weights the module applies")
    missing = [(name, shape) for name, shape in recorder.no_softmax if shape[-1] == tokens]
    if missing:
        names = ", ".join(dict.fromkeys(name for name, _ in missing))
        said.append(f"{len(missing)} score product(s) over the {tokens} tokens with no softmax over their last axis "
                    f"after them, in {names} (sigmoid or ReLU attention, or a softmax over another axis?): not "
                    "shown -- vitviz shows softmax attention only, so those layers are missing from the maps")
    return said


def _refuse_meta(module: nn.Module, source: str) -> None:
    """A module whose tensors are on the meta device holds no values (built under `torch.device('meta')` or
    `init_empty_weights` and never loaded): refused, naming them."""
    empty = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if empty:
        raise LiveModelError(f"{source}: {len(empty)} of its tensors are on the 'meta' device, which holds no "
                             f"values ({', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}): it was built "
                             "without memory (torch.device('meta'), init_empty_weights) and never loaded; expected "
                             "a model with weights (give its weights file, or build it on the CPU)")


def _refuse_non_finite_weights(module: nn.Module, source: str) -> None:
    """NaN or infinity in a parameter (or NaN in a buffer; an infinite mask is a mask) is refused, naming the
    tensors, as a checkpoint file's are."""
    bad = []
    for name, t in [*((n, p) for n, p in module.named_parameters()), *module.named_buffers()]:
        if not t.is_floating_point() or not t.numel():
            continue
        with torch.no_grad():
            wrong = ~torch.isfinite(t) if isinstance(t, nn.Parameter) else torch.isnan(t)
            n = int(wrong.sum())
        if n:
            bad.append(f"{name} ({n} of {t.numel()})")
    if bad:
        raise LiveModelError(f"{source}: NaN or infinite weights in {', '.join(bad[:6])}"
                             f"{' ...' if len(bad) > 6 else ''}; expected finite weights (a diverged or damaged "
                             "model: every attention map would be NaN)")


def _token_width(module: nn.Module) -> int:
    """The width of a module's learned tokens or position table, when it has no patch embedding module."""
    for name, p in module.named_parameters():
        leaf = name.rsplit(".", 1)[-1].lower()
        if not is_lazy(p) and p.dim() in (2, 3) and (leaf in _CLS_LEAVES or "pos" in leaf) and p.shape[-1] > 4:
            return int(p.shape[-1])
    return 0


def _probe(module: nn.Module, sizes: list[tuple[tuple[int, int], str]], chans: list[tuple[int, str]],
           patch: int | None, device: torch.device, dtype: torch.dtype, prov: dict[str, str],
           source: str, group_heads: int | None = None,
           chunks: bool = False) -> tuple[torch.Tensor, Any, _Recorder, tuple[tuple[int, int], int]]:
    """The first probe: one image at the most likely size and channel count; where those were guesses and the
    forward refuses the input, the next likely ones (the sources say which was taken, and why)."""
    tries = [(s, c) for s in sizes for c in chans]
    failed: list[tuple[str, UserCodeError]] = []
    shrunk = ""      # why the probe runs smaller than the size the module states ('' where it does not)
    for (size, size_src), (c, c_src) in tries:
        if not size_src.startswith("override"):    # a size the caller did not give: shrunk where it would not fit
            size, size_src = _within_memory(module, size, size_src, c, patch, device, source)
            shrunk = size_src if size_src.startswith(_SHRUNK) else shrunk
        _check_probe_memory(module, size, c, patch, 2, source)
        x = _probe_input(1, c, size, device, dtype, seed=0)
        recorder = _Recorder(1, scores=True, group_heads=group_heads, chunks=chunks)
        shape = tuple(x.shape)
        try:
            with torch.inference_mode():
                out = user_call(lambda: _run(module, x, recorder, last_linear=True), source, "its forward",
                                f"a probe input of shape {shape}")
        except UserCodeError as e:
            if (not _forward_error(e) or len(tries) == 1) and shrunk:
                raise _smaller_refused(source, shrunk, e) from e
            if not _forward_error(e) or len(tries) == 1:
                raise
            failed.append((f"{c} x {size[0]}x{size[1]}", e))
            continue
        tried = f" (the first input its forward accepted; it refused {', '.join(t for t, _ in failed)})" \
            if failed else ""
        prov["image_size"], prov["in_chans"] = size_src + tried, c_src + tried
        return x, out, recorder, (size, c)
    first = failed[0][1]
    others = ", ".join(t for t, _ in failed[1:])
    if shrunk:
        raise _smaller_refused(source, shrunk, first) from first
    raise UserCodeError(f"{first}; also tried {others} (channels x size); pass image_size= (--image-size), "
                        "in_chans= (--in-chans) and grid= for the input it expects") from first.__cause__


_SHRUNK = "guess: probed at"     # how the source of a probe size shrunk to fit the memory begins
_PROBE_SHARE = 2                  # a shrunk probe keeps to 1 / this of the memory available (its forward's own
                                  # activations and the weights' copies need the rest)


def _within_memory(module: nn.Module, size: tuple[int, int], src: str, chans: int, patch: int | None,
                   device: torch.device, source: str) -> tuple[tuple[int, int], str]:
    """The probe size for a size the module states (or vitviz guessed), and its source: `size` where its probe
    fits the memory -- both probe images, every layer's attention kept (the probe records them all) -- else the
    largest size the model takes that fits half of what is available: whole patches (of merge blocks, where its
    config states them, or a packed tower's), the stated aspect kept, said loudly as an assumption ('guess: probed at
    768 px, not the configured 2048 px, ...'). HunYuan-VL states 2048 px, a probe of 128 GiB.

    Raises:
        DeviceError: not even one patch (one merge block) fits.
    """
    free = _free_memory(device)
    needed = _probe_bytes(module, size, chans, patch)
    if free is None or needed < CHECK_FROM or needed <= free:
        return size, src
    budget = free // _PROBE_SHARE
    unit = module.block if isinstance(module, PackedTower) else \
        (patch or 16) * (merge_size(getattr(module, "config", None)) or 1)
    h, w = size
    longer = max(h, w)
    for k in range(longer // unit, 0, -1):
        side = k * unit
        fit = (max(unit, round(h * side / longer / unit) * unit), max(unit, round(w * side / longer / unit) * unit))
        used = _probe_bytes(module, fit, chans, patch)
        if used < CHECK_FROM or used <= budget:
            said = f"{fit[0]} px" if fit[0] == fit[1] else f"{fit[0]}x{fit[1]} px"
            stated = f"{h} px" if h == w else f"{h}x{w} px"
            kind = "default" if src.startswith("guess") else "configured"
            return fit, (f"{_SHRUNK} {said}, not the {kind} {stated} ({src}), to stay within "
                         f"{format_bytes(budget)} (half the {format_bytes(free)} of memory available: a probe at "
                         f"{stated}, its attention maps kept, needs {format_bytes(needed)}); the largest size in "
                         f"whole {unit} px {'merge blocks' if unit != (patch or 16) else 'patches'} that fits")
    raise DeviceError(f"{source}: a probe at the {h}x{w} px its {src} states needs {format_bytes(needed)}, and not "
                      f"even one {unit} px block fits within {format_bytes(budget)} (half the {format_bytes(free)} of "
                      "memory available); nothing was allocated; free memory, or run it on a device with more")


def _smaller_refused(source: str, shrunk: str, error: UserCodeError) -> DeviceError:
    """The refusal of a model whose forward refused the smaller probe size `_within_memory` chose: no size it takes
    fits the memory (a model that takes only its stated size)."""
    return DeviceError(f"{source}: {shrunk.removeprefix('guess: ')}; but its forward refused that size ({error}); "
                       "no size it takes fits the memory: free memory, or pass image_size=N (CLI --image-size N) "
                       "for a size it takes")


def _free_memory(device: torch.device) -> int | None:
    """Bytes a probe on `device` can still get: the host's (the recorder keeps maps there or beside them), and a
    CUDA device's free memory on top of that; None where unknown."""
    free = available_memory()
    if device.type == "cuda" and torch.cuda.is_available():
        cuda = int(torch.cuda.mem_get_info(device)[0])
        free = cuda if free is None else min(free, cuda)
    return free


def _probe_bytes(module: nn.Module, size: tuple[int, int], chans: int, patch: int | None) -> int:
    """What the first two probes hold at `size`: two images (and a copy) and every attention layer's maps of both,
    plus one layer's scores; the layers counted as the modules stating `num_heads` (at least one), each at the most
    heads any of them states."""
    h, w = size
    tokens = (h // patch) * (w // patch) if patch else (h * w) // 256
    stating = [n for n in (getattr(m, "num_heads", getattr(m, "num_attention_heads", None)) for m in module.modules())
               if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    layers, heads = max(len(stating), 1), max(stating or [1])
    return 2 * (chans * h * w * 4 * 2 + (layers + 1) * heads * tokens * tokens * 4)


def _check_probe_memory(module: nn.Module, size: tuple[int, int], chans: int, patch: int | None, batch: int,
                        source: str) -> None:
    """Refuse, before allocating it, a probe whose input or one layer's attention would not fit in the memory
    left (image_size=60000 is 43 GB of input, and its attention far more)."""
    h, w = size
    tokens = (h // patch) * (w // patch) if patch else (h * w) // 256
    heads = max([m.num_heads for m in module.modules() if isinstance(getattr(m, "num_heads", None), int)
                 and not isinstance(m.num_heads, bool)] or [1])
    needed = batch * (chans * h * w * 4 * 2 + heads * tokens * tokens * 4)
    free = available_memory() if needed >= CHECK_FROM else None
    if free is not None and needed > free:
        raise DeviceError(f"{source}: a {h}x{w} probe input ({chans} channel(s), {tokens:,} tokens"
                          f"{'' if patch else ' if its patches are 16 px'}) and one layer's attention need "
                          f"{format_bytes(needed)}, but only {format_bytes(free)} of memory is available; nothing "
                          "was allocated; pass a smaller image_size=N (CLI --image-size N) that the model takes")


def _check_probe(module: nn.Module, x: torch.Tensor, size: tuple[int, int], chans: int, device: torch.device,
                 dtype: torch.dtype, source: str, first: _Recorder,
                 group_heads: int | None = None) -> _Recorder | None:
    """The second probe: a batch of the first probe's image and another; None when the module refuses a batch of
    two with an ordinary error (it works on one image at a time) or sees other layers in it."""
    x2 = torch.cat([x, _probe_input(1, chans, size, device, dtype, seed=1)])
    check = _Recorder(2, scores=True, group_heads=group_heads)
    check.heads_first = first.heads_first     # as many heads as images: the axis order the first probe saw
    try:
        with torch.inference_mode():
            user_call(lambda: _run(module, x2, check), source, "its forward", f"a probe batch of shape "
                                                                              f"{tuple(x2.shape)}")
    except UserCodeError as e:
        if not _forward_error(e):
            raise
        return None
    if [m.shape[-1] for m in check.maps] != [m.shape[-1] for m in first.maps]:
        if len(check.maps) == 2 * len(first.maps) and first.folded and \
                all(m.numel() == first.maps[j // 2].numel() for j, m in enumerate(check.maps)):
            return _Recorder(1)    # each layer twice, each time one image's (H, T, T): a loop over the batch
        return None
    seen = {int(m.shape[-1]) for m in first.maps}
    if any(shape[-1] in seen for _, _, shape, _ in check.unsure):   # (a (2, 2) softmax over 2 classes is no map)
        return None
    return check


def _fold_order(first: _Recorder, check: _Recorder | None) -> str:
    """How the first layer whose heads come folded into the batch ((B*H, T, T)) orders them, 'batch-major'
    (b*H + h) or 'head-major' (h*B + b), checked against the one-image probe ('' with none such; 'batch-major, as
    assumed ...' when it cannot be checked). The second probe's maps and scores of such layers are set right."""
    if not first.folded:
        return ""
    if check is None:
        return "batch-major (b*H + h), assumed (as nn.MultiheadAttention and fairseq lay them out: the module " \
               "refused a batch of two, where the order shows)"
    i = first.folded[0]
    ref = first.maps[i][0]
    mine = check.maps[i]
    if torch.allclose(mine[0], ref, atol=1e-4):
        return "batch-major (b*H + h), checked on a batch of two"
    h = mine.shape[1]
    flip = mine.reshape(2 * h, *mine.shape[-2:]).reshape(h, 2, *mine.shape[-2:]).transpose(0, 1)
    if not torch.allclose(flip[0], ref, atol=1e-4):
        return "batch-major (b*H + h), assumed (a batch of two matched neither order)"
    for j in first.folded:
        m = check.maps[j]
        check.maps[j] = m.reshape(-1, *m.shape[-2:]).reshape(m.shape[1], 2, *m.shape[-2:]).transpose(0, 1)
        d = check.diags[j]
        if d is not None:
            check.diags[j] = d.reshape(-1, d.shape[-1]).reshape(d.shape[1], 2, d.shape[-1]).transpose(0, 1)
    return "head-major (h*B + b), checked on a batch of two"


def _place(module: nn.Module, device: str | None, source: str) -> torch.device:
    """Move the module when a device is asked for; else it stays where it is."""
    here = next((p.device for p in module.parameters()), torch.device("cpu"))
    if device is None:
        return here
    dev = resolve_device(device)
    try:
        user_call(lambda: module.to(dev), source, f"moving it to {dev}")
    except DeviceError as e:
        module.to(here)
        raise DeviceError(f"{source}: does not fit on {dev} ({e.__cause__ or e}); use device='cpu'") from e
    return dev


def _pair(value: Any, what: str) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    try:
        h, w = (int(v) for v in value)
    except (TypeError, ValueError):
        raise LiveModelError(f"{what}={value!r}: expected N or (rows, cols)") from None
    if min(h, w) < 1:
        raise LiveModelError(f"{what}={value!r}: expected positive numbers")
    return (h, w)


Sizes = list[tuple[tuple[int, int], str]]
_COMMON_SIZES = ((224, "ImageNet"), (32, "CIFAR"), (28, "MNIST"))


def _geometry(module: nn.Module, embed: PatchEmbedding | None, patch_attr: int | None, overrides: Mapping[str, Any],
              prov: dict[str, str], source: str) -> tuple[Sizes, int | None]:
    """The input sizes to probe with, most likely first, each with its source (one when something states it),
    and the patch size (None when it must come from the token count)."""
    patch: int | None = None
    if embed is not None:
        if embed.patch[0] != embed.patch[1]:
            raise LiveModelError(f"{source}: {embed.describe()} has non-square patches; vitviz supports square "
                                 "patches only")
        patch = embed.patch[0]
        prov["patch_size"] = f"shape: {embed.describe()}"
    elif patch_attr is not None:
        patch = patch_attr
        prov["patch_size"] = f"attribute: patch_size ({patch} px; no patch module: the patches are cut in the forward)"
    grid = _pair(overrides["grid"], "grid") if overrides.get("grid") is not None else None
    if overrides.get("image_size"):
        size = _pair(overrides["image_size"], "image_size")
        src = "override"
        if patch is not None:
            whole = whole_patches(size, patch)
            if min(whole) == 0:
                raise LiveModelError(f"image_size {size} is smaller than one {patch} px patch")
            src = "override" if whole == size else \
                f"override {size[0]}x{size[1]}, rounded down to whole {patch} px patches"
            size = whole
        if grid is not None:
            patch = _patch_from_grid(size, grid, patch, source)
            prov.setdefault("patch_size", f"override: image_size / grid = {patch}")
        return [(size, src)], patch
    if grid is not None:
        if patch is None:
            stated = _size_attribute(module, embed)
            if stated is None:
                raise LiveModelError(f"{source}: grid={grid} needs a patch size, and no patch embedding was found; "
                                     "pass image_size= too")
            patch = _patch_from_grid(stated[0], grid, None, source)
            prov["patch_size"] = f"{stated[1]} / grid override"
        return [((grid[0] * patch, grid[1] * patch), f"override: grid {grid[0]}x{grid[1]} x {patch} px patches")], \
            patch
    stated = _size_attribute(module, embed)
    if stated is not None:
        return [(whole_patches(stated[0], patch) if patch else stated[0], stated[1])], patch
    sizes: Sizes = [((side * patch, side * patch), why) for side, why in _pos_sides(module, embed, patch)] \
        if patch else []
    for side, what in _COMMON_SIZES:
        size = whole_patches((side, side), patch, at_least_one=True) if patch else (side, side)
        if all(s != size for s, _ in sizes):
            sizes.append((size, f"guess: {size[0]} px ({what}; nothing in the module states its input size)"))
    return sizes, patch


def _patch_from_grid(size: tuple[int, int], grid: tuple[int, int], patch: int | None, source: str) -> int:
    p = size[0] // grid[0]
    if p < 1 or size[0] // p != grid[0] or size[1] // p != grid[1] or (patch is not None and p != patch):
        raise LiveModelError(f"{source}: image size {size[0]}x{size[1]} and grid {grid[0]}x{grid[1]} do not give "
                             f"one square patch size" + (f" of {patch} px (its patch embedding)" if patch else ""))
    return p


def _pos_sides(module: nn.Module, embed: PatchEmbedding | None, patch: int) -> list[tuple[int, str]]:
    """Grid sides a learned position table allows, the likeliest first: its rows minus the learned prefix tokens
    (or all its rows), then minus other small prefix counts."""
    dim = embed.dim if embed is not None else _token_width(module)
    pos = _pos_table(module, dim)
    if pos is None:
        return []
    prefix = sum(_prefix_params(module, dim).values())
    found: list[tuple[int, str]] = []
    counts = [(prefix, f"- {prefix} learned prefix token(s)"), (0, "(patches only)")] + \
        [(k, f"- {k} prefix token(s), a guess") for k in range(1, _PROBE_PREFIX + 1) if k != prefix]
    for k, covered in counts:
        rows = pos[1] - k
        side = math.isqrt(max(rows, 0))
        if rows > 0 and side * side == rows and all(s != side for s, _ in found):
            kind = "shape" if k in (prefix, 0) else "guess"
            found.append((side, f"{kind}: position table {pos[0]} ({pos[1]} rows {covered} = {side}x{side} "
                                f"patches of {patch} px, a square grid)"))
    return found[:3]


_PROBE_PREFIX = 16   # the most prefix tokens a grid is worked out with from the token count alone


def _tokens(recorder: _Recorder, check: _Recorder | None, size: tuple[int, int], patch: int | None,
            overrides: Mapping[str, Any], prov: dict[str, str], source: str,
            module: nn.Module) -> tuple[int, int, tuple[int, int], int, tuple[int, ...] | None]:
    """(T, patch size, grid, prefix count, token order): the token count of the model's self-attention at the probe
    size, the grid it covers and where its prefix tokens are (None: first)."""
    square = [int(m.shape[-1]) for m in recorder.maps]
    fixed = _fixed_tokens(check, square[0])
    if patch is None:  # no patch size: the grid follows from T, the input size and the prefix count
        patch, prefix = _patch_from_tokens(square[0], size, overrides.get("num_prefix"), fixed, module, prov,
                                           source)
    grid = (size[0] // patch, size[1] // patch)
    patches = grid[0] * grid[1]
    tokens = next((t for t in square if 0 <= t - patches <= _MAX_PREFIX), None)
    if tokens is None:
        raise LiveModelError(f"{source}: its attention runs over {sorted(set(square))} tokens, but a "
                             f"{size[0]}x{size[1]} input has {grid[0]}x{grid[1]} = {patches} patches of {patch} px "
                             "(window attention, or a different patch size?); vitviz shows global self-attention "
                             "over every token; if the patches are other than found (a convolutional stem before "
                             "them?), pass grid=(H, W) or image_size=N to vitviz.load(model)")
    prov.setdefault("grid", f"image size / patch size ({size[0]}x{size[1]} / {patch})")
    prefix = tokens - patches
    order, prov["token_order"] = _prefix_place(fixed if tokens == square[0] else None, prefix)
    return tokens, patch, grid, prefix, order


def _fixed_tokens(check: _Recorder | None, tokens: int) -> torch.Tensor | None:
    """(T,) bool: the tokens whose own score in the first layer is the same for two different images -- the prefix
    tokens (a patch token's query and key change with its pixels); None when the second probe did not run or the
    first layer's scores are not seen (nn.MultiheadAttention on a torch whose code cannot be followed)."""
    if check is None or not check.diags or check.diags[0] is None:
        return None
    d = check.diags[0]                                    # (2, H, T)
    if d.shape[-1] != tokens:
        return None
    a, b = d[0], d[1]
    finite = torch.isfinite(a) & torch.isfinite(b)
    same = (a - b).abs() <= 1e-4 * (1.0 + a.abs())
    return (same & finite).all(dim=0)


def _prefix_place(fixed: torch.Tensor | None, prefix: int) -> tuple[tuple[int, ...] | None, str]:
    """(token order, provenance): prefix tokens first, or last (shown first), as the first layer's scores show."""
    if prefix == 0:
        return None, "capture: no prefix tokens"
    if fixed is None:
        return None, "capture: prefix tokens first (the usual place; not measured: no batch of two, or no scores)"
    n = int(fixed.numel())
    if bool(fixed[:prefix].all()) and not bool(fixed[prefix:].any()):
        return None, (f"capture: the {prefix} prefix token(s) first: their own scores in the first layer do not "
                      "depend on the image")
    if bool(fixed[n - prefix:].all()) and not bool(fixed[:n - prefix].any()):
        return _prefix_first(n, prefix), (f"capture: the {prefix} prefix token(s) last in the module's sequence "
                                          "(their own scores in the first layer do not depend on the image); "
                                          "shown first, as for every model")
    return None, ("capture: prefix tokens first (the usual place; the first layer's scores did not single out "
                  f"{prefix} image-independent tokens at either end)")


def _patch_from_tokens(tokens: int, size: tuple[int, int], asked: Any, fixed: torch.Tensor | None,
                       module: nn.Module, prov: dict[str, str], source: str) -> tuple[int, int]:
    """(patch size, prefix count) of a module with no patch module: the tilings of the input size by square
    patches that leave at most 16 prefix tokens of T; the prefix count, when given or measured (tokens whose own
    first-layer score does not depend on the image, at either end), or the learned prefix parameters, pick one;
    several left is a question (grid=)."""
    h, w = size
    options = [(p, tokens - (h // p) * (w // p)) for p in range(2, min(h, w) + 1)
               if h % p == 0 and w % p == 0 and 0 <= tokens - (h // p) * (w // p) <= _PROBE_PREFIX]
    measured = None
    if fixed is not None:
        k = int(fixed.sum())
        if bool(fixed[:k].all()) or bool(fixed[fixed.numel() - k:].all()):
            measured = k
    why = ""
    if asked is not None:
        picked = [o for o in options if o[1] == int(asked)]
        why = f"num_prefix={asked} given"
        if not picked:
            raise LiveModelError(f"{source}: {tokens} tokens - {asked} prefix = {tokens - int(asked)} patches do not "
                                 f"tile a {h}x{w} image in square patches; pass grid=(rows, cols)")
    else:
        learned = sum(_prefix_params(module, _token_width(module)).values())
        picked = options if len(options) == 1 else []
        why = "the only tiling with at most 16 prefix tokens"
        if len(options) > 1 and measured is not None:
            picked, why = [o for o in options if o[1] == measured], (f"{measured} token(s) whose own first-layer "
                                                                     "score does not depend on the image")
        if len(options) > 1 and len(picked) != 1:
            picked, why = [o for o in options if o[1] == learned], f"{learned} learned prefix token(s)"
    if len(picked) != 1:
        shown = "; ".join(f"{h // p}x{w // p} patches of {p} px + {k} prefix" for p, k in options) or "none"
        raise LiveModelError(f"{source}: no patch embedding module found, and its attention's {tokens} tokens at "
                             f"{h}x{w} px fit {'several tilings' if options else 'no tiling'} ({shown}); pass "
                             "grid=(rows, cols) (--grid RxC) or num_prefix=")
    p, k = picked[0]
    prov["patch_size"] = (f"capture: {tokens} tokens at {h}x{w} px = {h // p}x{w // p} patches of {p} px + {k} "
                          f"prefix ({why}; no patch module: the patches are cut in the forward)")
    prov["grid"] = f"capture: {h // p}x{w // p} from the token count and the input size"
    return p, k


def _check_prefix(asked: Any, prefix: int, tokens: int, grid: tuple[int, int], source: str) -> None:
    if asked is not None and int(asked) != prefix:
        raise LiveModelError(f"{source}: num_prefix={asked} was given, but its attention runs over {tokens} tokens "
                             f"for {grid[0]}x{grid[1]} = {grid[0] * grid[1]} patches, so {prefix} prefix token(s)")


def _prefix_names(module: nn.Module, dim: int, prefix: int) -> list[str]:
    """Names for `prefix` leading tokens: 'cls', then 'dist' when the module has a distillation token, then
    registers."""
    if prefix <= 0:
        return []
    names = ["cls"]
    if prefix >= 2 and "dist" in _prefix_params(module, dim):
        names.append("dist")
    names += [f"reg{i}" for i in range(prefix - len(names))]
    return names


def _output_kind(main: torch.Tensor | None, what: str, recorder: _Recorder, overrides: Mapping[str, Any],
                 prov: dict[str, str]) -> tuple[str, int]:
    """('logits' | 'features' | 'none', num_classes): class scores when the output is HF `logits`, comes out of an
    nn.Linear (or is shaped like the last one's output: two heads averaged) that is not named a projection or an
    embedding, or as many labels were given; an embedding (unit-norm rows, a projection, `pooler_output`...) and
    anything else is features (no top-5 is made up from them)."""
    if main is None:
        prov["num_classes"] = "none: the forward returns no tensor"
        return "none", 0
    shape = tuple(main.shape)
    if main.dim() == 2:
        k = int(shape[1])
        last, name = recorder.last_linear, recorder.last_linear_name
        linear = isinstance(last, torch.Tensor) and (main is last or tuple(last.shape) == shape)
        labels = overrides.get("labels")
        unit = k > 1 and bool(torch.allclose(main.float().norm(dim=-1), torch.ones(()), atol=1e-3))
        if what == "logits" or (labels is not None and len(tuple(labels)) == k):
            src = "a classifier's 'logits'" if what == "logits" else f"{k} labels given"
            prov["num_classes"] = f"shape: {what} {shape} ({src})"
            return "logits", k
        if unit:
            prov["num_classes"] = f"features: {what} {shape} has rows of unit length: an embedding, not class scores"
            return "features", 0
        if linear and not _EMBEDDING_NAMES.search(name.rsplit(".", 1)[-1] or name) \
                and what.lower() not in _EMBEDDING_KEYS:
            prov["num_classes"] = f"shape: {what} {shape} from an nn.Linear ({name})"
            return "logits", k
        if linear:
            prov["num_classes"] = (f"features: {what} {shape} from {name}, named as a projection or embedding, not a "
                                   "classifier (pass labels= with one name per output to read it as class scores)")
            return "features", 0
    if main.dim() in (2, 3):
        pooled = "" if main.dim() == 2 else "; token 0 (or the mean without prefix tokens) is taken as the image's"
        prov["num_classes"] = f"features: {what} {shape} is not a classifier's output{pooled}"
        return "features", 0
    prov["num_classes"] = f"none: {what} of shape {shape}"
    return "none", 0


def _preprocess(module: nn.Module, size: tuple[int, int], in_chans: int, overrides: Mapping[str, Any],
                prov: dict[str, str]) -> Preprocess:
    pcfg = getattr(module, "pretrained_cfg", None)
    if isinstance(module, PackedTower):
        pp = Preprocess(crop=size, resize=min(size), mode="squash", interpolation="bicubic", mean=module.mean,
                        std=module.std)
        src = (f"{module.stats_source}; the image resized to {size[0]}x{size[1]} as a whole (its processor keeps "
               "the aspect ratio in whole merge blocks)")
    elif isinstance(pcfg, dict) and pcfg.get("mean") and pcfg.get("std"):
        pp = Preprocess.from_timm_cfg(pcfg, size)
        src = "metadata: the model's pretrained_cfg (timm)"
    elif _clip_statistics(module) is not None:
        cfg = _clip_statistics(module) or {}
        pp = Preprocess(crop=size, resize=min(size), mode="squash" if cfg.get("resize_mode") == "squash" else "center",
                        interpolation=str(cfg.get("interpolation", "bicubic")), mean=tuple(cfg["mean"]),
                        std=tuple(cfg["std"]))
        src = "metadata: the model's preprocess_cfg / image_mean, image_std (open_clip)"
    elif in_chans == 3 and min(size) >= 64:
        pp = Preprocess(crop=size, resize=int(math.floor(min(size) / 0.875)), mode="center",
                        interpolation="bicubic", mean=IMAGENET_MEAN, std=IMAGENET_STD)
        src = "guess: an RGB model of ImageNet size: ImageNet mean/std, center crop 0.875"
    else:
        pp = Preprocess(crop=size, resize=min(size), mode="squash", interpolation="bilinear",
                        mean=(0.0,) * in_chans, std=(1.0,) * in_chans)
        what = f"a {in_chans}-channel" if in_chans != 3 else f"an RGB {size[0]}x{size[1]} px"
        src = (f"guess: {what} model is not an ImageNet model, so no ImageNet statistics: pixels only scaled to "
               f"[0, 1] (mean 0, std 1); the image resized to {size[0]}x{size[1]} as a whole (no crop)")
    pp, changed = pp.with_overrides(overrides, in_chans)
    src = Preprocess.overridden_source(src, changed)
    prov["preprocess"] = src
    return pp


def _clip_statistics(module: nn.Module) -> dict[str, Any] | None:
    """open_clip's preprocessing on the model: `preprocess_cfg` (mean, std, interpolation, resize_mode) or the
    legacy `image_mean`/`image_std` attributes; None when it states none."""
    cfg = getattr(module, "preprocess_cfg", None)
    if isinstance(cfg, dict) and cfg.get("mean") and cfg.get("std"):
        return cfg
    mean, std = getattr(module, "image_mean", None), getattr(module, "image_std", None)
    if isinstance(mean, (tuple, list)) and isinstance(std, (tuple, list)) and mean and std:
        return {"mean": mean, "std": std}
    return None


def _labels(module: nn.Module, overrides: Mapping[str, Any], num_classes: int, prov: dict[str, str]) -> tuple[str, ...]:
    id2label = getattr(getattr(module, "config", None), "id2label", None)
    candidates: list[tuple[Any, str]] = [(overrides.get("labels"), "override")]
    if isinstance(id2label, dict) and not all(str(v) == f"LABEL_{k}" for k, v in id2label.items()):
        candidates.append(([id2label[k] for k in sorted(id2label, key=int)], "metadata: config.id2label"))
    for labels, src in candidates:
        if labels:
            labels = tuple(labels.values()) if isinstance(labels, dict) else tuple(map(str, labels))
            if len(labels) == num_classes:
                prov["labels"] = src
                return labels
    if num_classes == 1000:
        prov["labels"] = "guess: 1000 classes -> ImageNet-1k names"
        return imagenet_labels()
    prov["labels"] = "none"
    return ()


def _unsure(source: str, recorder: _Recorder, heads: int | None) -> tuple[str, str, str]:
    """The refusal of 2-D (T, T) softmaxes the probe saw but could not group into layers of heads: (what it saw,
    where and why; what would open the model with its code; the weights file's route)."""
    seen = "; ".join(f"{n} softmaxes of shape {shape} in {where} ({why})" for where, n, shape, why in
                     recorder.unsure[:3])
    if heads:
        step = (f"heads={heads} was given, but the maps do not divide into layers of {heads} heads: check the head "
                "count")
    else:
        n = recorder.unsure[0][1]
        splits = [h for h in range(1, n + 1) if n % h == 0 and h < n][:6]
        step = ("pass heads=N (CLI --heads N), the heads of one layer: each N consecutive maps (per image) are then "
                f"one layer, N one of {', '.join(map(str, splits))}" if splits else "pass heads=N (CLI --heads N)")
    return (f"{source}: saw attention but could not tell its maps apart as the heads of one layer: {seen}.",
            f"{step}; or compute each block's attention inside its own module (an attention nn.Module called "
            "once per block), which vitviz groups by itself",
            "open the weights file without code= (vitviz.load(path)), which reads per-head layouts from the tensors")


def _not_shown(recorder: _Recorder, skipped: list[tuple[str, str, tuple[int, ...]]], tokens: int) -> list[str]:
    """Attention of many queries the shown layers leave out -- inside windows, over other stages' token counts,
    over spatially reduced keys -- said (a pooling query or a class-attention layer's few queries are not)."""
    many = [f"{name} {shape}" for name, _mech, shape in skipped
            if len(shape) >= 2 and shape[-2] > _JOIN_MAX and tuple(shape[-2:]) != (tokens, tokens)]
    many += [f"{name} {shape} (inside windows)" for name, shape in recorder.windowed]
    if not many:
        return []
    return [f"only the attention over the {tokens} tokens of the layers shown is shown; {len(many)} other "
            f"attention call(s) are not: {'; '.join(many[:4])}{' ...' if len(many) > 4 else ''} (other stages "
            "at other resolutions, windows, or keys reduced in number)"]


def _only_windows(source: str, recorder: _Recorder) -> tuple[str, str, str]:
    """(what the probe saw when all its attention is computed inside windows, the step, the file's route)."""
    seen = "; ".join(f"{name} {shape}" for name, shape in recorder.windowed[:4]) + \
        (f" and {len(recorder.windowed) - 4} more" if len(recorder.windowed) > 4 else "")
    return (f"{source}: all its attention is computed inside windows -- (B, heads, windows, queries, keys) per "
            f"block: {seen} -- mask-unit or window attention (Hiera), some with pooled queries; no layer attends "
            "over the image's tokens as a whole, so there is no (T, T) map of the image to show, and vitviz does "
            "not yet show the windows of a model run by its own code.",
            "vitviz shows windowed attention per stage for the windowed models it reads by file (Swin v1 / v2, "
            "SAM / ViTDet); for this model class there is no route yet", "")


def _nothing_seen(source: str, shape: tuple[int, ...], recorder: _Recorder) -> tuple[str, str, str]:
    """(what the probe saw when it saw no self-attention; what would let the live path see it; the weights file's
    route)."""
    calls = ", ".join(f"{n} {m} call(s)" for m, n in recorder.calls.items()) or "no attention calls at all"
    other = f"; softmax over other shapes: {sorted(set(recorder.other_softmax))[:4]}" if recorder.other_softmax else ""
    seen = (f"{source}: no self-attention was seen in its forward pass of a {shape} input. vitviz watched for "
            "nn.MultiheadAttention calls (weights per head), F.scaled_dot_product_attention calls (probabilities "
            "recomputed from q, k and the mask) and softmax over the keys of scores with two token axes ((B, H, T, "
            "T), one head's (B, T, T), (B*H, T, T), one image's one head (T, T), or the token axes elsewhere, as "
            f"(T, T, B, H)); it saw {calls}{other}. {_skipped_summary(recorder.skipped)} Attention computed by "
            "xformers, flash-attn, TorchScript or another fused kernel cannot be seen.").replace("  ", " ")
    step = ("if it is a Vision Transformer whose attention runs in a kernel vitviz cannot see, build it with plain "
            "attention (F.scaled_dot_product_attention, nn.MultiheadAttention or a softmax over the keys of its "
            "scores; many models have an 'eager' or 'math' attention option); if it is not a Vision Transformer, "
            "vitviz has nothing to show")
    file_step = ("open its weights file by itself (vitviz.load(path) without code=; CLI without --code), which reads "
                 "the layout from the tensors (per-head q/k/v modules included)")
    return seen, step, file_step
