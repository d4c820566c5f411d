"""Exporting a windowed model's maps (Swin, SAM / ViTDet): per block and head, the attention each patch receives
(`received`), a patch query's attention inside its window (`query:N`) and the attention a patch receives there
(`key:N`), drawn over the image.

The export machinery is the plain export's (`vitviz.batch.pipeline.Exporter`: images read ahead in threads, one
forward pass per batch, PNGs written atomically in threads, images whose files all exist skipped, interrupts and a
full disk handled the same way); only the forward pass and the drawing differ, so `WindowedExporter` overrides just
those. File names come from `vitviz.batch.plan.output_name` with the block index as the layer:
`{image}_received_L{block}_H{head}.png`, `{image}_query17_L{block}_H{head}.png`; the .npz holds every block's
(windows, heads, n, n) attention and the grid cell of each window token (`WindowedMaps.arrays`, the
window's holder, so the window and the export cannot drift).

A block's heads are its stage's: --which-heads all gives each block all of its own, and a head index a block does
not have is left out for that block. The colour scale shared by 'shared' is over the blocks of one stage (the
grids differ between stages).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vitviz.batch.pipeline import Exporter, Prepared
from vitviz.batch.plan import Combo, LayerSel, Plan, resolve_picks
from vitviz.core import files
from vitviz.core.analyses.mapkinds import KINDS, WINDOWED_KINDS, unavailable
from vitviz.core.analyses.maps import HeadSel, MapKind, MapStack, SelectionError
from vitviz.core.drawing.render import draw_map
from vitviz.core.analyses.winmaps import cell_of_token
from vitviz.core.analyses.winview import WindowedMaps
from vitviz.core.protocol import WINDOWS
from vitviz.core.winspec import WindowedResult, WindowedSpec
from vitviz.errors import VitvizError

WINDOWED_MAPS_HELP = ("windowed models (Swin, SAM / ViTDet): received (the attention each patch receives, stitched "
                      "from its windows), query:N (patch N's attention inside its window, N in the first stage's "
                      "grid, row-major) and key:N (the attention patch N receives in its window); one map per block "
                      "(--layers counts blocks) and head")


def check_window_maps(maps: list[MapKind], spec: WindowedSpec) -> None:
    """Refuse the maps a windowed model cannot give (the table of map kinds, asked as of a model with the WINDOWS
    capability), saying why and what to ask for instead."""
    for m in maps:
        if m.kind == "cls":
            raise SelectionError("this model has no CLS token (a windowed model: Swin, SAM / ViTDet), so the 'cls' "
                                 "map (export's default) is undefined; use --maps received (the attention each "
                                 "patch receives, stitched from its windows) or query:N (patch N's window attention)")
        why = unavailable(m, spec, frozenset({WINDOWS}))
        if m.kind == "rollout":
            why = ("rollout is not defined across Swin's patch merging (it is within one stage: "
                   "vitviz.core.analyses.winmaps.rollout_stack)")
        if why is not None:
            raise SelectionError(f"the {m.label} map is not made for windowed models ({why}); use --maps "
                                 f"{', '.join(KINDS[k].syntax for k in WINDOWED_KINDS if k != 'rollout')}")
        if m.token is not None:
            cell_of_token(spec, int(m.token))   # in range of the first stage's grid


def resolve_window_picks(layers: list[int | str], heads: list[int | str],
                         spec: WindowedSpec) -> tuple[list[LayerSel], list[HeadSel]]:
    """--layers as block indices (0..depth-1; 'last', 'all'), --which-heads against the most heads of any stage."""
    if "mean" in layers:
        raise SelectionError("a windowed model has no mean over blocks (its stages' grids differ); give block "
                             "indices (e.g. --layers last or 0-3)")
    return resolve_picks(layers, spec.depth, "block"), resolve_picks(heads, spec.num_heads, "head")


@dataclass(frozen=True)
class WindowedPlan(Plan):
    """A plan whose layers are a windowed model's blocks (`heads_per_block`: each block's head count)."""

    heads_per_block: tuple[int, ...] = ()

    def combos(self) -> list[Combo]:
        """Every (map, block, head) to draw: each block with the heads it has."""
        out: list[Combo] = []
        for m in self.maps:
            for layer in self.layers:
                count = self.heads_per_block[int(layer)]
                picks = [h for h in self.heads if not isinstance(h, int) or h < count]
                for head in picks:
                    if (m, layer, head) not in out:
                        out.append((m, layer, head))
        return out

    @property
    def rows(self) -> list[int] | None:
        return None

    @property
    def needs_attention(self) -> bool:
        return True

    @property
    def needs_pool(self) -> bool:
        return False


def windowed_plan(maps: list[MapKind], layers: list[int | str], heads: list[int | str], spec: WindowedSpec,
                  **fields: Any) -> WindowedPlan:
    """The plan of a windowed export, its maps and picks checked against `spec`; `fields` are `Plan`'s others
    (render, npz, half, overwrite, batch_size, workers)."""
    check_window_maps(maps, spec)
    blocks, picks = resolve_window_picks(layers, heads, spec)
    return WindowedPlan(maps=maps, layers=blocks, heads=picks,
                        heads_per_block=tuple(spec.heads_of(b) for b in range(spec.depth)), **fields)


def window_stack(result: WindowedResult, kind: MapKind, stage: int) -> MapStack:
    """The stack of one windowed map kind for the blocks of `stage` (the window's `WindowedMaps.stack`)."""
    return WindowedMaps(result).stack(kind, stage)


class WindowedExporter(Exporter):
    """`Exporter` for a `WindowedModel`: one captured forward pass per batch, then each image's windowed maps."""

    def _forward(self, batch: list[Prepared], writers: ThreadPoolExecutor) -> None:
        import torch

        plan, spec = self.plan, self.spec
        while len(self._writes) > plan.batch_size:   # two batches in flight, as the plain export's
            self._finish_oldest()
        try:
            x = torch.cat([p.x for p in batch])
            maps, out, fmap = self.model.forward_captured(x, plan.half, logits=plan.npz)
        except VitvizError as e:
            for p in batch:
                self._fail(p.job, e)
            return
        geometry = spec.geometry()
        for i, p in enumerate(batch):
            scores = out[i] if spec.num_classes else out[i][:0]
            result = WindowedResult(blocks=tuple(m[i] for m in maps), geometry=geometry, logits=scores,
                                    input=p.x[0].numpy(), image=p.display, spec=spec, source=str(p.job.path),
                                    features=None if spec.num_classes or not plan.npz else out[i],
                                    feature_map=None if fmap is None else fmap[i])
            self._writes.append((p.job, writers.submit(self._write, p, result)))

    def _write(self, p: Prepared, result: WindowedResult) -> None:  # type: ignore[override]
        """Render and atomically write one image's PNGs (and .npz); an output that exists is left alone."""
        job, plan = p.job, self.plan
        views = WindowedMaps(result)      # the window's holder: the same stacks and arrays as the window's
        input_hw = p.display.shape[:2]

        def draw(m: MapKind, layer: Any, head: Any) -> Any:
            g = result.geometry[int(layer)]
            return draw_map(views.stack(m, g.stage), g.index, head, p.region, input_hw, g.stride, plan.render)

        self._write_pngs(job, draw)
        if plan.npz and (plan.overwrite or not job.outputs[-1].exists()):
            self._save(job, job.outputs[-1],
                       lambda: files.write_arrays_atomic(job.outputs[-1], views.arrays(), plan.overwrite))
