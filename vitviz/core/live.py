"""The live-module path: run the user's own `nn.Module` unchanged and capture the attention its code computes.

    model = vitviz.load(my_vit, live=True)     # any nn.Module -> LiveModel (a VitModel: run, forward_captured...)
    result = model.run("cat.jpg")               # AttentionResult with (L, H, T, T) attentions, as for a file
    model.layers                                # [('blocks.0.attn', 'scaled_dot_product_attention'), ...]

For models a checkpoint file cannot describe, the user has the model's code. Attention is seen where that code
computes it, by one `TorchFunctionMode` (thread-local: other threads running the same module are not affected):

- `nn.MultiheadAttention` (`F.multi_head_attention_forward`): per-head weights. A caller that asks for weights gets
  them computed per head (averaged afterwards when it asked for the average, as torch does); a caller that passes
  `need_weights=False` keeps its own SDPA path and output, and the probabilities are recomputed from the q and k that
  path hands to SDPA (when this torch's code cannot be followed, the weights are forced instead).
- `F.scaled_dot_product_attention`: the module gets its own SDPA output; `softmax(q k^T * scale + mask)` is
  recomputed in float32 from the same q, k, mask (bool or float), scale, `is_causal` and `enable_gqa`.
- an explicit softmax over the last axis of a 4-D (B, H, T, T) score tensor (`F.softmax`, `torch.softmax`,
  `Tensor.softmax`, `nn.Softmax`): its own output is copied.

The mode also turns off PyTorch's fused `TransformerEncoderLayer` / `MultiheadAttention` fast paths for the captured
forward only (they check for torch-function overrides and step aside), so attention computed there is seen too.
Which mechanism found which layer is reported (`LiveModel.layers`); a forward in which no attention is seen raises
`NoAttentionError` saying what was tried. The layer's module is read from the call stack when attention is found
(no hook on every module, so the forward pass runs at full speed). The mode (and the probe's hooks) are installed in
a context manager and removed in `finally`; the model runs in eval mode for the capture and gets its own train/eval
flags back afterwards.

Tokens, grid and prefix count come from the patch embedding (a Conv2d whose stride equals its kernel, or a
Rearrange/Unfold of patches followed by a Linear) and the attention's T, measured on one probe forward pass at
load; `grid=`, `num_prefix=`, `image_size=`, `mean=`/`std=` override them.

`--code FILE.py:FACTORY` (`load_code`) imports a user's file and calls its factory: that runs the file's code, so it
only happens when the user asks for it; the weights file itself is read with `weights_only=True`, never executed.
"""
from __future__ import annotations

import importlib.util
import inspect
import math
import re
import sys
import threading
import types
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from vitviz.core.capture import LayerSink, VitModel
from vitviz.core.checkpoint import read_checkpoint
from vitviz.core.hyperparams import imagenet_labels, warn_guesses
from vitviz.core.posembed import resample_pos_embed
from vitviz.core.runtime import SMALLER, check_host_memory, resolve_device
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD, ModelSpec, Preprocess, whole_patches
from vitviz.errors import DeviceError, VitvizError

MHA = "nn.MultiheadAttention"
SDPA = "scaled_dot_product_attention"
SOFTMAX = "softmax"

# Overrides only the live path takes (the others are `hyperparams.OVERRIDES`).
LIVE_OVERRIDES = ("live", "code", "grid", "num_prefix")

_SDPA_FN = F.scaled_dot_product_attention
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS: dict[str, Any] = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                                  "enable_gqa": False}
_SOFTMAX_FNS = frozenset({F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax})
_MHA_FN = F.multi_head_attention_forward
_MHA_SIGNATURE = inspect.signature(_MHA_FN)
# Modules that never own attention: a softmax inside one is credited to the module around it.
_HELPERS = (nn.Softmax, nn.modules.dropout._DropoutNd, nn.Identity)
_MAX_PREFIX = 64   # more "prefix" tokens than this means the grid is wrong, not that there are 65 registers


class LiveModelError(VitvizError):
    """A model object the live path cannot run or describe (its forward fails, its grid cannot be found...)."""


class NoAttentionError(LiveModelError):
    """A forward pass in which no self-attention over the image tokens was seen."""


class UserCodeError(VitvizError):
    """`code=FILE.py:FACTORY`: the file could not be imported, the factory not found or called, or the weights
    file does not fit the model it returned."""


class _StopForward(BaseException):
    """Raised inside the user's forward once the last wanted layer is captured (`logits=False`). A BaseException,
    so that a model's own `except Exception` does not swallow it."""


# ---------------------------------------------------------------------------------------------------------------
# The probabilities of an SDPA call


