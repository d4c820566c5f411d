"""What an export writes: parsing the map / layer / head selections, the plan, and the name of every output file.

No torch here. The maps themselves come from `vitviz.core.maps` and the pictures from `vitviz.core.render`, the
engine the window draws with; the names come from `output_name`, which the window's "Export all" calls too, so the
window and `vitviz export` write the same files under the same names:

- `cls`: the CLS token's attention over the patches.
- `mean` / `max`: the attention each patch receives, averaged / maximised over the patch queries (the window's
  map for models without a CLS token is `mean`).
- `token:N`: the attention row of token N (prefix tokens count: token 0 is CLS when the model has one).
- `rollout`: attention rollout through layers start..l for layer l (by default heads fused by mean, nothing
  discarded, residual 0.5, from layer 0, as the window's defaults); `rollout:N` rolls out token N instead of CLS.

Heads are reduced after the queries (head 'mean' of `mean` is the mean over heads of each head's mean over
queries), as in the window. Layer 'mean' is the mean of the per-layer maps.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from vitviz.batch.jobs import Job
from vitviz.core.maps import HeadSel, LayerSel, MapKind, SelectionError
from vitviz.core.render import RenderOptions
from vitviz.core.rollout import RolloutParams
from vitviz.core.spec import ModelSpec

Combo = tuple[MapKind, LayerSel, HeadSel]  # (map, layer, head)


def parse_maps(text: str) -> list[MapKind]:
    """'cls,rollout,token:5' -> MapKinds (rollout with the default settings), in order, without duplicates."""
    out: list[MapKind] = []
    for part in _parts(text, "maps"):
        item = MapKind.parse(part)
        if item not in out:
            out.append(item)
    return out


def parse_picks(text: str, what: str, words: tuple[str, ...]) -> list[int | str]:
    """'0-3,5,mean' -> [0, 1, 2, 3, 5, 'mean']; `words` are the keywords allowed besides indices and ranges."""
    out: list[int | str] = []
    for part in _parts(text, what):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if part in words:
            items: list[int | str] = [part]
        elif re.fullmatch(r"-\d+", part):  # counted from the end, as in Python: -1 is the last
            items = [int(part)]
        elif match:
            lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
            if hi < lo:
                raise SelectionError(f"{what} range {part!r} runs backwards; expected LOW-HIGH")
            items = list(range(lo, hi + 1))
        else:
            raise SelectionError(f"{what} {part!r}: expected indices (-1 is the last), ranges like 0-3, "
                                 f"or {', '.join(words)}")
        out.extend(i for i in items if i not in out)
    return out


def _parts(text: str, what: str) -> list[str]:
    parts = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not parts:
        raise SelectionError(f"empty {what} selection {text!r}")
    return parts


def resolve_picks(picks: list[int | str], size: int, what: str) -> list[int | str]:
    """Expand 'all' / 'last' against `size` and check every index is in range (negative ones become positive)."""
    out: list[int | str] = []
    for pick in picks:
        items = list(range(size)) if pick == "all" else [size - 1] if pick == "last" else [pick]
        for item in items:
            if isinstance(item, int) and not -size <= item < size:
                raise SelectionError(f"{what} {item} out of range: the model has {size} {what}s "
                                     f"(0-{size - 1}, or -{size}--1 from the end)")
            item = item + size if isinstance(item, int) and item < 0 else item
            if item not in out:
                out.append(item)
    return out


def check_maps(maps: list[MapKind], spec: ModelSpec) -> None:
    """Refuse maps the model cannot give: 'cls' without a CLS token, a token index past the last token, a rollout
    starting after the last layer."""
    for m in maps:
        if m.kind == "cls" and not (spec.cls_token and spec.num_prefix > 0):
            raise SelectionError("this model has no CLS token, so the 'cls' map is undefined; use --maps mean")
        query, what = (m.token, "token") if m.kind == "token" else (m.rollout.query, "rollout")
        if query is not None and not 0 <= int(query) < spec.num_tokens:
            raise SelectionError(f"{what}:{query} out of range: the model has {spec.num_tokens} tokens "
                                 f"({spec.num_prefix} prefix + {spec.grid[0]}x{spec.grid[1]} patches)")
        if m.kind == "rollout" and m.rollout.start >= spec.depth:
            raise SelectionError(f"rollout start layer {m.rollout.start} out of range: the model has {spec.depth} "
                                 f"layers (0-{spec.depth - 1})")


def with_rollout(maps: list[MapKind], params: RolloutParams) -> list[MapKind]:
    """The maps with `params` as the settings of every rollout (each rollout keeps its own query)."""
    return [MapKind("rollout", rollout=RolloutParams(params.fusion, params.discard, params.start, params.residual,
                                                     m.rollout.query)) if m.kind == "rollout" else m for m in maps]


def combos(maps: list[MapKind], layers: list[LayerSel], heads: list[HeadSel]) -> list[Combo]:
    """Every (map, layer, head) to draw, in order; rollout fuses the heads, so it has one head ('mean')."""
    out: list[Combo] = []
    for m in maps:
        for layer in layers:
            for head in (["mean"] if m.kind == "rollout" else heads):
                if (m, layer, head) not in out:
                    out.append((m, layer, head))
    return out


def output_name(stem: str, m: MapKind, layer: LayerSel, head: HeadSel) -> str:
    """`{image}_{map}_L{layer}_H{head}.png`, the name of one exported map, in the window as in `vitviz export`.

    The map part is `MapKind.label`: a rollout's carries any non-default setting (`rollout-max-d0.9-r0.3`), so a
    rerun with other settings writes new files instead of skipping the old ones as done; rollout has only head
    'mean'.
    """
    return f"{stem}_{m.label}_L{layer}_H{'mean' if m.kind == 'rollout' else head}.png"


def query_rows(maps: list[MapKind]) -> list[int] | None:
    """The only query rows these maps read (CLS and token maps), or None when a map needs whole matrices."""
    rows = [m.query_row for m in maps]
    return None if any(r is None for r in rows) else sorted({int(r) for r in rows if r is not None})


def safe_stem(path: Path) -> str:
    """A file-name-safe stem of an image path."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem or "image")


@dataclass(frozen=True)
class Plan:
    """What to export for every image (the rollout maps carry their settings)."""

    maps: list[MapKind]
    layers: list[LayerSel]
    heads: list[HeadSel]
    render: RenderOptions
    npz: bool = False
    half: bool = False
    overwrite: bool = False
    batch_size: int = 8
    workers: int = 2

    @property
    def rows(self) -> list[int] | None:
        """Query rows enough for every map (CLS / token maps without .npz): the capture keeps only those."""
        return None if self.npz else query_rows(self.maps)

    def combos(self) -> list[Combo]:
        """Every (map, layer, head) to draw; rollout has one head ('mean')."""
        return combos(self.maps, self.layers, self.heads)

    def jobs(self, pairs: list[tuple[Path, Path]], out: Path, stems: list[str]) -> list[Job]:
        """One job per (image, subfolder), its outputs named by `output_name` (+ `{stem}.npz`)."""
        todo = self.combos()
        jobs = []
        for i, ((path, sub), stem) in enumerate(zip(pairs, stems)):
            folder = out / sub
            outputs = [folder / output_name(stem, m, layer, head) for m, layer, head in todo]
            if self.npz:
                outputs.append(folder / f"{stem}.npz")
            jobs.append(Job(i, path, outputs))
        return jobs
