"""A result as a picture in one line, for notebooks: `vitviz.show(result)` and `AttentionResult._repr_png_`.

    result = vitviz.load("vit_b_16.pth").run("cat.jpg")
    vitviz.show(result)                                   # CLS attention, last layer, head mean, over the image
    vitviz.show(result, map="rollout", layer=-1)          # any map `vitviz export --maps` knows
    result                                                # in Jupyter: the same picture, rendered by _repr_png_
    vitviz.show(head_importance(model, "cat.jpg"))        # the layers × heads importance grid (drawing.importance)

Drawn by the same map engine and renderer as the window and `vitviz export`, so the picture is the PNG that
`vitviz export --maps cls --layers -1 --which-heads mean --style overlay --colorbar` writes for that image.

A windowed model's result (Swin, SAM / ViTDet: `WindowedResult`) shows its own maps, 'received' (the default) or
'query:N', of one block (`layer` counts blocks) and one of that block's heads.
"""
from __future__ import annotations

import io
import math
import numbers
from dataclasses import fields
from typing import Any

import numpy as np
from PIL import Image

from vitviz.core.analyses.mapkinds import KINDS, WINDOWED_KINDS, unavailable
from vitviz.core.analyses.maps import HeadSel, ImageMaps, LayerSel, MAP_KINDS, MapKind, ResultMaps, SelectionError
from vitviz.core.analyses.winmaps import cell_of_token
from vitviz.core.analyses.winview import holder_of
from vitviz.core.analyses.importance import HeadImportance
from vitviz.core.drawing.importance import draw_importance
from vitviz.core.drawing.render import RenderOptions, draw_map, native_view
from vitviz.core.protocol import WINDOWS, capabilities_of_spec, windowed
from vitviz.core.spec import AttentionResult
from vitviz.core.winspec import WindowedResult
from vitviz.errors import VitvizError

MAPS_SHOWN = ", ".join(KINDS[k].syntax for k in MAP_KINDS)      # every attention map (the table of map kinds)
RESULTS = (AttentionResult, WindowedResult)    # what a model's run returns, of either lane
# RenderOptions fields `show` takes besides its own arguments, with what each allows ('size' is `original`).
RENDER_CHOICES: dict[str, tuple[Any, ...]] = {"style": ("overlay", "heatmap"), "scale": ("shared", "own"),
                                              "smooth": (True, False), "colorbar_label": (True, False)}


class ShowError(SelectionError):
    """An argument of `vitviz.show` of the wrong type or out of range; the message names it and what it allows."""


