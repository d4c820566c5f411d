"""A result as a picture in one line, for notebooks: `vitviz.show(result)` and `AttentionResult._repr_png_`.

    result = vitviz.load("vit_b_16.pth").run("cat.jpg")
    vitviz.show(result)                                   # CLS attention, last layer, head mean, over the image
    vitviz.show(result, map="rollout", layer=-1)          # any map `vitviz export --maps` knows
    result                                                # in Jupyter: the same picture, rendered by _repr_png_

Drawn by the same map engine and renderer as the window and `vitviz export`, so the picture is the PNG that
`vitviz export --maps cls --layers -1 --which-heads mean --style overlay --colorbar` writes for that image.
"""
from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from vitviz.core.maps import HeadSel, LayerSel, MapKind, map_stack
from vitviz.core.render import RenderOptions, draw_map, native_view
from vitviz.core.spec import AttentionResult


def show(result: AttentionResult, map: str = "cls", layer: LayerSel = -1, head: HeadSel = "mean",  # noqa: A002
         *, cmap: str = "viridis", opacity: float = 0.6, colorbar: bool = True, original: bool = True,
         **render: Any) -> Image.Image:
    """The map of one layer and head drawn over the image the model saw, as a PIL image.

    Args:
        result: a `model.run(...)` result.
        map: a map kind as `vitviz export --maps` spells it: 'cls', 'mean', 'max', 'rollout', 'token:N' or
            'rollout:N' ('cls' on a model without a CLS token is the mean over the patch queries).
        layer: a layer index (negative from the end) or 'mean' over layers.
        head: a head index, 'mean' or 'max' over heads.
        original: draw over the region of the original image the model saw, at its resolution; else over the
            model input.
        **render: further `RenderOptions` fields (style='heatmap', scale='own', smooth=False, ...).
    """
    kind = MapKind.parse(map)
    stack = map_stack(result.attentions, kind, result.spec)
    image = native_view(result) if original else result.image
    opts = RenderOptions(cmap=cmap, opacity=opacity, colorbar=colorbar, **render)
    rgb = draw_map(stack, layer, head, np.asarray(image), tuple(result.input.shape[-2:]),
                   result.spec.patch_size, opts)
    return Image.fromarray(rgb)


def png_bytes(result: AttentionResult) -> bytes:
    """`show(result)` encoded as PNG (what Jupyter displays for a result)."""
    buffer = io.BytesIO()
    show(result).save(buffer, format="PNG")
    return buffer.getvalue()