def sdpa_probabilities(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None = None,
                       is_causal: bool = False, scale: float | None = None,
                       enable_gqa: bool = False) -> torch.Tensor:
    """The attention probabilities `F.scaled_dot_product_attention` applies, in float32: (..., L, S).

    `softmax(q k^T * scale + bias)` with scale 1/sqrt(E) by default; a bool mask keeps the True positions, a float
    mask is added; `is_causal` keeps the lower triangle (top-left aligned); `enable_gqa` repeats the key heads.
    A row with every position masked has no distribution and comes back as zeros.
    """
    q, k = query.float(), key.float()
    if enable_gqa and k.dim() >= 3 and k.size(-3) != q.size(-3):
        k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)
    factor = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    scores = torch.matmul(q, k.transpose(-2, -1)).mul_(factor)  # (..., L, S)
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores.masked_fill_(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.float()
    return torch.softmax(scores, dim=-1).nan_to_num_(0.0)


# ---------------------------------------------------------------------------------------------------------------
# What one captured forward pass saw


class _Recorder:
    """Collects the attention of one forward pass and knows which module is running.

    Args:
        batch: the input's batch size (3-D probabilities (B*H, L, S) are viewed as (B, H, L, S)).
        tokens: keep only self-attention over this many tokens (None: every square map, for the probe).
        keep: called with each kept (B, H, T, T) map; None stores them in `maps`.
        capacity: how many layers `keep` can take; more is an error after the pass.
        stop: stop the forward pass (`_StopForward`) once this many layers are kept.
    """

    def __init__(self, batch: int, tokens: int | None = None, keep: Callable[[torch.Tensor], None] | None = None,
                 capacity: int | None = None, stop: int | None = None, heads: int | None = None) -> None:
        self.batch, self.tokens, self.capacity, self.stop, self.heads = batch, tokens, capacity, stop, heads
        self.keep = keep
        self.maps: list[torch.Tensor] = []
        self.layers: list[tuple[str, str]] = []
        self.skipped: list[tuple[str, str, tuple[int, ...]]] = []
        self.calls: Counter[str] = Counter()
        self.other_softmax: list[tuple[int, ...]] = []
        self.extra = 0
        self.notes: list[str] = []
        self.names: dict[int, str] = {}
        self.last_linear: torch.Tensor | None = None

    def where(self) -> str:
        """The innermost running module that can own attention (a Softmax/Dropout credits its parent): the first
        frame up this thread's call stack whose `self` is one of the model's modules. Read only when attention is
        found, so the forward pass runs without a hook on every module."""
        frame = sys._getframe(1)
        while frame is not None:
            owner = frame.f_locals.get("self")
            name = self.names.get(id(owner))
            if name is not None and not isinstance(owner, _HELPERS):
                return name or "(top level)"
            frame = frame.f_back
        return "(top level)"

    def wants(self, length: int, source: int) -> bool:
        return length == source and (self.tokens is None or length == self.tokens)

    def skip(self, mechanism: str, shape: tuple[int, ...]) -> None:
        self.skipped.append((self.where(), mechanism, shape))

    def add(self, mechanism: str, probs: torch.Tensor) -> None:
        """Keep one layer's probabilities (B, H, T, T) (or (B*H, T, T), or unbatched (H, T, T))."""
        length, source = int(probs.shape[-2]), int(probs.shape[-1])
        if probs.dim() != 4:
            probs = probs.reshape(self.batch, -1, length, source)
        if not self.wants(length, source):
            self.skip(mechanism, tuple(probs.shape))
            return
        if self.capacity is not None and len(self.layers) >= self.capacity:
            self.extra += 1
            return
        name = self.where()
        if self.heads is not None and probs.shape[1] != self.heads:
            raise LiveModelError(f"{name} ({mechanism}) has {probs.shape[1]} heads, where the model had {self.heads} "
                                 "when it was loaded; vitviz needs the same head count in every layer")
        self.layers.append((name, mechanism))
        if self.keep is None:
            self.maps.append(probs.detach().float().clone())
        else:
            self.keep(probs.detach())
        if self.stop is not None and len(self.layers) >= self.stop:
            raise _StopForward

    # the three mechanisms
    def softmax(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        x = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor):
            return
        if x.dim() != 4 or dim not in (-1, 3):
            self.other_softmax.append(tuple(x.shape))
            return
        self.calls[SOFTMAX] += 1
        self.add(SOFTMAX, out)

    def sdpa(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             mechanism: str) -> Any:
        out = func(*args, **kwargs)  # the module's own output, untouched
        p = {**_SDPA_DEFAULTS, **dict(zip(_SDPA_ARGS, args)), **kwargs}
        q, k = p["query"], p["key"]
        self.calls[mechanism] += 1
        if not self.wants(int(q.shape[-2]), int(k.shape[-2])):
            self.skip(mechanism, (*q.shape[:-1], int(k.shape[-2])))
            return out
        if p["dropout_p"] and not any("dropout" in n for n in self.notes):
            self.notes.append(f"{self.where()} passes dropout_p={p['dropout_p']} to SDPA in eval mode: its output "
                              "is randomised; the captured probabilities are before dropout")
        self.add(mechanism, sdpa_probabilities(q, k, p["attn_mask"], bool(p["is_causal"]), p["scale"],
                                               bool(p["enable_gqa"])))
        return out

    def mha(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = _MHA_SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        need, average = bool(a["need_weights"]), bool(a["average_attn_weights"])
        through_sdpa = _mha_through_sdpa()
        if not need and through_sdpa is not None:
            # torch's own code path, with its SDPA call recorded: the output stays exactly the module's
            _ACTIVE.recorder = self
            try:
                return through_sdpa(*bound.args, **bound.kwargs)
            finally:
                _ACTIVE.recorder = None
        a["need_weights"], a["average_attn_weights"] = True, False
        out, weights = _MHA_FN(*bound.args, **bound.kwargs)
        self.calls[MHA] += 1
        self.add(MHA, weights if weights.dim() == 4 else weights.unsqueeze(0))
        if not need:
            return out, None
        return out, weights.mean(dim=-3) if average else weights


class _Active(threading.local):
    recorder: _Recorder | None = None


_ACTIVE = _Active()
_MHA_CLONE: list[Callable[..., Any] | None] = []


def _sdpa_inside_mha(*args: Any, **kwargs: Any) -> Any:
    recorder = _ACTIVE.recorder
    if recorder is None:
        return _SDPA_FN(*args, **kwargs)
    return recorder.sdpa(_SDPA_FN, args, kwargs, MHA)


def _mha_through_sdpa() -> Callable[..., Any] | None:
    """torch's own `F.multi_head_attention_forward`, run with its SDPA call going through the recorder (the same
    code object with two globals swapped: no torch-function re-dispatch, SDPA recorded). None when this torch's
    function does not call SDPA by that name; callers then force `need_weights=True`."""
    if not _MHA_CLONE:
        fn = _MHA_FN
        names = fn.__code__.co_names
        clone = None
        if "scaled_dot_product_attention" in names and "has_torch_function" in names and fn.__closure__ is None:
            scope = dict(fn.__globals__)
            scope["has_torch_function"] = lambda *_args: False
            scope["scaled_dot_product_attention"] = _sdpa_inside_mha
            clone = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__)
            clone.__kwdefaults__ = fn.__kwdefaults__
        _MHA_CLONE.append(clone)
    return _MHA_CLONE[0]


class _AttentionMode(TorchFunctionMode):
    """Sees every torch call of the forward pass; hands the attention ones to the recorder, runs the rest as is."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _SOFTMAX_FNS:
            out = func(*args, **kwargs)
            self.recorder.softmax(args, kwargs, out)
            return out
        if func is _SDPA_FN:
            return self.recorder.sdpa(func, args, kwargs, SDPA)
        if func is _MHA_FN:
            return self.recorder.mha(args, kwargs)
        return func(*args, **kwargs)


@contextmanager
def _evaluating(module: nn.Module) -> Iterator[None]:
    """Eval mode for the capture; every submodule gets its own training flag back afterwards."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, flag in flags:
            m.training = flag


@contextmanager
def watch_attention(module: nn.Module, recorder: _Recorder, last_linear: bool = False) -> Iterator[_Recorder]:
    """While open, every attention computed by `module`'s forward (in this thread) goes to `recorder`, credited to
    the module that computes it. With `last_linear` (the probe), a hook on each nn.Linear keeps the last output in
    `recorder.last_linear`. The mode and hooks are removed, and train/eval flags restored, in `finally`."""
    recorder.names = {id(m): name for name, m in module.named_modules()}
    handles = []
    try:
        if last_linear:
            handles = [m.register_forward_hook(partial(_keep_output, recorder)) for m in module.modules()
                       if isinstance(m, nn.Linear)]
        with _evaluating(module), _AttentionMode(recorder):
            yield recorder
    finally:
        for h in handles:
            h.remove()


def _keep_output(recorder: _Recorder, _module: nn.Module, _args: Any, output: Any) -> None:
    recorder.last_linear = output


def _run(module: nn.Module, x: torch.Tensor, recorder: _Recorder, last_linear: bool = False) -> Any:
    """The module's own forward of `x` under capture; None when it was stopped after the last wanted layer."""
    try:
        with watch_attention(module, recorder, last_linear):
            return module(x)
    except _StopForward:
        return None


# ---------------------------------------------------------------------------------------------------------------
# What the module is: patch embedding, position table, output


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
    '(h p1) (w p2)' / an Unfold with stride == kernel followed by a Linear over the flattened patches."""
    mods = list(module.named_modules())
    for i, (name, m) in enumerate(mods):
        if isinstance(m, nn.Conv2d) and tuple(m.kernel_size) == tuple(m.stride) and min(m.kernel_size) > 1 \
                and m.groups == 1 and tuple(m.dilation) == (1, 1) and m.padding in ((0, 0), "valid"):
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


def _pos_table(module: nn.Module, dim: int) -> tuple[str, int] | None:
    """(name, rows) of a learned position table: a (N, D) or (1, N, D) parameter or buffer whose name says 'pos'."""
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if "pos" in name.lower() and dim and (t.dim() == 2 or (t.dim() == 3 and t.shape[0] == 1)) \
                and t.shape[-1] == dim and t.shape[-2] > 1:
            return name, int(t.shape[-2])
    return None


def _prefix_params(module: nn.Module, dim: int) -> dict[str, int]:
    """Learned prefix tokens by kind ('cls', 'dist', 'reg') with their row counts, from parameter names."""
    found: dict[str, int] = {}
    for name, p in module.named_parameters():
        leaf = name.rsplit(".", 1)[-1].lower()
        if not dim or p.shape[-1] != dim:
            continue
        kind = "dist" if "dist" in leaf else "reg" if "reg" in leaf else "cls" if \
            leaf in ("cls", "cls_token", "class_token", "class_embedding", "cls_embedding") else None
        if kind:
            found[kind] = found.get(kind, 0) + p.numel() // dim
    return found


def _size_attribute(module: nn.Module, embed: PatchEmbedding | None) -> tuple[tuple[int, int], str] | None:
    """The input size a module states: `img_size`/`image_size` on it, its patch embedding (or that one's parent),
    or `config.image_size`."""
    places: list[tuple[str, Any]] = [("", module)]
    if embed is not None:
        parent = embed.name.rsplit(".", 1)[0] if "." in embed.name else ""
        places += [(embed.name, module.get_submodule(embed.name)), (parent, module.get_submodule(parent))]
    for where, obj in places:
        for attr in ("img_size", "image_size"):
            size = _as_size(getattr(obj, attr, None))
            if size:
                return size, f"attribute: {where + '.' if where else ''}{attr}"
    size = _as_size(getattr(getattr(module, "config", None), "image_size", None))
    return (size, "metadata: config.image_size") if size else None


def _as_size(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int) and value > 0:
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return (int(value[0]), int(value[1]))
    return None


def _main_output(out: Any) -> tuple[torch.Tensor | None, str]:
    """The tensor of a forward's result that vitviz shows, and what it is: a tensor, HF `logits`, HF
    `pooler_output`/`image_embeds`/`last_hidden_state`, or the first tensor of a tuple."""
    if isinstance(out, torch.Tensor):
        return out, "output"
    get = out.get if isinstance(out, Mapping) else partial(getattr, out)
    for key in ("logits", "image_embeds", "pooler_output", "last_hidden_state"):
        value = get(key, None)
        if isinstance(value, torch.Tensor):
            return value, key
    if isinstance(out, (tuple, list)):
        return next(((t, f"output[{i}]") for i, t in enumerate(out) if isinstance(t, torch.Tensor)), (None, ""))
    return None, ""


def _per_image(t: torch.Tensor | None, batch: int, num_prefix: int) -> torch.Tensor:
    """(B, K) from a forward's main tensor: (B, K) as is, token features (B, N, D) pooled (token 0 with a prefix
    token, else the mean); anything else gives (B, 0)."""
    if t is None:
        return torch.zeros(batch, 0)
    if t.dim() == 3 and t.shape[0] == batch:
        return t[:, 0] if num_prefix else t.mean(dim=1)
    if t.dim() == 2 and t.shape[0] == batch:
        return t
    return torch.zeros(batch, 0)


# ---------------------------------------------------------------------------------------------------------------
# The model


class LiveModel(VitModel):
    """A user's `nn.Module`, run as written, with its attention captured (see the module docstring).

    `net` is the user's module itself. `layers` lists (module name, mechanism) per captured layer in the order the
    forward pass computes them; `skipped` lists attention calls that are not self-attention over all the image
    tokens (cross-attention, attention pooling, windows), as (module name, mechanism, shape).
    """

    def __init__(self, module: nn.Module, spec: ModelSpec, device: torch.device, layers: list[tuple[str, str]],
                 skipped: list[tuple[str, str, tuple[int, ...]]], output: str, pos_name: str | None) -> None:
        super().__init__(module, spec, device, [])  # type: ignore[arg-type]  # any nn.Module, not a ReferenceViT
        self.layers, self.skipped = layers, skipped
        self._output, self._pos_name = output, pos_name

    def to(self, device: str | None) -> "LiveModel":
        """Move the user's module (never prepacked: its Linear layers are its own)."""
        self._move(device)
        return self

    @property
    def _dtype(self) -> torch.dtype:
        return next((p.dtype for p in self.net.parameters() if p.is_floating_point()), torch.float32)

    def forward_captured(self, x: torch.Tensor, half: bool = False, logits: bool = True,
                         upto: int | None = None, rows: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(B, C, H, W) -> attentions (B, L, H, T, T) and the model's output (B, K), as `VitModel.forward_captured`.

        With `logits=False` the module's forward pass is stopped right after the attention of layer `upto`.
        """
        with self._lock, torch.inference_mode():
            return self._forward_live(x, half, logits, upto, rows)

    def _forward_live(self, x: torch.Tensor, half: bool, logits: bool, upto: int | None,
                      rows: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
        if logits and upto is not None:
            raise VitvizError("upto= stops the forward pass early, so it needs logits=False")
        depth = self.spec.depth
        upto = upto + depth if upto is not None and -depth <= upto < 0 else upto
        if upto is not None and not 0 <= upto < depth:
            raise VitvizError(f"upto={upto}: expected a layer in 0..{depth - 1} (or -{depth}..-1)")
        tokens = self._tokens(x)
        if rows is not None and (not rows or not all(0 <= int(r) < tokens for r in rows)):
            raise VitvizError(f"rows {list(rows)}: expected token indices in 0..{tokens - 1} (the input has "
                              f"{tokens} tokens)")
        count = depth if upto is None else upto + 1
        sink = LayerSink(count, half, rows)
        check_host_memory(self._maps_bytes(x, count, half, None if rows is None else len(rows)), x, half)
        recorder = _Recorder(int(x.shape[0]), tokens, sink.append, count, None if logits else count,
                             self.spec.num_heads)
        try:
            out = _run(self.net, x.to(self._device, self._dtype), recorder)
        except torch.cuda.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            raise DeviceError(f"out of memory on {self._device} for input {tuple(x.shape)} ({e}); try a smaller "
                              "image size or device='cpu'") from e
        except VitvizError:
            raise
        except MemoryError as e:
            raise DeviceError(f"not enough memory for input {tuple(x.shape)} ({e}); {SMALLER}") from e
        except Exception as e:  # noqa: BLE001 - the user's code failed: say so, with its error as the cause
            raise LiveModelError(f"{self.spec.source}: the model's own forward failed on input {tuple(x.shape)} "
                                 f"({type(e).__name__}: {e})") from e
        if len(recorder.layers) != count or recorder.extra:
            seen = len(recorder.layers) + recorder.extra
            raise LiveModelError(f"{self.spec.source}: this forward pass computed {seen} attention maps over "
                                 f"{tokens} tokens; {count} expected ({depth} when the model was loaded: "
                                 f"{_layer_summary(self.layers)}). {_skipped_summary(recorder.skipped)}")
        if not logits:
            return sink.numpy(), np.zeros((x.shape[0], 0), np.float32)
        main = _main_output(out)[0] if self._output != "none" else None
        result = _per_image(main, int(x.shape[0]), self.spec.num_prefix)
        return sink.numpy(), result.detach().float().cpu().numpy()

    def pos_embed(self, grid: tuple[int, int] | None = None) -> np.ndarray | None:
        """(N_pos, D) the module's learned position table (grid part resampled to `grid`); None without one."""
        if self._pos_name is None:
            return None
        owner, _, leaf = self._pos_name.rpartition(".")
        table = getattr(self.net.get_submodule(owner), leaf)
        g = tuple(grid or self.spec.pos_grid)
        with torch.no_grad():
            pos = table.detach().float().cpu().reshape(1, -1, table.shape[-1])
            if g != tuple(self.spec.pos_grid):
                pos = resample_pos_embed(pos, self.spec.pos_prefix, tuple(self.spec.pos_grid), g, self.spec.pos_interp)
        return pos[0].numpy()


def _layer_summary(layers: Sequence[tuple[str, str]]) -> str:
    """'12 x softmax (transformer.layers.0.0 ... transformer.layers.11.0)'."""
    if not layers:
        return "none"
    parts = []
    for mech, n in Counter(m for _, m in layers).items():
        names = [name for name, m in layers if m == mech]
        span = names[0] if len(names) == 1 else f"{names[0]} ... {names[-1]}"
        parts.append(f"{n} x {mech} ({span})")
    return ", ".join(parts)


def _skipped_summary(skipped: Sequence[tuple[str, str, tuple[int, ...]]]) -> str:
    if not skipped:
        return ""
    shown = "; ".join(f"{name} {mech} {shape}" for name, mech, shape in skipped[:4])
    more = f" and {len(skipped) - 4} more" if len(skipped) > 4 else ""
    return f"Not self-attention over all the tokens (not shown): {shown}{more}."


# ---------------------------------------------------------------------------------------------------------------
# Loading


def load_live(module: nn.Module, overrides: Mapping[str, Any], source: str | None = None,
              how: str = "") -> LiveModel:
    """Describe `module` by one probe forward pass and wrap it as a `LiveModel`.

    Args:
        module: any nn.Module taking a (B, C, H, W) image batch; it is used (and moved to `device`) in place.
        overrides: grid ((rows, cols) or N), num_prefix, image_size, heads (checked), mean, std, interpolation,
            resize, crop_mode, labels, device (default: where the module is).
        source: what to call it (default '<ClassName object>').
        how: why the live path is used, for the provenance.
    """
    source = source or f"<{type(module).__name__} object>"
    prov: dict[str, str] = {}
    device = _place(module, overrides.get("device"), source)
    embed = find_patch_embedding(module)
    size, patch = _geometry(module, embed, overrides, prov, source)
    in_chans = embed.in_chans if embed else 3
    prov["in_chans"] = f"shape: {embed.describe()}" if embed else "default"
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    probe = torch.zeros(1, in_chans, *size, device=device, dtype=dtype)
    recorder = _Recorder(1)
    with torch.inference_mode():
        try:
            out = _run(module, probe, recorder, last_linear=True)
        except VitvizError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's code failed: say so, with its error as the cause
            raise LiveModelError(f"{source}: its forward failed on a probe input of shape {tuple(probe.shape)} "
                                 f"({type(e).__name__}: {e}); pass image_size= (and grid=) for the input it "
                                 "expects") from e
    if not recorder.layers:
        raise NoAttentionError(_nothing_seen(source, tuple(probe.shape), recorder))
    tokens, patch, grid = _tokens(recorder, size, patch, overrides, prov, source)
    prefix = tokens - grid[0] * grid[1]
    _check_prefix(overrides.get("num_prefix"), prefix, tokens, grid, source)
    kept = [(layer, m) for layer, m in zip(recorder.layers, recorder.maps) if m.shape[-1] == tokens]
    layers = [layer for layer, _ in kept]
    skipped = recorder.skipped + [(n, mech, tuple(m.shape)) for (n, mech), m in zip(recorder.layers, recorder.maps)
                                  if m.shape[-1] != tokens]
    heads = {int(m.shape[1]) for _, m in kept}
    if len(heads) > 1:
        raise LiveModelError(f"{source}: the attention layers have different head counts {sorted(heads)}; vitviz "
                             "needs one head count for every layer")
    num_heads = heads.pop()
    if overrides.get("heads") and int(overrides["heads"]) != num_heads:
        raise LiveModelError(f"{source}: heads={overrides['heads']} was given, but its attention has {num_heads} "
                             f"heads ({_layer_summary(layers)})")
    prov["num_heads"] = f"capture: attention maps of shape {tuple(kept[0][1].shape)}"
    prov["depth"] = f"capture: {_layer_summary(layers)}"
    names = _prefix_names(module, embed.dim if embed else 0, prefix)
    prov["num_prefix"] = (f"capture: T={tokens} tokens - {grid[0]}x{grid[1]} patches = {prefix} prefix token(s), "
                          f"taken as {', '.join(names) or 'none'} (first in the sequence)")
    main, what = _main_output(out)
    kind, num_classes = _output_kind(main, what, recorder.last_linear, prov)
    dim = embed.dim if embed else 0
    prov["embed_dim"] = f"shape: {embed.describe()}" if embed else "unknown: no patch embedding found"
    pos = _pos_table(module, dim)
    pos_prefix = 0
    if pos is not None and pos[1] in (tokens, grid[0] * grid[1]):
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
    prov["path"] = (f"live: {type(module).__name__}'s own forward runs; attention captured from "
                    f"{', '.join(f'{n} x {m}' for m, n in counts.items())}" + (f" ({how})" if how else "")
                    + ("; " + "; ".join(recorder.notes) if recorder.notes else ""))
    spec = ModelSpec(
        family="live", source=source, image_size=size, patch_size=patch, embed_dim=dim, depth=len(layers),
        num_heads=num_heads, in_chans=in_chans, num_classes=num_classes, cls_token="cls" in names,
        dist_token="dist" in names, reg_tokens=sum(n.startswith("reg") for n in names), pos_embed=pos is not None,
        pos_prefix=pos_prefix, pos_grid=grid, preprocess=pp, labels=labels,
        num_params=sum(p.numel() for p in module.parameters()), provenance=tuple(prov.items()))
    warn_guesses(spec)  # what nothing in the module stated (preprocessing, input size), said loudly
    return LiveModel(module, spec, device, layers, skipped, kind, pos[0] if pos else None)


def _place(module: nn.Module, device: str | None, source: str) -> torch.device:
    """Move the module when a device is asked for; else it stays where it is."""
    here = next((p.device for p in module.parameters()), torch.device("cpu"))
    if device is None:
        return here
    dev = resolve_device(device)
    try:
        module.to(dev)
    except torch.cuda.OutOfMemoryError as e:
        module.to(here)
        torch.cuda.empty_cache()
        raise DeviceError(f"{source}: does not fit on {dev} ({e}); use device='cpu'") from e
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


def _geometry(module: nn.Module, embed: PatchEmbedding | None, overrides: Mapping[str, Any],
              prov: dict[str, str], source: str) -> tuple[tuple[int, int], int | None]:
    """The input size to probe with and the patch size (None when it must come from the token count)."""
    patch: int | None = None
    if embed is not None:
        if embed.patch[0] != embed.patch[1]:
            raise LiveModelError(f"{source}: {embed.describe()} has non-square patches; vitviz supports square "
                                 "patches only")
        patch = embed.patch[0]
        prov["patch_size"] = f"shape: {embed.describe()}"
    grid = _pair(overrides["grid"], "grid") if overrides.get("grid") is not None else None
    if overrides.get("image_size"):
        size = _pair(overrides["image_size"], "image_size")
        if patch is not None:
            whole = whole_patches(size, patch)
            if min(whole) == 0:
                raise LiveModelError(f"image_size {size} is smaller than one {patch} px patch")
            prov["image_size"] = "override" if whole == size else \
                f"override {size[0]}x{size[1]}, rounded down to whole {patch} px patches"
            size = whole
        else:
            prov["image_size"] = "override"
        if grid is not None:
            patch = _patch_from_grid(size, grid, patch, source)
            prov["patch_size"] = prov.get("patch_size", f"override: image_size / grid = {patch}")
        return size, patch
    if grid is not None:
        if patch is None:
            stated = _size_attribute(module, embed)
            if stated is None:
                raise LiveModelError(f"{source}: grid={grid} needs a patch size, and no patch embedding was found; "
                                     "pass image_size= too")
            patch = _patch_from_grid(stated[0], grid, None, source)
            prov["patch_size"] = f"{stated[1]} / grid override"
        prov["image_size"] = f"override: grid {grid[0]}x{grid[1]} x {patch} px patches"
        return (grid[0] * patch, grid[1] * patch), patch
    stated = _size_attribute(module, embed)
    if stated is not None:
        size = whole_patches(stated[0], patch) if patch else stated[0]
        prov["image_size"] = stated[1]
        return size, patch
    if patch is not None:
        side = _side_from_pos_table(module, embed)
        if side is not None:
            prov["image_size"] = side[1]
            return (side[0] * patch, side[0] * patch), patch
        prov["image_size"] = "guess: 224 px (nothing in the module states its input size)"
        return whole_patches((224, 224), patch, at_least_one=True), patch
    raise LiveModelError(f"{source}: no patch embedding found (a Conv2d whose stride equals its kernel, or a "
                         "Rearrange/Unfold of patches followed by a Linear) and no size to go by; pass grid=(rows, "
                         "cols) and image_size=")


def _patch_from_grid(size: tuple[int, int], grid: tuple[int, int], patch: int | None, source: str) -> int:
    p = size[0] // grid[0]
    if p < 1 or size[0] // p != grid[0] or size[1] // p != grid[1] or (patch is not None and p != patch):
        raise LiveModelError(f"{source}: image size {size[0]}x{size[1]} and grid {grid[0]}x{grid[1]} do not give "
                             f"one square patch size" + (f" of {patch} px (its patch embedding)" if patch else ""))
    return p


def _side_from_pos_table(module: nn.Module, embed: PatchEmbedding | None) -> tuple[int, str] | None:
    """The grid side of a square position table: its rows minus the learned prefix tokens (or all its rows)."""
    if embed is None:
        return None
    pos = _pos_table(module, embed.dim)
    if pos is None:
        return None
    prefix = sum(_prefix_params(module, embed.dim).values())
    for rows, covered in ((pos[1] - prefix, f"- {prefix} prefix token(s)"), (pos[1], "(patches only)")):
        side = math.isqrt(max(rows, 0))
        if rows > 0 and side * side == rows:
            return side, (f"shape: position table {pos[0]} ({pos[1]} rows {covered} = {side}x{side} patches, "
                          "a square grid)")
    return None


def _tokens(recorder: _Recorder, size: tuple[int, int], patch: int | None, overrides: Mapping[str, Any],
            prov: dict[str, str], source: str) -> tuple[int, int, tuple[int, int]]:
    """(T, patch size, grid): the token count of the model's self-attention at the probe size."""
    square = [int(m.shape[-1]) for m in recorder.maps]
    if patch is None:  # no patch embedding: the grid follows from T and num_prefix
        if overrides.get("num_prefix") is None:
            raise LiveModelError(f"{source}: no patch embedding found; pass grid=(rows, cols) or num_prefix= so the "
                                 f"grid can be read from the attention's {square[0]} tokens")
        patches = square[0] - int(overrides["num_prefix"])
        p = math.isqrt(size[0] * size[1] // max(patches, 1))
        if patches < 1 or (size[0] // max(p, 1)) * (size[1] // max(p, 1)) != patches:
            raise LiveModelError(f"{source}: {square[0]} tokens - {overrides['num_prefix']} prefix = {patches} "
                                 f"patches do not tile a {size[0]}x{size[1]} image; pass grid=(rows, cols)")
        patch = p
        prov["patch_size"] = f"capture: {size[0]}x{size[1]} px / {patches} patches"
    grid = (size[0] // patch, size[1] // patch)
    patches = grid[0] * grid[1]
    tokens = next((t for t in square if 0 <= t - patches <= _MAX_PREFIX), None)
    if tokens is None:
        raise LiveModelError(f"{source}: its attention runs over {sorted(set(square))} tokens, but a "
                             f"{size[0]}x{size[1]} input has {grid[0]}x{grid[1]} = {patches} patches of {patch} px "
                             "(window attention, or a different patch size?); vitviz shows global self-attention "
                             "over every token; pass grid= or image_size= if the patches are other than found")
    prov["grid"] = f"image size / patch size ({size[0]}x{size[1]} / {patch})"
    return tokens, patch, grid


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


def _output_kind(main: torch.Tensor | None, what: str, last_linear: torch.Tensor | None,
                 prov: dict[str, str]) -> tuple[str, int]:
    """('logits' | 'features' | 'none', num_classes): class scores when the output is HF `logits` or comes straight
    out of an nn.Linear; anything else is a backbone's features (no top-5 is made up from them)."""
    if main is None:
        prov["num_classes"] = "none: the forward returns no tensor"
        return "none", 0
    shape = tuple(main.shape)
    if main.dim() == 2 and (what == "logits" or main is last_linear):
        prov["num_classes"] = f"shape: {what} {shape} from {'a classifier' if what == 'logits' else 'an nn.Linear'}"
        return "logits", int(shape[1])
    if main.dim() in (2, 3):
        pooled = "" if main.dim() == 2 else "; token 0 (or the mean without prefix tokens) is taken as the image's"
        prov["num_classes"] = f"features: {what} {shape} is not a classifier's output{pooled}"
        return "features", 0
    prov["num_classes"] = f"none: {what} of shape {shape}"
    return "none", 0


def _preprocess(module: nn.Module, size: tuple[int, int], in_chans: int, overrides: Mapping[str, Any],
                prov: dict[str, str]) -> Preprocess:
    pcfg = getattr(module, "pretrained_cfg", None)
    if isinstance(pcfg, dict) and pcfg.get("mean") and pcfg.get("std"):
        pct = float(pcfg.get("crop_pct", 0.875))
        pp = Preprocess(crop=size, resize=int(math.floor(min(size) / pct)),
                        mode="squash" if pcfg.get("crop_mode") == "squash" else "center",
                        interpolation=str(pcfg.get("interpolation", "bicubic")), mean=tuple(pcfg["mean"]),
                        std=tuple(pcfg["std"]))
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
    for key in ("mean", "std"):
        values = overrides.get(key)
        if values is not None and len(tuple(values)) not in (1, in_chans):
            raise LiveModelError(f"{key} override has {len(tuple(values))} values; expected 1 or {in_chans} "
                                 "(one per channel)")
    fields: dict[str, Any] = {}
    for key, field_name in (("mean", "mean"), ("std", "std"), ("interpolation", "interpolation"),
                            ("resize", "resize"), ("crop_mode", "mode")):
        value = overrides.get(key)
        if value is not None:
            fields[field_name] = tuple(float(v) for v in value) if key in ("mean", "std") else value
            src += f"; {key} overridden"
    if fields:
        pp = replace(pp, **fields)
        if "mean" in fields and "std" in fields:  # the statistics are the user's: nothing left that matters guessed
            src = "override: mean and std given; the recipe " + src.replace("guess: ", "was a guess: ", 1)
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


def _nothing_seen(source: str, shape: tuple[int, ...], recorder: _Recorder) -> str:
    calls = ", ".join(f"{n} {m} call(s)" for m, n in recorder.calls.items()) or "no attention calls at all"
    other = f"; softmax over other shapes: {sorted(set(recorder.other_softmax))[:4]}" if recorder.other_softmax else ""
    return (f"{source}: no self-attention was seen in its forward pass of a {shape} input. vitviz watched for "
            "nn.MultiheadAttention calls (weights per head), F.scaled_dot_product_attention calls (probabilities "
            "recomputed from q, k and the mask) and softmax over (B, H, T, T) scores; it saw "
            f"{calls}{other}. {_skipped_summary(recorder.skipped)} Attention computed by xformers, flash-attn, "
            "TorchScript or another fused kernel cannot be seen; is this a Vision Transformer?").replace("  ", " ")


# ---------------------------------------------------------------------------------------------------------------
# --code FILE.py:FACTORY


def module_from_code(ref: str) -> nn.Module:
    """Import FILE.py and call FACTORY() (a function or class needing no arguments) -> the user's model.

    This runs the file's code: callers do it only when the user asked for it (`code=`, `--code`).
    """
    path_text, sep, factory = ref.rpartition(":")
    if not sep or not path_text or not factory:
        raise UserCodeError(f"code {ref!r}: expected FILE.py:FACTORY, e.g. model.py:build_model (a function or class "
                            "that returns the model)")
    path = Path(path_text).expanduser()
    if not path.is_file() or path.suffix != ".py":
        raise UserCodeError(f"code {ref!r}: {path} is not a Python file; expected FILE.py:FACTORY")
    name = f"vitviz_user_code_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"code {ref!r}: {path} cannot be imported as a Python module")
    user = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)  # its own imports of files beside it
    sys.modules[name] = user
    try:
        try:
            spec.loader.exec_module(user)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's file failed: say so, cause attached
            sys.modules.pop(name, None)
            raise UserCodeError(f"code {ref!r}: importing {path} failed ({type(e).__name__}: {e})") from e
        made = _call_factory(user, factory, ref, path)
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    if not isinstance(made, nn.Module):
        raise UserCodeError(f"code {ref!r}: {factory}() returned a {type(made).__name__}; expected a torch.nn.Module")
    return made


def _call_factory(user: types.ModuleType, factory: str, ref: str, path: Path) -> Any:
    obj: Any = user
    for part in factory.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            found = sorted(n for n, v in vars(user).items() if callable(v) and not n.startswith("_")
                           and getattr(v, "__module__", None) == user.__name__)
            raise UserCodeError(f"code {ref!r}: {path} defines no {factory!r}; it defines "
                                f"{', '.join(found[:10]) or 'no functions or classes'}")
    if not callable(obj):
        raise UserCodeError(f"code {ref!r}: {factory} is a {type(obj).__name__}, not a function or class")
    try:
        params = inspect.signature(obj).parameters.values()
        needed = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                                  p.POSITIONAL_OR_KEYWORD,
                                                                                  p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        needed = []
    if needed:
        raise UserCodeError(f"code {ref!r}: {factory} needs arguments ({', '.join(needed)}); expected a function or "
                            "class callable without arguments (write a small one that builds your model)")
    try:
        return obj()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's factory failed: say so, cause attached
        raise UserCodeError(f"code {ref!r}: {factory}() failed ({type(e).__name__}: {e})") from e


_STRIP = ("module.", "_orig_mod.", "model.", "net.", "backbone.")


def load_weights(module: nn.Module, checkpoint: str | Path, nest_key: str | None = None) -> str:
    """Load a checkpoint file (read with weights_only=True, never executed) into the factory's model: every
    parameter must be there with its shape, nothing extra; a common wrapper prefix ('module.', ...) is removed.
    Buffers the file lacks keep the model's own values. Returns a description for the provenance."""
    raw = read_checkpoint(checkpoint, nest_key)
    own = module.state_dict()
    params = {n for n, _ in module.named_parameters()}
    best, removed = raw.tensors, ""
    for prefix in _STRIP:
        stripped = {k[len(prefix):]: v for k, v in raw.tensors.items() if k.startswith(prefix)}
        if len(set(stripped) & set(own)) > len(set(best) & set(own)):
            best, removed = stripped, prefix
    missing = [k for k in own if k not in best and k in params]
    extra = [k for k in best if k not in own]
    wrong = [f"{k}: file {tuple(best[k].shape)} vs model {tuple(own[k].shape)}" for k in own
             if k in best and tuple(best[k].shape) != tuple(own[k].shape)]
    if missing or extra or wrong:
        parts = []
        if wrong:
            parts.append(f"shapes differ: {'; '.join(wrong[:5])}")
        if missing:
            parts.append(f"the model's parameters not in the file: {', '.join(missing[:8])}"
                         + (f" (+{len(missing) - 8})" if len(missing) > 8 else ""))
        if extra:
            parts.append(f"tensors the model does not have: {', '.join(extra[:8])}"
                         + (f" (+{len(extra) - 8})" if len(extra) > 8 else ""))
        raise UserCodeError(f"{checkpoint}: does not fit the model the code built ({type(module).__name__}): "
                            + " | ".join(parts))
    module.load_state_dict(best, strict=False)
    kept = [k for k in own if k not in best]
    return (f"weights {raw.path} ({len(best)} tensors" + (f", prefix {removed!r} removed" if removed else "")
            + (f"; the model's own {', '.join(kept[:4])} kept" if kept else "") + ")")


def load_code(ref: str, checkpoint: Any, overrides: Mapping[str, Any]) -> LiveModel:
    """`code=FILE.py:FACTORY`: build the user's model by running their code, load the weights file into it (when
    given) and capture it live. The model is new, so it goes to `device` ('auto' by default, as for files)."""
    if checkpoint is not None and not isinstance(checkpoint, (str, Path)):
        raise UserCodeError(f"code {ref!r}: expected a weights file (or none) beside it, got a "
                            f"{type(checkpoint).__name__}")
    module = module_from_code(ref)
    how = f"code {ref}"
    if checkpoint is not None:
        how += "; " + load_weights(module, checkpoint, overrides.get("nest_key"))
    else:
        how += "; the weights its factory made (no weights file given)"
    overrides = {**overrides, "device": overrides.get("device") or "auto"}
    source = str(checkpoint) if checkpoint is not None else ref
    return load_live(module, overrides, source=source, how=how)