def show(result: AttentionResult | WindowedResult | ImageMaps | HeadImportance, map: str = "cls",  # noqa: A002
         layer: LayerSel = -1, head: HeadSel = "mean", *, cmap: str = "viridis", opacity: float = 0.6, colorbar: bool = True, original: bool = True,
         **render: Any) -> Image.Image:
    """The map of one layer and head drawn over the image the model saw, as a PIL image.

    Every argument is checked as `vitviz export` checks its options, before anything is drawn: a wrong type or a
    value out of range (layer 99 of a 12-layer model, head 2.5, token:999, an unknown style) is a `ShowError` (a
    `VitvizError`) naming the argument and what it allows -- never clamped to another token's or layer's map.

    Args:
        result: a `model.run(...)` result, or its `ResultMaps` holding passes of their own too (the class relevance,
            a text prompt's LeGrad map, the token norms: `maps.add_relevance(...)`), whose maps it then draws; or a
            `HeadImportance` (`vitviz.core.analyses.importance.head_importance`), drawn as its layers × heads grid on
            the diverging colormap centred on 0 (`vitviz.core.drawing.importance`; the other arguments are maps').
        map: a map kind as `vitviz export --maps` spells it: 'cls', 'mean', 'max', 'rollout', 'token:N',
            'rollout:N', 'entropy' ('cls' on a model without a CLS token is the mean over the patch queries), a
            MAP head's 'pool', or a map of a pass the `ResultMaps` holds ('relevance', 'text:PROMPT', 'norms').
        layer: a layer index (negative from the end), 'last' or 'mean' over layers.
        head: a head index (negative from the end), 'mean' or 'max' over heads.
        cmap: a colormap name (`vitviz.core.drawing.colormaps.available_colormaps()`, '_r' reverses it).
        opacity: the heatmap's weight over the image, 0..1.
        original: draw over the region of the original image the model saw, at its resolution; else over the
            model input.
        **render: further `RenderOptions` fields: style ('overlay' / 'heatmap'), scale ('shared' / 'own'),
            smooth, colorbar_label (True / False).
    """
    if isinstance(result, HeadImportance):
        return Image.fromarray(draw_importance(result))
    maps = _holder(result)       # the one per-image holder of its lane: the maps the window and export draw
    spec = maps.result.spec
    can = capabilities_of_spec(spec)
    kind = _check_map(map, spec, maps, can)
    traits = spec.traits         # a windowed model's layers are its blocks, with no mean over them
    layer = _check_index("layer", layer, spec.depth, f"{traits.layer_word}s",
                         ("mean", "last") if traits.layer_mean else ("last",))
    layer = spec.depth - 1 if layer == "last" else layer
    heads = maps.heads_of(layer)
    head = _check_index("head", head, heads, f"heads in block {layer}" if traits.blocks else "heads", ("mean", "max"))
    _check_colormap(cmap)
    opacity = _check_unit("opacity", opacity)
    for name, value in (("colorbar", colorbar), ("original", original)):
        _check_choice(name, value, (True, False))
    for name, value in render.items():
        if name not in RENDER_CHOICES:
            known = sorted({f.name for f in fields(RenderOptions)} - {"size", "cmap", "opacity", "colorbar"})
            raise ShowError(f"show: unknown argument {name}={value!r}; expected one of map, layer, head, cmap, "
                            f"opacity, colorbar, original, {', '.join(known)}")
        _check_choice(name, value, RENDER_CHOICES[name])
    try:
        stack, row, stride = maps.view(kind, layer)
    except SelectionError as e:         # a map this result has not (rollout across Swin's patch merging)
        raise ShowError(f"show: map {map!r}: {e}") from None
    result = maps.result
    image = native_view(result) if original else result.image
    opts = RenderOptions(cmap=cmap, opacity=opacity, colorbar=colorbar, **render)
    rgb = draw_map(stack, row, head, np.asarray(image), tuple(result.input.shape[-2:]), stride, opts)
    return Image.fromarray(rgb)


def _holder(result: Any) -> ImageMaps:
    """The result's per-image holder (`ImageMaps`): the one given, or made for a result of either lane."""
    if not isinstance(result, RESULTS) and hasattr(result, "view_or_pending"):    # a holder: its result checked
        _check_result(getattr(result, "result", None))
        return result  # type: ignore[no-any-return]
    return holder_of(_check_result(result))


def _check_result(result: Any) -> AttentionResult | WindowedResult:
    if isinstance(result, RESULTS) and windowed(result):      # a windowed model's: blocks of windows
        return result
    if isinstance(result, AttentionResult):
        if getattr(result.attentions, "ndim", 0) != 4:
            raise ShowError(f"show: result's attentions have shape {getattr(result.attentions, 'shape', None)}; "
                            "expected (layers, heads, tokens, tokens), as model.run(...) returns them")
        return result
    if hasattr(result, "run") and hasattr(result, "spec"):
        raise ShowError("show: result is a model, not a result; expected model.run(image) (an AttentionResult)")
    raise ShowError(f"show: result is {_found(result)}; expected an AttentionResult, what model.run(image) returns")


