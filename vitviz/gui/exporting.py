"""What the window exports, through the engine `vitviz export` uses: the maps of `vitviz.core.analyses.maps`, the renderer
`vitviz.core.drawing.render.draw_map` and the file names of `vitviz.batch.plan.output_name`, so the window and the CLI
write the same files under the same names for the same choices.

No Qt here: the window asks for file names and confirmation, these functions render and write.

A windowed model's result (`vitviz.core.analyses.winview.WindowedMaps`) is drawn as `vitviz export` draws it
(`vitviz.batch.windowed`): the block's stage stack at its row, at the stage's stride, named by the block's index over
the model (`{image}_received_L{block}_H{head}.png`), every block with its own stage's heads; its .npz is
`WindowedMaps.arrays()`, the arrays `vitviz export --npz` writes.
"""
from __future__ import annotations

from pathlib import Path
import numpy as np

from vitviz.batch.plan import output_name, safe_stem
from vitviz.core import files
from vitviz.core.drawing import render
from vitviz.core.analyses.maps import HeadSel, ImageMaps, LayerSel
from vitviz.gui.state import ViewState, map_kind, map_label, render_options, view_of

__all__ = ["base_image", "render_view", "image_stem", "map_label", "all_map_paths", "export_all", "export_png",
           "export_npz", "native_size"]


def base_image(maps: ImageMaps, native: bool = True) -> np.ndarray:
    """What the map is drawn over: the region of the original image the model saw at the original's resolution
    (`native`), or the model-input image."""
    return render.native_view(maps.result) if native else maps.result.image


def render_view(maps: ImageMaps, state: ViewState, heatmap_only: bool = False, colorbar: bool = True,
                layer: LayerSel | None = None, head: HeadSel | None = None,
                base: np.ndarray | None = None, label: bool = False) -> np.ndarray:
    """The current map (or the given layer/head of it) over `base` (default: `base_image(maps)`, the original
    image's resolution, not the screen's), with the state's colormap, opacity, smoothing and scale; `label` names
    the colorbar (what the map is and which scale it uses).

    Returns:
        (H, W[ + colorbar], 3) uint8: the overlay, or the bare heatmap.
    """
    import dataclasses

    at = dataclasses.replace(state, layer=state.layer if layer is None else layer,
                             head=state.head if head is None else head, _listeners=[])
    stack, row, picked, stride = view_of(maps, at)     # a windowed model's: its block's stage, at its stride
    return render.draw_map(stack, row, picked, base_image(maps) if base is None else base,
                           maps.result.image.shape[:2], stride, render_options(state, heatmap_only, colorbar, label))


def image_stem(source: str) -> str:
    """A file-name-safe stem of the image path (`vitviz.batch.plan.safe_stem`)."""
    return safe_stem(Path(source))


def all_map_paths(maps: ImageMaps, state: ViewState, folder: Path) -> list[tuple[Path, LayerSel, HeadSel]]:
    """(path, layer, head) for every layer × head map of the current map (heads, then 'mean' and 'max'; rollout:
    one per layer), named as `vitviz export --layers all --which-heads all,mean,max` names them."""
    kind = maps.resolved(map_kind(state))
    stem = image_stem(maps.result.source)
    return [(folder / output_name(stem, kind, layer, head), layer, head) for layer, head in maps.picks(kind)]


def export_all(maps: ImageMaps, state: ViewState, folder: Path, heatmap_only: bool = False,
               colorbar: bool = False, overwrite: bool = False, label: bool = False,
               native: bool = True) -> list[Path]:
    """Write every layer × head map of the current image into `folder` (atomically) and return the paths; over
    the original image's region at its resolution (`native`), else over the model's input image."""
    written, base = [], base_image(maps, native)
    for path, layer, head in all_map_paths(maps, state, folder):
        rgb = render_view(maps, state, heatmap_only, colorbar, layer=layer, head=head, base=base, label=label)
        written.append(files.write_png_atomic(path, rgb, overwrite=overwrite))
    return written


def export_png(maps: ImageMaps, state: ViewState, path: Path, heatmap_only: bool = False,
               colorbar: bool = True, overwrite: bool = False, label: bool = False, native: bool = True) -> Path:
    """Write the current map as drawn by `render_view` to `path` (atomically); over the original image's region
    at its resolution (`native`), else over the model's input image."""
    rgb = render_view(maps, state, heatmap_only, colorbar, base=base_image(maps, native), label=label)
    return files.write_png_atomic(path, rgb, overwrite=overwrite)


def native_size(maps: ImageMaps) -> tuple[int, int]:
    """(height, width) in pixels of what an export at the original size is drawn over: the region of the original
    image the model saw (the model input's size when there is no original, e.g. a tensor input)."""
    box = maps.result.source_box
    if box is None:
        return tuple(maps.result.image.shape[:2])  # type: ignore[return-value]
    left, top, right, bottom = box
    return int(round(bottom - top)), int(round(right - left))


def export_npz(maps: ImageMaps, path: Path, overwrite: bool = False) -> Path:
    """Write the current result's arrays and spec (`vitviz.core.files.write_npz_atomic`), with every pass computed
    for it so far (class relevance, text prompts, token norms, feature PCA) from the one table `vitviz export
    --npz` uses too (`ImageMaps.arrays`); a windowed model's, `WindowedMaps.arrays()` as export writes them."""
    return maps.write_npz(path, overwrite)
