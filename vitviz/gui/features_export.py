"""What the Features dock exports, named and drawn as `vitviz export --maps pca,norms` names and draws them: the
file names of `vitviz.batch.plan.output_name`, the pictures of `vitviz.core.drawing.render` (`draw_colors` for the PCA
colours, `draw_map` on `ResultMaps.stack('norms')` for the norms), over the region of the original image the model
saw, with the view state's colormap, opacity, smoothing and scale.

No Qt here: the panel asks for the folder, these functions render and write.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from vitviz.batch.plan import output_name
from vitviz.core import files
from vitviz.core.drawing import render
from vitviz.core.analyses.maps import LayerSel, MapKind, ResultMaps
from vitviz.gui.state import ViewState, render_options

PCA, NORMS = MapKind("pca"), MapKind("norms")
JOINT_LABEL = "pca-joint"       # a PCA fitted on several images together (the CLI fits each image alone)


def _stem(maps: ResultMaps) -> str:
    from vitviz.batch.plan import safe_stem

    return safe_stem(Path(maps.result.source))


def _base(maps: ResultMaps, native: bool) -> np.ndarray:
    return render.native_view(maps.result) if native else maps.result.image


def pca_path(maps: ResultMaps, layer: int, folder: Path, joint: bool = False) -> Path:
    """`{image}_pca_L{layer}.png` (as `vitviz export --maps pca`), or `{image}_pca-joint_L{layer}.png` for colours
    fitted on several images together."""
    name = output_name(_stem(maps), PCA, layer, "mean")
    return folder / (name.replace("_pca_", f"_{JOINT_LABEL}_", 1) if joint else name)


def norms_path(maps: ResultMaps, layer: LayerSel, folder: Path) -> Path:
    """`{image}_norms_L{layer}.png`, as `vitviz export --maps norms`."""
    return folder / output_name(_stem(maps), NORMS, layer, "mean")


def render_pca(maps: ResultMaps, colors: np.ndarray, state: ViewState, heatmap_only: bool = False,
               colorbar: bool = False, native: bool = True) -> np.ndarray:
    """The PCA colours (gh, gw, 3) of this image over it (or bare), with the legend when `colorbar`."""
    r = maps.result
    return render.draw_colors(colors, _base(maps, native), r.image.shape[:2], r.spec.patch_size,
                              render_options(state, heatmap_only, colorbar))


def render_norms(maps: ResultMaps, layer: LayerSel, state: ViewState, heatmap_only: bool = False,
                 colorbar: bool = False, native: bool = True) -> np.ndarray:
    """The output-token norms of one layer over the image (or bare), on the state's scale."""
    r = maps.result
    return render.draw_map(maps.stack(NORMS), layer, "mean", _base(maps, native), r.image.shape[:2],
                           r.spec.patch_size, render_options(state, heatmap_only, colorbar))


def export_pca(maps: ResultMaps, colors: np.ndarray, layer: int, state: ViewState, folder: Path,
               joint: bool = False, heatmap_only: bool = False, colorbar: bool = False, overwrite: bool = False,
               native: bool = True) -> Path:
    """Write one image's PCA colours of block `layer` into `folder` (atomically) under `pca_path`."""
    rgb = render_pca(maps, colors, state, heatmap_only, colorbar, native)
    return files.write_png_atomic(pca_path(maps, layer, folder, joint), rgb, overwrite=overwrite)


def export_norms(maps: ResultMaps, layers: list[LayerSel], state: ViewState, folder: Path,
                 heatmap_only: bool = False, colorbar: bool = False, overwrite: bool = False,
                 native: bool = True) -> list[Path]:
    """Write the norms map of each of `layers` into `folder` (atomically) under `norms_path`."""
    return [files.write_png_atomic(norms_path(maps, layer, folder),
                                   render_norms(maps, layer, state, heatmap_only, colorbar, native),
                                   overwrite=overwrite) for layer in layers]