def _check_map(map_name: Any, spec: Any, maps: ImageMaps, can: frozenset[str]) -> MapKind:  # noqa: A002
    shown = ", ".join(KINDS[k].syntax for k in WINDOWED_KINDS) if WINDOWS in can else MAPS_SHOWN
    if not isinstance(map_name, str):
        raise ShowError(f"show: map is {_found(map_name)}; expected a map name: {shown}")
    try:
        kind = MapKind.parse(map_name)
    except SelectionError as e:
        raise ShowError(f"show: map {map_name!r}: {e}") from None
    if kind.kind == "cls" and unavailable(kind.kind, spec, can) is not None:
        kind = MapKind("received")        # the default map of a model without a CLS token: what it shows first
    if WINDOWS in can:                    # the table of map kinds: the maps a windowed model gives
        why = unavailable(kind.kind, spec, can)
        if why is not None:
            raise ShowError(f"show: map {map_name!r}: {why}")
        if kind.token is not None:
            try:
                cell_of_token(spec, int(kind.token), maps.grid)
            except SelectionError as e:
                raise ShowError(f"show: map {map_name!r}: {e}") from None
        return kind
    why = unavailable(kind, spec) if kind.source not in ("gradients", "text") else None
    if why is not None and kind.kind not in MAP_KINDS:     # the table of map kinds: this model cannot give it
        raise ShowError(f"show: map {map_name!r}: {why}")
    if kind.kind not in MAP_KINDS and (kind.kind == "pca" or not maps.has(kind)):
        raise ShowError(f"show: map {map_name!r} needs a pass of its own, which a result does not hold; expected "
                        f"one of {MAPS_SHOWN} (`vitviz export --maps {map_name}` draws it)")
    query = kind.query            # a token argument (token:N, key:N, rollout:N) in range, as `vitviz export` asks
    if query is not None and not 0 <= int(query) < spec.num_tokens:   # never clamped
        name = KINDS[kind.kind].name
        raise ShowError(f"show: map {map_name!r}: {name}:{query} out of range: the model has {spec.num_tokens} "
                        f"tokens ({spec.num_prefix} prefix + {spec.grid[0]}x{spec.grid[1]} patches); expected "
                        f"{name}:0 to {name}:{spec.num_tokens - 1}")
    return kind


def _check_index(name: str, value: Any, size: int, what: str, words: tuple[str, ...]) -> int | str:
    if isinstance(value, str) and value in words:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if -size <= int(value) < size:
            return int(value) % size
        raise ShowError(f"show: {name} {int(value)} is out of range: the model has {size} {what} (0-{size - 1}, "
                        f"or -{size}..-1 from the end); expected one of those or {' / '.join(map(repr, words))}")
    raise ShowError(f"show: {name} is {_found(value)}; expected an index 0-{size - 1} (negative from the end) or "
                    f"{' / '.join(map(repr, words))}")


def _check_colormap(cmap: Any) -> None:
    from vitviz.core.drawing.colormaps import available_colormaps, colormap

    if isinstance(cmap, str):
        try:
            colormap(cmap)
            return
        except VitvizError:
            pass
    raise ShowError(f"show: cmap is {_found(cmap)}; expected one of {', '.join(available_colormaps())} (a '_r' "
                    "suffix reverses it)")


def _check_unit(name: str, value: Any) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value)) and \
            0.0 <= float(value) <= 1.0:
        return float(value)
    raise ShowError(f"show: {name} is {_found(value)}; expected a number from 0 to 1")


def _check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if not any(value is c or (isinstance(c, str) and value == c) for c in choices):
        raise ShowError(f"show: {name} is {_found(value)}; expected {' or '.join(map(repr, choices))}")


def _found(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


def png_bytes(result: AttentionResult | WindowedResult | ResultMaps | HeadImportance) -> bytes:
    """`show(result)` encoded as PNG (what Jupyter displays for a result)."""
    buffer = io.BytesIO()
    show(result).save(buffer, format="PNG")
    return buffer.getvalue()


def _repr_png_(self: AttentionResult | WindowedResult | ResultMaps | HeadImportance) -> bytes:
    """The picture Jupyter shows for a result: `vitviz.show(result)` with its defaults, as PNG."""
    return png_bytes(self)


def _repr_html_(self: AttentionResult | WindowedResult | ResultMaps) -> str:
    """Jupyter's rich view of a result: its picture (`_repr_png_`, inline) over its one-line summary (the repr:
    shapes, top class), so a notebook shows what the result is as well as what it looks like."""
    import base64
    import html

    data = base64.b64encode(png_bytes(self)).decode("ascii")
    text = html.escape(repr(self))
    return (f'<figure style="margin:0"><img src="data:image/png;base64,{data}" alt="{text}"/>'
            f"<figcaption><code>{text}</code></figcaption></figure>")


# Every result kind `show` draws displays itself as that picture in Jupyter (with its summary, as HTML). Attached
# here, where the drawing lives (the result classes sit below the renderer: a method importing it would be an
# import cycle); `vitviz.core.running.load` imports this module, so every loaded model's results have it.
for _kind in (AttentionResult, WindowedResult, ResultMaps, HeadImportance):
    _kind._repr_png_ = _repr_png_   # type: ignore[attr-defined]
    _kind._repr_html_ = _repr_html_   # type: ignore[attr-defined]
