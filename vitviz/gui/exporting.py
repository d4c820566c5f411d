"""What the window exports, rendered with `vitviz.core.render` so the window and the CLI write identical PNGs.

No Qt here: the window asks for file names and confirmation, these functions render and write.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from vitviz.core import files, render as draw
from vitviz.core.maps import MapStack, ResultMaps, levels_for
from vitviz.gui.state import ViewState, map_label


def base_image(maps: ResultMaps, native: bool = True) -> np.ndarray:
    """What the map is drawn over: the region of the original image the model saw at the original's resolution
    (`native`), or the model-input image."""
    return draw.native_view(maps.result) if native else maps.result.image


def render(maps: ResultMaps, state: ViewState, heatmap_only: bool = False, colorbar: bool = True,
           layer: int | str | None = None, head: int | str | None = None,
           base: np.ndarray | None = None) -> np.ndarray:
    """The current map (or the given layer/head of it) over `base` (default: `base_image(maps)`, the original
    image's resolution, not the screen's).

    Returns:
        (H, W[ + colorbar], 3) uint8: the overlay with the state's colormap and opacity, or the bare heatmap.
    """
    stack = maps.stack_for(state)
    values = stack.select(state.layer if layer is None else layer, state.head if head is None else head)
    lo, hi = levels_for(state, values, stack)
    image = base_image(maps) if base is None else base
    size = (image.shape[0], image.shape[1])
    heat = draw.heatmap_image(_cover(values, maps), size, state.colormap, state.smooth, lo, hi)
    rgb = heat if heatmap_only else draw.overlay(image, heat, float(state.opacity))
    return draw.add_colorbar(rgb, state.colormap, lo, hi) if colorbar else rgb


def _cover(values: np.ndarray, maps: ResultMaps) -> np.ndarray:
    """The map padded (with its minimum) to cover the whole displayed image when the size is not a multiple of
    the patch size; otherwise unchanged."""
    h, w = maps.result.image.shape[:2]
    p = maps.result.spec.patch_size
    gh, gw = values.shape
    if gh * p >= h and gw * p >= w:
        return values
    ph, pw = -(-h // p), -(-w // p)
    out = np.full((ph, pw), float(values.min()), dtype=np.float32)
    out[:gh, :gw] = values
    return out


def image_stem(source: str) -> str:
    """A file-name-safe stem of the image path."""
    stem = Path(source).stem or "image"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem)


def all_map_paths(maps: ResultMaps, state: ViewState, folder: Path) -> list[tuple[Path, int, int | str]]:
    """(path, layer, head) for every layer × head map (heads, then 'mean' and 'max'; rollout: one per layer),
    named `{image}_{map}_L{layer}_H{head}.png`."""
    stack: MapStack = maps.stack_for(state)
    heads: list[int | str] = ["mean"] if stack.num_heads == 1 else [*range(stack.num_heads), "mean", "max"]
    stem, name = image_stem(maps.result.source), map_label(state)
    return [(folder / f"{stem}_{name}_L{layer}_H{head}.png", layer, head)
            for layer in range(stack.maps.shape[0]) for head in heads]


def export_all(maps: ResultMaps, state: ViewState, folder: Path, heatmap_only: bool = False,
               colorbar: bool = False, overwrite: bool = False) -> list[Path]:
    """Write every layer × head map of the current image into `folder` (atomically) and return the paths."""
    written, base = [], base_image(maps)
    for path, layer, head in all_map_paths(maps, state, folder):
        rgb = render(maps, state, heatmap_only, colorbar, layer=layer, head=head, base=base)
        written.append(files.write_png_atomic(path, rgb, overwrite=overwrite))
    return written


def export_png(maps: ResultMaps, state: ViewState, path: Path, heatmap_only: bool = False,
               colorbar: bool = True, overwrite: bool = False) -> Path:
    return files.write_png_atomic(path, render(maps, state, heatmap_only, colorbar), overwrite=overwrite)


def export_npz(maps: ResultMaps, path: Path, overwrite: bool = False) -> Path:
    return files.write_npz_atomic(path, maps.result, overwrite=overwrite)
