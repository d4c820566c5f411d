"""The recorder: one `TorchFunctionMode` that sees the attention a module's own code computes, and `_Recorder`,
which collects it per layer (see `vitviz.core.running.live` for the mechanisms).

    recorder = _Recorder(batch=1)
    with watch_attention(module, recorder):
        module(x)
    recorder.layers, recorder.maps      # [(module name, mechanism), ...], [(B, H, T, T), ...]

Nothing here imports or describes the module: it only runs it (`_run`) and keeps what its forward computes.
"""
from __future__ import annotations

import inspect
import math
import sys
import threading
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from vitviz.core.running.live.errors import LiveModelError, _StopForward
from vitviz.errors import NonFiniteError

MHA = "nn.MultiheadAttention"
SDPA = "scaled_dot_product_attention"
SOFTMAX = "softmax"

_SDPA_FN = F.scaled_dot_product_attention
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS: dict[str, Any] = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                                  "enable_gqa": False}
_SOFTMAX_FNS = frozenset({F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax})
_MHA_FN = F.multi_head_attention_forward
_MHA_SIGNATURE = inspect.signature(_MHA_FN)
# Modules that never own attention: a softmax inside one is credited to the module around it.
_HELPERS = (nn.Softmax, nn.modules.dropout._DropoutNd, nn.Identity)
# What the probe follows a softmax's output through (`_Recorder.follow`): the products that apply attention to the
# values (and make the scores: q k^T), the calls that pass values on unchanged, and dropout (unchanged when off).
_T = torch.Tensor
_PRODUCTS = frozenset({torch.matmul, _T.matmul, _T.__matmul__, _T.__rmatmul__, torch.bmm, _T.bmm, torch.einsum,
                       torch.baddbmm, _T.baddbmm})
_UNCHANGED = frozenset({
    _T.view, _T.view_as, _T.reshape, _T.reshape_as, torch.reshape, _T.permute, torch.permute, _T.transpose,
    torch.transpose, _T.contiguous, _T.to, _T.type_as, _T.type, _T.float, _T.half, _T.bfloat16, _T.double, _T.clone,
    torch.clone, _T.detach, _T.flatten, torch.flatten, _T.unflatten, _T.unsqueeze, torch.unsqueeze, _T.squeeze,
    torch.squeeze, _T.expand, _T.expand_as, _T.__getitem__, _T.unbind, torch.unbind, _T.chunk, torch.chunk,
    _T.split, torch.split, _T.cpu, _T.cuda, _T.nan_to_num, torch.nan_to_num, _T.movedim, torch.movedim})
_DROPOUTS = frozenset({F.dropout, torch.dropout, F.dropout1d, F.dropout2d, F.dropout3d})
_JOIN_MAX = 16   # the most queries a class-attention layer (queries that join late, over [them, the tokens]) has

# ---------------------------------------------------------------------------------------------------------------
# The probabilities of an SDPA call


