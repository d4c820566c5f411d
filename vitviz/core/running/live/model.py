"""`LiveModel`: a user's `nn.Module` run as written, its attention captured, and `load_live`, which describes a
module (`vitviz.core.running.live.describe`) and wraps it."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.core.running.capture import ImageModel, LayerSink
from vitviz.core.running.live.describe import _per_image, _take, describe
from vitviz.core.running.live.errors import LiveModelError, UserCodeError, user_call, with_route
from vitviz.core.running.live.packing import PackedTower, is_packed, packed_tower
from vitviz.core.running.live.stages import (
    StagedModel, find_mask_units, find_windows_and_channels, load_mask_units, load_windows_and_channels,
)
from vitviz.core.running.live.record import (
    AttentionLayout, _layer_summary, _prefix_first, _Recorder, _refuse_non_finite, _run, _skipped_summary,
)
from vitviz.core.posembed import resample_pos_embed
from vitviz.core.protocol import ATTENTION, EARLY_STOP, POS_TABLE, ROWS
from vitviz.core.running.runtime import check_host_memory
from vitviz.core.spec import ModelSpec
from vitviz.errors import DeviceError, NonFiniteError, VitvizError


class LiveModel(ImageModel):
    """A user's `nn.Module`, run as written, with its attention captured (see `vitviz.core.running.live`).

    It satisfies `vitviz.core.protocol.Model` as `VitModel` does, without being one: its capabilities are the
    captured attention (early stop, rows) and its position table when it has one -- no gradients, block outputs or
    MAP head, which need the reference ViT's hooks.

    `net` is the user's module itself. `layers` lists (module name, mechanism) per captured layer in the order the
    forward pass computes them; `skipped` lists attention calls that are not self-attention over all the image
    tokens (cross-attention, attention pooling, windows), as (module name, mechanism, shape). `layout` is how its
    attention is laid out (`AttentionLayout`: heads per call, token order), as its probe found it.
    """

    def __init__(self, module: nn.Module, spec: ModelSpec, device: torch.device, layers: list[tuple[str, str]],
                 skipped: list[tuple[str, str, tuple[int, ...]]], output: str, pos_name: str | None,
                 layout: AttentionLayout | None = None, what: str = "") -> None:
        super().__init__(module, spec, device)
        self.layers, self.skipped = layers, skipped
        self._output, self._pos_name = output, pos_name
        self.layout = layout or AttentionLayout()
        self._what = what

    @property
    def capabilities(self) -> frozenset[str]:
        """Its captured attention; its position table when it has a learned one."""
        return frozenset({ATTENTION, EARLY_STOP, ROWS} | ({POS_TABLE} if self._pos_name is not None else set()))

    def to(self, device: str | None) -> "LiveModel":
        """Move the user's module (never prepacked: its Linear layers are its own)."""
        self._move(device)
        return self

    @property
    def _dtype(self) -> torch.dtype:
        return next((p.dtype for p in self.net.parameters() if p.is_floating_point()), torch.float32)

    def forward_captured(self, x: torch.Tensor, half: bool = False, logits: bool = True,
                         upto: int | None = None, rows: Sequence[int] | None = None,
                         pool: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(B, C, H, W) -> attentions (B, L, H, T, T) and the model's output (B, K), as `VitModel.forward_captured`.

        `pool` is taken as every model takes it and stays empty: a pooling head in the module's own code is not
        a MAP head vitviz runs ('map_head' is not in `capabilities`); its attention, if it is self-attention
        over all the tokens, is among the layers, else among `skipped`.
        With `logits=False` the module's forward pass is stopped right after the attention of layer `upto`.
        Attention or an output with NaN or infinity (the user's model diverged, or overflowed in its own
        precision) is refused: a `LiveModelError` names the layer.
        """
        with self._lock, torch.inference_mode():
            return self._forward_live(x, half, logits, upto, rows)

    def forward_streamed(self, x: torch.Tensor, each: Any) -> np.ndarray:
        """(B, C, H, W) -> the model's output (B, K) as NumPy, each layer's attention (B, H, T, T) given to `each`
        as it is computed and kept by nobody (`vitviz.core.analyses.verify` compares layer by layer)."""
        with self._lock, torch.inference_mode():
            return self._forward_live(x, False, True, None, None, each)[1]

    def _forward_live(self, x: torch.Tensor, half: bool, logits: bool, upto: int | None,
                      rows: Sequence[int] | None, each: Any = None) -> tuple[np.ndarray, np.ndarray]:
        if logits and upto is not None:
            raise VitvizError("upto= stops the forward pass early, so it needs logits=False")
        if self.layout.per_image and x.shape[0] > 1:     # its own code computes attention one image at a time
            parts = [self._forward_live(x[i:i + 1], half, logits, upto, rows, each) for i in range(int(x.shape[0]))]
            return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
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
        if each is None:
            check_host_memory(self._maps_bytes(x, count, half, None if rows is None else len(rows)), x, half)
        packed = isinstance(self.net, PackedTower)
        if packed:    # its sequence's order depends on the grid (merge blocks, windows)
            layout = replace(self.layout, order=self.net.order(tuple(x.shape[-2:])))
        elif self.layout.order is None or len(self.layout.order) == tokens:
            layout = self.layout
        else:
            layout = replace(self.layout, order=_prefix_first(tokens, self.spec.num_prefix))
        recorder = _Recorder(int(x.shape[0]), tokens, each or sink.append, count, None if logits else count,
                             self.spec.num_heads, layout, chunks=packed)
        xd = x.to(self._device, self._dtype)
        out = user_call(lambda: _run(self.net, xd, recorder), self.spec.source, "the model's own forward",
                        f"input {tuple(x.shape)}")
        if len(recorder.layers) != count or recorder.extra:
            seen = len(recorder.layers) + recorder.extra
            raise LiveModelError(f"{self.spec.source}: this forward pass computed {seen} attention maps over "
                                 f"{tokens} tokens; {count} expected ({depth} when the model was loaded: "
                                 f"{_layer_summary(self.layers)}). {_skipped_summary(recorder.skipped)}")
        maps = sink.numpy() if each is None else np.zeros((x.shape[0], 0), np.float32)   # `each` took them
        _refuse_non_finite(maps, self.layers, self.spec.source, f"input {tuple(x.shape)}")
        if not logits:
            return maps, np.zeros((x.shape[0], 0), np.float32)
        main = _take(out, self._what) if self._output != "none" else None
        first = self.layout.order[0] if self.layout.order and self.spec.num_prefix else 0
        result = _per_image(main, int(x.shape[0]), self.spec.num_prefix, first).detach().float().cpu().numpy()
        if result.size and not np.isfinite(result).all():
            raise NonFiniteError(f"{self.spec.source}: its output ({self._what}) holds NaN or infinity for input "
                                 f"{tuple(x.shape)}; vitviz shows no scores a model did not compute")
        return maps, result

    def pos_embed(self, grid: tuple[int, int] | None = None) -> np.ndarray | None:
        """(N_pos, D) the module's learned position table (grid part resampled to `grid`; prefix rows first, as
        the maps are); None without one."""
        if self._pos_name is None:
            return None
        owner, _, leaf = self._pos_name.rpartition(".")
        table = getattr(self.net.get_submodule(owner), leaf)
        g = tuple(grid or self.spec.pos_grid)
        with torch.no_grad():
            pos = table.detach().float().cpu().reshape(1, -1, table.shape[-1])
            order = self.layout.order
            if order is not None and len(order) == pos.shape[1]:
                pos = pos[:, list(order)]
            if g != tuple(self.spec.pos_grid):
                pos = resample_pos_embed(pos, self.spec.pos_prefix, tuple(self.spec.pos_grid), g, self.spec.pos_interp)
        return pos[0].numpy()



def load_live(module: nn.Module, overrides: Mapping[str, Any], source: str | None = None,
              how: str = "") -> LiveModel | StagedModel:
    """Describe `module` by its probe forward passes and wrap it as a `LiveModel` (a Hiera or a DaViT as a `StagedModel`,
    shown per stage).

    The first probe (one seeded random image) finds the attention layers, heads, tokens and output; a second of two
    different images checks what one image cannot show (which tokens are the prefix: their own scores in the first
    layer do not depend on the image; how heads folded into the batch are ordered). A module that refuses a
    2-image batch keeps the usual layout, said as assumed.

    A vision tower whose forward takes packed patches and `grid_thw` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V:
    `vitviz.core.running.live.packing`) is wrapped to take images as its image processor hands them over.

    Args:
        module: any nn.Module taking a (B, C, H, W) image batch (or a packed-patch tower); it is used (and moved to
            `device`) in place.
        overrides: grid ((rows, cols) or N), num_prefix, image_size, in_chans, heads (checked), mean, std,
            interpolation, resize, crop_mode, labels, device (default: where the module is).
        source: what to call it (default '<ClassName object>').
        how: why the live path is used, for the provenance.

    Raises:
        UserCodeError: the module's own code raised (anything, SystemExit included) on every probe it was given.
        LiveModelError: it is left on the meta device, has NaN/infinite weights or attention, or its attention
            and tokens cannot be described (`NoAttentionError`: none seen).
        DeviceError: the probe input (or its attention) would not fit in memory.
    """
    if is_packed(module):
        source = source or f"<{type(module).__name__} object>"
        module = packed_tower(module, overrides.get("image_size"))
    named = source or f"<{type(module).__name__} object>"
    found = find_mask_units(module)
    if found is not None:   # Hiera: shown per stage, inside its mask units (`vitviz.core.running.live.stages`)
        return load_mask_units(module, found, overrides, named, how)
    davit = find_windows_and_channels(module)
    if davit is not None:   # DaViT: its spatial window blocks per stage, its channel blocks said
        return load_windows_and_channels(module, davit, overrides, named, how)
    try:
        d = describe(module, overrides, source, how)
    except (UserCodeError, DeviceError) as e:   # its forward refused the probe: said with the route that works
        routed = with_route(e)
        if routed is e:
            raise
        raise routed from e.__cause__
    return LiveModel(module, d.spec, d.device, d.layers, d.skipped, d.output, d.pos_name, d.layout, d.what)