def sdpa_scores(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """The scores `F.scaled_dot_product_attention` takes the softmax of, in float32: (..., L, S), `-inf` where
    masked (see `sdpa_probabilities`)."""
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
    return scores


def sdpa_probabilities(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None = None,
                       is_causal: bool = False, scale: float | None = None,
                       enable_gqa: bool = False) -> torch.Tensor:
    """The attention probabilities `F.scaled_dot_product_attention` applies, in float32: (..., L, S).

    `softmax(q k^T * scale + bias)` with scale 1/sqrt(E) by default; a bool mask keeps the True positions, a float
    mask is added; `is_causal` keeps the lower triangle (top-left aligned); `enable_gqa` repeats the key heads.
    A row with every position masked has no distribution and comes back as zeros.
    """
    return _probabilities(sdpa_scores(query, key, attn_mask, is_causal, scale, enable_gqa))


def _probabilities(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores, dim=-1).nan_to_num_(0.0)


# ---------------------------------------------------------------------------------------------------------------
# What one captured forward pass saw


@dataclass(frozen=True)
class AttentionLayout:
    """How a module lays its attention out, as its probe found it; the captures after the probe follow it.

    per_head: each layer computes one (B, T, T) map per head (a module per head, or a loop over heads), in
        `heads` consecutive calls; `perms[i]` puts layer i's calls in head order (module order).
    head_major: maps with the heads folded into the batch, (B*H, T, T), index h*B + b (else b*H + h, as
        nn.MultiheadAttention and fairseq lay them out).
    order: the token order shown (prefix tokens first), as indices into the module's own order; None when the
        module puts them first already.
    per_image: the module computes its attention one image at a time (a loop over the batch, (H, T, T) maps):
        vitviz runs a batch through it one image at a time.
    two_d: each call is one image's one head, a 2-D (T, T) map (loops over images and heads, the from-scratch
        tutorial's `softmax(q @ k.T)`): `B * heads` consecutive calls make a layer, in the order `head_major`
        says (h*B + b, else b*H + h: the image loop outside the head loop).
    heads_first: in scores whose token axes are not the last two (labml's sequence-first (T_q, T_k, B, H) with a
        softmax over dim=1), the head axis comes before the batch axis (else after it); read where the two cannot
        be told apart by their lengths (as many heads as images).
    applied: the modules whose softmax output is changed before it weights the values (CaiT's talking heads:
        proj_w mixes the heads' probabilities): their maps are taken where they meet the values, as applied.
    joined: tokens that join the sequence late as the only queries of class-attention layers (CaiT's CLS token:
        (q, T) maps, q = `joined`, over [CLS, patches]); shown first. Every map is laid on the T x T grid: a
        self-attention layer's (T - q, T - q) map with zero rows and columns for the tokens not there yet, a class-
        attention layer's (q, T) map with zero rows for the tokens that do not query in it (they pass through).
    joined_at: where the joining tokens are among a class-attention layer's keys, as indices (None: first).
    """

    per_head: bool = False
    two_d: bool = False
    heads: int = 0
    perms: tuple[tuple[int, ...], ...] = ()
    head_major: bool = False
    order: tuple[int, ...] | None = None
    per_image: bool = False
    heads_first: bool = False
    applied: frozenset[str] = frozenset()
    joined: int = 0
    joined_at: tuple[int, ...] | None = None


@dataclass
class _Use:
    """What becomes of one captured softmax's output in the probe (`_Recorder.follow`): the module that computed it,
    and whether it has reached the product with the values."""

    name: str
    done: bool = False
    layer: int | None = None     # the probe: the index of the map it was kept as (replaced by the applied weights)
    defer: bool = False          # a capture: the layer's map is taken when it meets the values
    stays: bool = False          # the probe: the change on the way is random or a constant factor: softmax shown
    mechanism: str = ""


@dataclass
class _HeadGroup:
    """Single-head (B, T, T) calls of one layer being collected (probe and verify: grouped by the running frames).

    frame: the frame that computed the first one (a loop over heads: the same frame computes them all); parent: the
    module frame around it (a module per head: their caller's frame is the same); the frames are held, so that
    `is` identifies one running call of a module."""

    mechanism: str
    frame: Any
    parent: Any
    prefix: str
    names: list[str] = field(default_factory=list)
    modules: list[int] = field(default_factory=list)
    maps: list[torch.Tensor] = field(default_factory=list)
    diags: list[torch.Tensor | None] = field(default_factory=list)
    parent_name: str = ""


class _Recorder:
    """Collects the attention of one forward pass and knows which module is running.

    Args:
        batch: the input's batch size (3-D probabilities are one head's (B, L, S), or (B*H, L, S) viewed as
            (B, H, L, S)).
        tokens: keep only self-attention over this many tokens (None: every square map, for the probe).
        keep: called with each kept (B, H, T, T) map; None stores them in `maps`.
        capacity: how many layers `keep` can take; more is an error after the pass.
        stop: stop the forward pass (`_StopForward`) once this many layers are kept.
        heads: the head count every layer must have (the model's, once loaded).
        layout: the probe's `AttentionLayout` (None: single-head calls are grouped into layers by the frames that
            compute them, as the probe does).
        scores: keep the diagonal of each layer's scores (before the softmax) in `diags`, (B, H, T) (the probe:
            a token whose own score does not depend on the image is a prefix token).
        group_heads: the head count the user gave (`heads=`): 2-D (T, T) maps one frame computes are then cut into
            layers of `batch * group_heads` maps, where the frames alone cannot tell layers apart.
        chunks: a module call that computes several 4-D maps of one image (a packed sequence's windows, each its
            own softmax) makes one layer: its maps placed on the diagonal of one (1, H, T, T) map, T their total
            length, zero between them (`vitviz.core.running.live.packing`).
    """

    def __init__(self, batch: int, tokens: int | None = None, keep: Callable[[torch.Tensor], None] | None = None,
                 capacity: int | None = None, stop: int | None = None, heads: int | None = None,
                 layout: AttentionLayout | None = None, scores: bool = False, group_heads: int | None = None,
                 chunks: bool = False, windows: bool = False) -> None:
        self.batch, self.tokens, self.capacity, self.stop, self.heads = batch, tokens, capacity, stop, heads
        self.chunks = chunks
        self._chunk: tuple[str, Any, str, list[torch.Tensor]] | None = None   # (module, frame, mechanism, maps)
        self.group_heads = group_heads
        self.keep, self.layout, self.scores = keep, layout, scores
        self.maps: list[torch.Tensor] = []
        self.diags: list[torch.Tensor | None] = []
        self.layers: list[tuple[str, str]] = []
        self.skipped: list[tuple[str, str, tuple[int, ...]]] = []
        self.calls: Counter[str] = Counter()
        self.other_softmax: list[tuple[int, ...]] = []
        # attention computed inside windows, (B, H, windows, queries, keys) (Hiera's mask units): (module, shape)
        self.windowed: list[tuple[str, tuple[int, ...]]] = []
        # `windows`: every attention call kept as it is, (module, (B, H, windows, queries, keys) probabilities; one
        # window for a 4-D call), in call order, for a model shown per window (`vitviz.core.running.live.stages`)
        self.window_maps: list[tuple[str, torch.Tensor]] | None = [] if windows else None
        self.extra = 0
        self.notes: list[str] = []
        self.names: dict[int, str] = {}
        self.rank: dict[int, int] = {}
        self.last_linear: torch.Tensor | None = None
        self.last_linear_name = ""
        self.grouped: list[tuple[int, tuple[int, ...]]] = []   # (layer index, call -> head order) of each layer
                                                               # grouped from single-head calls
        self._grouped = 0
        self.folded: list[int] = []                # layers whose heads came folded into the batch (B*H, T, T)
                                                   # or as 2-D (T, T) maps, one per image per head
        self.two_d_layers: list[int] = []          # layers grouped from 2-D (T, T) maps
        # 2-D maps the probe could not tell apart as the heads of one layer: (where, how many, shape, why)
        self.unsure: list[tuple[str, int, tuple[int, ...], str]] = []
        self.mha_probs: torch.Tensor | None = None
        # softmaxes over scores whose token axes are not the last two: whether the head axis comes first (the
        # layout's, else as a call whose axis lengths show it; None: not seen yet)
        self.heads_first: bool | None = layout.heads_first if layout is not None else None
        self._group: _HeadGroup | None = None
        self._pending: list[torch.Tensor] = []
        self._order_index: torch.Tensor | None = None
        # the probe follows each softmax's output to the product with the values, and each (T, T) score product
        # to its softmax: what is changed in between, and scores with no softmax, are said (`changed`, `no_softmax`)
        self.follow = scores
        self._tracked: dict[int, tuple[weakref.ref[torch.Tensor], _Use, str | None]] = {}
        self._products: list[tuple[str, tuple[int, ...]]] = []
        self.changed: dict[str, str] = {}                       # module -> the call that changed its softmax output
        self.applied: dict[str, str] = {}    # the probe: module -> that call, its map replaced by the weights applied
        # the probe: class-attention calls, (J, T) with J <= _JOIN_MAX queries over more keys: (index among the
        # layers, module, mechanism, probabilities (B, H, J, T), scores (B, H, J, T) or None)
        self.class_maps: list[tuple[int, str, str, torch.Tensor, torch.Tensor | None]] = []
        self.no_softmax: list[tuple[str, tuple[int, ...]]] = []  # (module, shape) of scores no softmax followed

    # where the attention is computed
    def _frames(self) -> tuple[str, int, Any, str, Any]:
        """(name, id, frame) of the innermost running module that can own attention (a Softmax/Dropout credits its
        parent), and (name, frame) of the next different module around it: the first frames up this thread's call
        stack whose `self` is one of the model's modules. Read only when attention is found, so the forward pass
        runs without a hook on every module."""
        frame = sys._getframe(2)
        found: tuple[str, int, Any] | None = None
        while frame is not None:
            owner = frame.f_locals.get("self")
            name = self.names.get(id(owner))
            if name is not None and not isinstance(owner, _HELPERS):
                if found is None:
                    found = (name, id(owner), frame)
                elif id(owner) != found[1]:
                    return (*found, name, frame)
            frame = frame.f_back
        return (*found, "", None) if found is not None else ("", 0, None, "", None)

    def where(self) -> str:
        """The innermost running module that can own attention, by name ('(top level)': the model itself)."""
        return self._frames()[0] or "(top level)"

    def wants(self, length: int, source: int) -> bool:
        return length == source and (self.tokens is None or length == self.tokens)

    def may_join(self, length: int, source: int) -> bool:
        """Whether (length, source) attention may be a class-attention layer's (the probe: a few queries over more
        keys) or, once the layout has tokens that join late, one of its maps to lay on the T x T grid."""
        if self.layout is not None and self.layout.joined and self.tokens is not None:
            j, t = self.layout.joined, self.tokens
            return (length, source) in ((j, t), (t - j, t - j))
        return self.layout is None and self.tokens is None and 1 <= length <= _JOIN_MAX < source

    def _on_grid(self, probs: torch.Tensor) -> torch.Tensor:
        """A map of a model whose tokens join late (`AttentionLayout.joined`) laid on the T x T grid, joining tokens
        first: a self-attention map in the lower right, a class-attention map's (J, T) rows on top (its keys in the
        order `joined_at` gives); zeros elsewhere: no attention is computed there."""
        assert self.layout is not None and self.tokens is not None
        j, t = self.layout.joined, self.tokens
        length, source = int(probs.shape[-2]), int(probs.shape[-1])
        if (length, source) not in ((j, t), (t - j, t - j)):
            return probs
        full = probs.new_zeros(*probs.shape[:-2], t, t)
        if length == j:
            at = self.layout.joined_at
            if at is not None:
                probs = probs[..., list(at) + [i for i in range(t) if i not in at]]
            full[..., :j, :] = probs
        else:
            full[..., j:, j:] = probs
        return full

    def _class_attention(self, mechanism: str, probs: torch.Tensor, scores: torch.Tensor | None,
                         name: str | None) -> bool:
        """The probe keeps a few queries' attention over more keys (a class-attention layer) aside, for the
        describer to place (`class_maps`); False for anything else."""
        length, source = int(probs.shape[-2]), int(probs.shape[-1])
        if not self.may_join(length, source) or self.layout is not None:
            return False
        kept = None if scores is None else scores.detach().float().reshape(probs.shape).clone()
        self.class_maps.append((len(self.layers), name or self.where(), mechanism, probs.detach().float().clone(),
                                kept))
        return True

    def skip(self, mechanism: str, shape: tuple[int, ...]) -> None:
        self.skipped.append((self.where(), mechanism, shape))

    def add(self, mechanism: str, probs: torch.Tensor, diag: torch.Tensor | None = None,
            name: str | None = None, scores: torch.Tensor | None = None) -> None:
        """Keep one layer's probabilities (B, H, T, T) (or unbatched (H, T, T)); `diag`: its scores' diagonal;
        `scores`: all of them (the probe keeps a class-attention layer's, whose queries are not its keys)."""
        if self.chunks and name is None and probs.dim() == 4:
            self._chunked(mechanism, probs)
            return
        if name is None:
            self._close_chunks()
        length, source = int(probs.shape[-2]), int(probs.shape[-1])
        if probs.dim() != 4:
            probs = probs.reshape(self.batch, -1, length, source)
        if self.window_maps is not None:
            self.window_maps.append((name or self.where(), probs.detach().float()[:, :, None]))
            return
        if int(probs.shape[0]) != self.batch:
            # its first axis is not the batch: windows (or crops) folded into it, each attending over its own tokens --
            # not one map per image over the image's tokens, so not shown as one (RF-DETR's windowed blocks)
            self.skipped.append((name or self.where(), f"{mechanism}, {probs.shape[0]} windows per batch of "
                                 f"{self.batch}", tuple(probs.shape)))
            return
        if self.layout is not None and self.layout.joined:
            probs = self._on_grid(probs)
            length, source = int(probs.shape[-2]), int(probs.shape[-1])
        if not self.wants(length, source):
            if not self._class_attention(mechanism, probs, scores, name):
                self.skipped.append((name or self.where(), mechanism, tuple(probs.shape)))
            return
        if self.capacity is not None and len(self.layers) >= self.capacity:
            self.extra += 1
            return
        name = name or self.where()
        if self.heads is not None and probs.shape[1] != self.heads:
            raise LiveModelError(f"{name} ({mechanism}) has {probs.shape[1]} heads, where the model had {self.heads} "
                                 "when it was loaded; vitviz needs the same head count in every layer")
        order = self.layout.order if self.layout is not None else None
        if order is not None and len(order) == length:
            if self._order_index is None or self._order_index.device != probs.device:
                self._order_index = torch.tensor(order, dtype=torch.long, device=probs.device)
            probs = probs.index_select(-2, self._order_index).index_select(-1, self._order_index)
        self.layers.append((name, mechanism))
        if self.scores:
            self.diags.append(None if diag is None else diag.detach().float().reshape(self.batch, -1, length))
        if self.keep is None:
            self.maps.append(probs.detach().float().clone())
        else:
            self.keep(probs.detach())
        if self.stop is not None and len(self.layers) >= self.stop:
            raise _StopForward

    def _chunked(self, mechanism: str, probs: torch.Tensor) -> None:
        """One softmax of a module call that may compute several (`chunks`): kept until another call begins."""
        name, _owner, frame, _parent_name, _parent = self._frames()
        if self._chunk is not None and self._chunk[1] is not frame:
            self._close_chunks()
        if self._chunk is None:
            self._chunk = (name or "(top level)", frame, mechanism, [])
        self._chunk[3].append(probs.detach())

    def _close_chunks(self) -> None:
        """The module call's maps as one layer: a single map as it is, several on the diagonal of one map."""
        chunk, self._chunk = self._chunk, None
        if chunk is None:
            return
        name, _frame, mechanism, parts = chunk
        if len(parts) == 1:
            self.add(mechanism, parts[0], None, name=name)
            return
        total = sum(int(p.shape[-1]) for p in parts)
        full = parts[0].new_zeros(*parts[0].shape[:2], total, total)
        start = 0
        for p in parts:
            n = int(p.shape[-1])
            full[..., start:start + n, start:start + n] = p
            start += n
        self.add(f"{mechanism} in {len(parts)} windows", full, None, name=name)

    def three_d(self, mechanism: str, probs: torch.Tensor, diag: torch.Tensor | None) -> None:
        """A 3-D map (N, L, S): one head's (B, L, S) when N is the batch, else (B*H, L, S), heads folded in."""
        n = int(probs.shape[0])
        if n == self.batch and not (self.layout is not None and not self.layout.per_head):
            self.one_head(mechanism, probs, diag)
            return
        if n % self.batch:
            self.skip(mechanism, tuple(probs.shape))
            return
        self.flush()
        h = n // self.batch
        shape = (int(probs.shape[-2]), int(probs.shape[-1]))
        if self.layout is not None and self.layout.head_major:   # index h*B + b
            probs = probs.reshape(h, self.batch, *shape).transpose(0, 1)
            diag = None if diag is None else diag.reshape(h, self.batch, -1).transpose(0, 1)
        self.folded.append(len(self.layers))
        self.add(f"{mechanism} (B*H, T, T)", probs.reshape(self.batch, h, *shape), diag)

    def one_head(self, mechanism: str, probs: torch.Tensor, diag: torch.Tensor | None) -> None:
        """One head's (B, T, T) map: `layout.heads` consecutive ones make a layer (captures); on a probe they are
        grouped by the frames computing them: one call of one module (a loop over heads), or sibling modules called
        by one call of their parent (a module per head)."""
        label = f"{mechanism} per head"
        length, source = int(probs.shape[-2]), int(probs.shape[-1])
        if not self.wants(length, source):
            self.skip(label, tuple(probs.shape))
            return
        layout = self.layout
        if layout is not None and layout.per_head:
            self._pending.append(probs)
            if len(self._pending) == layout.heads:
                perm = layout.perms[min(self._grouped, len(layout.perms) - 1)] if layout.perms else ()
                maps = [self._pending[i] for i in perm] if perm else self._pending
                self._pending, self._grouped = [], self._grouped + 1
                self.add(label, torch.stack(maps, dim=1))   # (B, H, T, T)
            return
        self._group_map(label, probs, diag, same_module_again=False)

    def _group_map(self, label: str, probs: torch.Tensor, diag: torch.Tensor | None, same_module_again: bool) -> None:
        """Add one head's map to the open group of maps computed by the same frame (or by sibling modules under
        one parent), or open a new group. `same_module_again`: a module called again under the same parent stays
        in the group (a head module called once per image); else it starts a new one."""
        name, owner, frame, parent_name, parent = self._frames()
        g = self._group
        joins = g is not None and g.mechanism == label and (
            frame is g.frame or (parent is not None and parent is g.parent
                                 and (same_module_again or owner not in g.modules)
                                 and name.rpartition(".")[0] == g.prefix))
        if not joins:
            self.flush()
            g = self._group = _HeadGroup(label, frame, parent, name.rpartition(".")[0], parent_name=parent_name)
        assert g is not None
        g.names.append(name)
        g.modules.append(owner)
        g.maps.append(probs)
        g.diags.append(diag)

    def two_d(self, mechanism: str, probs: torch.Tensor, diag: torch.Tensor | None) -> None:
        """One image's one head, a 2-D (T, T) map (a loop over the images and one over the heads, as the
        from-scratch tutorial's `softmax(q @ k.T)`): `B * layout.heads` consecutive ones make a layer (captures);
        on a probe they are grouped by the frame computing them (both loops in one call of one module), or by
        their parent's frame (a module per head, called in a loop over the images)."""
        label = f"{mechanism} (T, T) per image per head"
        length, source = int(probs.shape[-2]), int(probs.shape[-1])
        layout = self.layout
        if not self.wants(length, source) or (layout is not None and not layout.two_d):
            self.skip(label, tuple(probs.shape))
            return
        if layout is not None:
            self._pending.append(probs)
            if len(self._pending) == self.batch * layout.heads:
                maps, self._pending = torch.stack(self._pending), []          # (B*H, T, T) in call order
                self.add(label, _unfold(maps, self.batch, layout.head_major))
            return
        self._group_map(label, probs, diag, same_module_again=True)

    def _flush_two_d(self, g: _HeadGroup) -> None:
        """Close a group of 2-D (T, T) maps: one layer of n / B heads (read b*H + h; the probe's batch of two checks
        the order), or, with `group_heads`, layers of B * group_heads maps each. Maps computed by the model's own
        forward (no submodule around them) cannot be told apart by layer without `group_heads`: said in
        `unsure`, not shown."""
        n, shape = len(g.maps), tuple(g.maps[0].shape)
        where = g.parent_name if g.modules and len(set(g.modules)) > 1 and g.parent_name else g.names[0]
        per = self.batch * self.group_heads if self.group_heads else 0
        if per and n % per == 0:
            chunks = [list(range(i, i + per)) for i in range(0, n, per)]
        elif per:
            self.unsure.append((where or "(top level)", n, shape, f"{n} maps are not a whole number of layers of "
                                f"{self.group_heads} heads x {self.batch} image(s)"))
            return
        elif not where:
            self.unsure.append(("(top level)", n, shape, "they are computed in the model's own forward, not inside "
                                "an attention module, so which maps belong to which layer cannot be seen"))
            return
        elif n % self.batch:
            self.unsure.append((where, n, shape, f"{n} maps do not divide among the {self.batch} image(s) of the "
                                "batch"))
            return
        else:
            chunks = [list(range(n))]
        for idx in chunks:
            maps = torch.stack([g.maps[i] for i in idx])                          # (B*H, T, T) in call order
            diag = None if any(g.diags[i] is None for i in idx) else \
                _unfold(torch.stack([g.diags[i] for i in idx]), self.batch, False)  # (B*H, T) -> (B, H, T)
            self.folded.append(len(self.layers))
            self.two_d_layers.append(len(self.layers))
            self.add(g.mechanism, _unfold(maps, self.batch, False), diag, name=where or "(top level)")

    def flush(self) -> None:
        """Close the layer being collected from single-head calls: its heads in module order."""
        g, self._group = self._group, None
        if g is None:
            return
        if g.mechanism.endswith("per image per head"):
            self._flush_two_d(g)
            return
        distinct = len(set(g.modules)) == len(g.modules) and len(g.modules) > 1
        perm = tuple(sorted(range(len(g.maps)), key=lambda i: self.rank.get(g.modules[i], 0))) if distinct \
            else tuple(range(len(g.maps)))
        name = (g.parent_name or g.prefix or g.names[0]) if distinct else g.names[0]
        self.grouped.append((len(self.layers), perm))
        diag = None if any(d is None for d in g.diags) else torch.stack([g.diags[i] for i in perm], dim=1)
        self.add(g.mechanism, torch.stack([g.maps[i] for i in perm], dim=1), diag, name=name or "(top level)")

    def finish(self) -> None:
        """The forward pass has ended: close what single-head calls were still collecting; on the probe, the score
        products no softmax over their last axis followed are left out, said (`no_softmax`, `skipped`)."""
        self.flush()
        self._close_chunks()
        if self._pending:
            self.extra += 1
            self._pending = []
        self.extra += len({id(use) for _ref, use, _change in self._tracked.values() if use.defer and not use.done})
        for name, shape in self._products:
            self.no_softmax.append((name, shape))
            self.skipped.append((name, f"{'x'.join(map(str, shape[-2:]))} scores with no softmax over their last "
                                       "axis (sigmoid, ReLU, a softmax over another axis?): not attention vitviz "
                                       "shows", shape))
        self._products, self._tracked = [], {}

    # what becomes of the softmax's output (the probe only)
    def _track(self, t: Any, use: _Use, change: str | None) -> None:
        for x in (t if isinstance(t, (tuple, list)) else (t,)):
            if isinstance(x, torch.Tensor):
                self._tracked[id(x)] = (weakref.ref(x), use, change)

    def followed(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """One call of the probe's forward pass, after it ran: a product of a softmax's output (or what was made
        from it) with the values ends that output's path -- unchanged, or changed by the first call on the way that
        is not a reshape, a cast or dropout turned off (talking heads, a re-normalisation, dropout in eval mode),
        which is said; a (T, T) product of no softmax's output is a score product its softmax should follow."""
        if not self._tracked and (func not in _PRODUCTS or not self.follow):
            return
        hits = []
        for a in (*args, *kwargs.values()):
            for x in (a if isinstance(a, (tuple, list)) else (a,)):
                entry = self._tracked.get(id(x)) if isinstance(x, torch.Tensor) else None
                if entry is not None and entry[0]() is x and not entry[1].done:
                    hits.append((x, entry))
        if func in _PRODUCTS:
            for x, (_ref, use, change) in hits:
                use.done = True
                if change is not None:
                    self.changed.setdefault(use.name, change)
                self._meets_values(use, x, change)
            if hits:
                self._tracked = {k: v for k, v in self._tracked.items() if not v[1].done}
            if self.follow and not hits and isinstance(out, torch.Tensor) and out.dim() in (3, 4) \
                    and out.shape[-1] == out.shape[-2] and out.shape[-1] > 1:
                self._products.append((self.where(), tuple(out.shape)))
            return
        if not hits:
            return
        _x, (_ref, use, change) = hits[0]
        if change is None and func not in _UNCHANGED:
            change = _changed_by(func, args, kwargs)
            use.stays = change is not None and (func in _DROPOUTS or _by_constant(func, args))
            change = change if change is None or self.where() == use.name else f"{change} in {self.where()}"
        self._track(out, use, change)

    # the three mechanisms
    def softmax(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        x = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor):
            return
        nd = x.dim()
        if nd == 2 and dim in (-1, 1) and x.shape[0] == x.shape[1] > 1:   # one image's one head: (T, T)
            self.calls[SOFTMAX] += 1
            if self.follow:
                self._answer(tuple(x.shape))
                self._track(out, _Use(self.where()), None)
            self.two_d(SOFTMAX, out, x.diagonal() if self.scores else None)
            return
        perm = _keys_last(tuple(x.shape), dim) if nd in (3, 4) else None
        if perm is not None:          # token axes elsewhere: labml's (T_q, T_k, B, H) with a softmax over dim=1
            self.moved(x, out, int(dim), perm)
            return
        if nd == 5 and dim in (-1, 4):
            self.calls[SOFTMAX] += 1
            self.windowed.append((self.where(), tuple(x.shape)))
            if self.window_maps is not None:
                self.window_maps.append((self.where(), out.detach().float()))
            return
        if nd not in (3, 4) or dim not in (-1, nd - 1) or (nd == 3 and x.shape[-1] != x.shape[-2]):
            self.other_softmax.append(tuple(x.shape))
            return
        self.calls[SOFTMAX] += 1
        use = None
        if self.follow and x.shape[-1] == x.shape[-2]:
            self._answer(tuple(x.shape))
            use = _Use(self.where())
            self._track(out, use, None)
        diag = x.diagonal(dim1=-2, dim2=-1) if self.scores and x.shape[-1] == x.shape[-2] else None
        if nd == 3:
            self.three_d(SOFTMAX, out, diag)
            return
        self.flush()
        if self._defers(out):
            return
        before = len(self.maps)
        self.add(SOFTMAX, out, diag, scores=x if self.scores else None)
        if use is not None and self.keep is None and len(self.maps) > before:
            use.layer = before

    def _defers(self, out: torch.Tensor) -> bool:
        """A capture of a module whose softmax output is changed before it weights the values (`layout.applied`):
        the output is followed, and the layer's map is what meets the values (`_meets_values`)."""
        if self.layout is None or not self.layout.applied:
            return False
        name = self.where()
        if name not in self.layout.applied:
            return False
        self._track(out, _Use(name, defer=True, mechanism=SOFTMAX), None)
        return True

    def _meets_values(self, use: _Use, x: torch.Tensor, change: str | None) -> None:
        """The weights `x` that a softmax's output became meet the values: a deferred capture keeps them as the
        layer's map; the probe replaces the softmax's map by them when something changed it on the way (and the
        shape is the map's), said in `applied` -- not when the change is random (dropout in training mode) or a
        constant factor (a tutorial's division by sqrt(D) after the softmax): the softmax stays shown, said as
        changed."""
        if use.defer:
            self.add(f"{use.mechanism}, as applied to the values", x, name=use.name)
        elif use.layer is not None and change is not None and not use.stays \
                and tuple(x.shape) == tuple(self.maps[use.layer].shape):
            self.maps[use.layer] = x.detach().float().clone()
            self.layers[use.layer] = (self.layers[use.layer][0], f"{self.layers[use.layer][1]} -> {change}, as "
                                                                 "applied to the values")
            self.applied[use.name] = change

    def moved(self, x: torch.Tensor, out: torch.Tensor, dim: int, perm: tuple[int, ...]) -> None:
        """A softmax over axis `dim` of scores whose two token axes are not the last two (`_keys_last`): the
        softmax axis is the keys', the other token axis the queries'; its own output, its axes moved to
        (B, H, T_q, T_k) -- the batch axis the one as long as the batch (where heads and images are as many, the
        order the probe saw) -- or (N, T_q, T_k) for a 3-D tensor, then kept as any softmax's."""
        nd = x.dim()
        names = ["?"] * nd
        names[perm[-2]], names[perm[-1]] = "T_q", "T_k"
        self.calls[SOFTMAX] += 1
        if self.follow:
            self._answer(tuple(x.shape))
            self._track(out, _Use(self.where()), None)
        probs = out.permute(perm)
        diag = x.permute(perm).diagonal(dim1=-2, dim2=-1) if self.scores else None
        if nd == 3:
            names[perm[0]] = "N"
            self.three_d(f"{SOFTMAX} over dim={dim} of ({', '.join(names)})", probs, diag)
            return
        a, b = int(probs.shape[0]), int(probs.shape[1])
        if a != self.batch and b != self.batch:
            self.skip(SOFTMAX, tuple(x.shape))
            return
        if a != b:
            first = a != self.batch         # the head axis first
            if self.heads_first is None:
                self.heads_first = first
        else:
            first = bool(self.heads_first)
        names[perm[0]], names[perm[1]] = ("H", "B") if first else ("B", "H")
        if first:
            probs = probs.transpose(0, 1)
            diag = None if diag is None else diag.transpose(0, 1)
        self.flush()
        self.add(f"{SOFTMAX} over dim={dim} of ({', '.join(names)})", probs, diag)

    def _answer(self, shape: tuple[int, ...]) -> None:
        """A softmax over the last axis of `shape` scores: the latest score product of that shape is answered."""
        for i in range(len(self._products) - 1, -1, -1):
            if self._products[i][1][-2:] == shape[-2:]:
                del self._products[i]
                return

    def sdpa(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             mechanism: str) -> Any:
        out = func(*args, **kwargs)  # the module's own output, untouched
        p = {**_SDPA_DEFAULTS, **dict(zip(_SDPA_ARGS, args)), **kwargs}
        q, k = p["query"], p["key"]
        self.calls[mechanism] += 1
        if q.dim() == 5:    # (B, H, windows, queries, dim): attention inside windows, not over the image's tokens
            self.windowed.append((self.where(), (*q.shape[:-1], int(k.shape[-2]))))
            if self.window_maps is not None:
                self.window_maps.append((self.where(), sdpa_probabilities(
                    q, k, p["attn_mask"], bool(p["is_causal"]), p["scale"], bool(p["enable_gqa"]))))
            return out
        if self.follow:     # a (T, T) bias made by a product and passed as the mask: its softmax is this one
            self._answer((int(q.shape[-2]), int(k.shape[-2])))
        if self.window_maps is None and not self.wants(int(q.shape[-2]), int(k.shape[-2])) and \
                not (q.dim() == 4 and self.may_join(int(q.shape[-2]), int(k.shape[-2]))) and \
                not (self.chunks and q.dim() == 4):
            self.skip(mechanism, (*q.shape[:-1], int(k.shape[-2])))
            return out
        if p["dropout_p"] and not any("dropout" in n for n in self.notes):
            self.notes.append(f"{self.where()} passes dropout_p={p['dropout_p']} to SDPA in eval mode: its output "
                              "is randomised; the captured probabilities are before dropout")
        scores = sdpa_scores(q, k, p["attn_mask"], bool(p["is_causal"]), p["scale"], bool(p["enable_gqa"]))
        probs = _probabilities(scores)
        diag = scores.diagonal(dim1=-2, dim2=-1) if self.scores else None
        if mechanism == MHA:
            self.mha_probs = probs
        if q.dim() == 3 and mechanism == SDPA:
            self.three_d(SDPA, probs, diag)
        else:
            self.flush()
            self.add(mechanism, probs, diag, scores=scores if self.scores else None)
        return out

    def mha(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = _MHA_SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        need, average = bool(a["need_weights"]), bool(a["average_attn_weights"])
        through_sdpa = _mha_through_sdpa()
        self.flush()
        if (not need or self.scores) and through_sdpa is not None:
            # torch's own code path, with its SDPA call recorded: the output stays exactly the module's (a probe
            # takes it whatever the caller asked, for the scores; the weights asked for are the recorded ones)
            a["need_weights"] = False
            _ACTIVE.recorder, self.mha_probs = self, None
            try:
                out, _none = through_sdpa(*bound.args, **bound.kwargs)
            finally:
                _ACTIVE.recorder = None
            if not need:
                return out, None
            weights = self.mha_probs
            if weights is None:
                return out, None
            weights = weights.to(out.dtype)
            if weights.dim() == 4 and out.dim() == 2:       # unbatched input: (H, L, S)
                weights = weights[0]
            return out, weights.mean(dim=-3) if average else weights
        a["need_weights"], a["average_attn_weights"] = True, False
        out, weights = _MHA_FN(*bound.args, **bound.kwargs)
        self.calls[MHA] += 1
        self.add(MHA, weights if weights.dim() == 4 else weights.unsqueeze(0))
        if not need:
            return out, None
        return out, weights.mean(dim=-3) if average else weights


def _keys_last(shape: tuple[int, ...], dim: Any) -> tuple[int, ...] | None:
    """The axis order that makes a softmax over `dim` of a 3-D or 4-D `shape` attention laid out as usual --
    (others..., T_q, T_k) -- when its token axes are not already the last two and the softmax is not over the last
    axis: exactly two axes as long as the softmax's (> 1), the softmax's among them (the keys), the other the
    queries; None for anything else (the usual layouts, or a softmax over the query axis of (..., T, T) scores,
    which is not attention over the keys)."""
    nd = len(shape)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -nd <= dim < nd:
        return None
    dim %= nd
    if dim == nd - 1:       # over the last axis: the usual layouts, read as they are (or not attention)
        return None
    length = shape[dim]
    tokens = [i for i, n in enumerate(shape) if n == length]
    if length <= 1 or len(tokens) != 2 or tokens == [nd - 2, nd - 1]:
        return None
    query = tokens[0] if tokens[1] == dim else tokens[1]
    return tuple(i for i in range(nd) if i not in tokens) + (query, dim)


def _unfold(maps: torch.Tensor, batch: int, head_major: bool) -> torch.Tensor:
    """(B*H, ...) in call order -> (B, H, ...): index h*B + b with `head_major`, else b*H + h."""
    rest = tuple(maps.shape[1:])
    if head_major:
        return maps.reshape(-1, batch, *rest).transpose(0, 1)   # (H, B, ...) -> (B, H, ...)
    return maps.reshape(batch, -1, *rest)                        # (B, H, ...)


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
        out = func(*args, **kwargs)
        if (self.recorder.follow or self.recorder._tracked) and not torch.compiler.is_compiling():
            # (not in what torch.compile traces)
            self.recorder.followed(func, args, kwargs, out)
        return out


_SCALINGS = frozenset({torch.mul, _T.mul, _T.__mul__, _T.__rmul__, torch.div, _T.div, _T.__truediv__,
                       torch.true_divide, _T.true_divide})


def _by_constant(func: Any, args: tuple[Any, ...]) -> bool:
    """A multiplication or division by one number (a Python scalar or a one-element tensor)."""
    return func in _SCALINGS and len(args) == 2 and any(
        isinstance(a, (int, float)) or (isinstance(a, torch.Tensor) and a.numel() == 1) for a in args)


def _changed_by(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The name of a call that changes the values it is given; None for dropout that is off (p=0 or not training:
    nn.Dropout in eval mode)."""
    name = getattr(func, "__name__", None) or str(func)
    if func in _DROPOUTS:
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        train = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", True))
        if not train or not p:
            return None
        return f"{name}(p={p}) in training mode, which is random even in eval mode"
    return name


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
    the module that computes it; single-head maps still being grouped into a layer are added when it closes
    normally. With `last_linear` (the probe), a hook on each nn.Linear keeps the last output in
    `recorder.last_linear` (and its name). The mode and hooks are removed, and train/eval flags restored, in
    `finally`."""
    recorder.names = {id(m): name for name, m in module.named_modules()}
    recorder.rank = {key: i for i, key in enumerate(recorder.names)}
    handles = []
    try:
        if last_linear:
            handles = [m.register_forward_hook(partial(_keep_output, recorder, name))
                       for name, m in module.named_modules() if isinstance(m, nn.Linear)]
        with _evaluating(module), _AttentionMode(recorder):
            yield recorder
            recorder.finish()
    finally:
        for h in handles:
            h.remove()


def _keep_output(recorder: _Recorder, name: str, _module: nn.Module, _args: Any, output: Any) -> None:
    recorder.last_linear, recorder.last_linear_name = output, name


def _run(module: nn.Module, x: torch.Tensor, recorder: _Recorder, last_linear: bool = False) -> Any:
    """The module's own forward of `x` under capture; None when it was stopped after the last wanted layer."""
    try:
        with watch_attention(module, recorder, last_linear):
            return module(x)
    except _StopForward:
        return None


# ---------------------------------------------------------------------------------------------------------------
# Token order and what a pass saw, said


def _prefix_first(tokens: int, prefix: int) -> tuple[int, ...]:
    """The token order that shows `prefix` tokens the module puts last first: indices into its own order."""
    return tuple(range(tokens - prefix, tokens)) + tuple(range(tokens - prefix))


def _refuse_non_finite(maps: np.ndarray, layers: Sequence[tuple[str, str]], source: str, what: str) -> None:
    """Attention (B, L, H, T, T) with NaN or infinity is not shown: the error names the layers and heads."""
    total = np.add.reduce(maps, axis=None, dtype=np.float32)
    if np.isfinite(total):
        return
    bad = ~np.isfinite(maps).all(axis=(-2, -1))           # (B, L, H)
    where = [f"layer {i} ({layers[i][0] if i < len(layers) else '?'}) head(s) "
             f"{', '.join(map(str, np.flatnonzero(bad[:, i].any(0)).tolist()))}"
             for i in range(bad.shape[1]) if bad[:, i].any()]
    raise NonFiniteError(f"{source}: its own code computed NaN or infinite attention for {what}, in "
                         f"{'; '.join(where[:4])}{' ...' if len(where) > 4 else ''}; expected finite attention maps "
                         "-- nothing was drawn or written from them (did its arithmetic overflow: float16, a fully "
                         "masked row, a division by zero?)")


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
