"""What an export writes: parsing the map / layer / head selections, the plan, and the name of every output file.

No torch here. The maps themselves come from `vitviz.core.analyses.maps` and the pictures from `vitviz.core.drawing.render`, the
engine the window draws with; the names come from `output_name`, which the window's "Export all" calls too, so the
window and `vitviz export` write the same files under the same names:

- `cls`: the CLS token's attention over the patches.
- `mean` / `max`: the attention each patch receives, averaged / maximised over the patch queries (the window's
  map for models without a CLS token is `mean`).
- `token:N`: the attention row of token N (prefix tokens count: token 0 is CLS when the model has one).
- `rollout`: attention rollout through layers start..l for layer l (by default heads fused by mean, nothing
  discarded, residual 0.5, from layer 0, as the window's defaults); `rollout:N` rolls out token N instead of CLS.

Windowed models (Swin, SAM / ViTDet) have maps of their own, made and drawn by `vitviz.batch.windowed`: `received`
and `query:N`, per block and head; the maps above are refused for them, and theirs for plain ViTs.

Heads are reduced after the queries (head 'mean' of `mean` is the mean over heads of each head's mean over
queries), as in the window. Layer 'mean' is the mean of the per-layer maps.

Maps of one class need a forward and backward pass per image, made only when one is asked for (`vitviz.core.
relevance`); CLASS is an index or a label of the model (without it: each image's top class):

- `relevance[:CLASS]`: Chefer et al.'s generic relevance, one map of the whole model: `{image}_relevance-c3_Lall.png`
  (`{image}_relevance_Lall.png` for the top class).
- `gradrollout[:CLASS]`: vit-explain's gradient rollout (discard ratio 0.9, as its code), `..._gradrollout-c3_Lall`.
- `attngrad[:CLASS]`: attention x gradient per layer and head, signed (colour scale -m..m):
  `{image}_attngrad-c3_L{layer}_H{head}.png`.

CLIP / SigLIP files whose text tower and tokenizer are at hand (`vitviz.core.analyses.text`; transformers or open_clip) also
explain a text prompt, one forward and backward pass per image and prompt:

- `text:PROMPT` (or `prompt:PROMPT`): LeGrad of the image-text similarity, one map of the whole model:
  `{image}_text-a_photo_of_a_cat-2c4f0e1a_Lall.png` (the prompt, file-name safe, and a short hash of it, so that
  prompts reading alike get files of their own; it may not hold a comma; the manifest maps each label to its
  prompt).

Maps of the blocks' output tokens need a pass of their own (`vitviz.core.analyses.features`), also only when asked for:

- `pca`: the DINOv2-style feature PCA colours of each layer of --layers, fitted on the image alone (a colour image;
  --cmap and --scale do not apply, --colorbar adds a legend): `{image}_pca_L{layer}.png`.
- `norms`: every patch's output-token norm (high-norm "artifact" tokens stand out), on a scale shared by all
  layers: `{image}_norms_L{layer}.png`.

Models that pool with a MAP head (SigLIP, Perception Encoder) have no CLS token; the head's latent query is their
"CLS", and its maps come from the attention pass with the head run:

- `pool`: the MAP head's attention over the patches, per pooling head (--which-heads counts the pooling head's
  heads), one map of the whole model: `{image}_pool_Lall_H{head}.png`.
- `rollout:pool`: the rollout of the pooling query (its heads fused by --fusion) through layers start..l:
  `{image}_rollout-pool_L{layer}_Hmean.png`.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vitviz.batch.jobs import Job, inside
from vitviz.core.analyses.mapkinds import unavailable
from vitviz.core.reading.validate import MAX_HEADS
from vitviz.core.analyses.maps import GRADIENT_KINDS, HeadSel, LayerSel, MapKind, SelectionError
from vitviz.core.drawing.render import RenderOptions
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.core.options import ABLATION_MODES
from vitviz.core.spec import ModelSpec
from vitviz.errors import VitvizError

Combo = tuple[MapKind, LayerSel, HeadSel]  # (map, layer, head)


def parse_maps(text: str) -> list[MapKind]:
    """'cls,rollout,token:5' -> MapKinds (rollout with the default settings), in order, without duplicates."""
    out: list[MapKind] = []
    for part in _parts(text, "maps", lower=False):  # a text prompt keeps its case; MapKind.parse lowers the rest
        item = MapKind.parse(part)
        if item not in out:
            out.append(item)
    return out


def parse_picks(text: str, what: str, words: tuple[str, ...], limit: int = MAX_HEADS) -> list[int | str]:
    """'0-3,5,mean' -> [0, 1, 2, 3, 5, 'mean']; `words` are the keywords allowed besides indices and ranges.

    An index at or past `limit` (no model vitviz opens has more: `MAX_DEPTH` layers, `MAX_HEADS` heads) is
    refused here, before a range is expanded, so '0-99999999999' costs nothing; the model's own count is checked
    by `resolve_picks`."""
    out: dict[int | str, None] = {}   # ordered, without duplicates, in linear time
    for part in _parts(text, what):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if part in words:
            items: Sequence[int | str] = [part]
        elif re.fullmatch(r"-\d+", part):  # counted from the end, as in Python: -1 is the last
            items = [int(part)]
        elif match:
            lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
            if hi < lo:
                raise SelectionError(f"{what} range {part!r} runs backwards; expected LOW-HIGH")
            items = range(lo, hi + 1)
        else:
            raise SelectionError(f"{what} {part!r}: expected indices (-1 is the last), ranges like 0-3, "
                                 f"or {', '.join(words)}")
        last = items[-1]
        if isinstance(last, int) and (last >= limit or last < -limit):
            raise SelectionError(f"{what} {part!r}: no model has {what} {last} (vitviz opens models of at most "
                                 f"{limit} {what}s); expected indices within the model's, e.g. 0-3 or -1")
        out.update(dict.fromkeys(items))
    return list(out)


def parse_ablation(text: str) -> tuple[list[tuple[int, int]], str]:
    """'3.1,5.2:mean' -> ([(3, 1), (5, 2)], 'mean'): the heads `vitviz export --ablate` ablates (LAYER.HEAD, by
    index) and the mode for all of them, zero (default), mean or resample (`vitviz.core.running.interventions`)."""
    body, _, mode = text.partition(":")
    mode = mode.strip().lower() or "zero"
    if mode not in ABLATION_MODES:
        raise SelectionError(f"--ablate mode {mode!r}; expected one of {', '.join(ABLATION_MODES)} after the "
                             "heads, e.g. 3.1,5.2:mean")
    heads: list[tuple[int, int]] = []
    for part in _parts(body, "ablate"):
        match = re.fullmatch(r"(\d+)\.(\d+)", part)
        if not match:
            raise SelectionError(f"--ablate head {part!r}: expected LAYER.HEAD (indices from 0), e.g. 3.1,5.2 or "
                                 "3.1:mean")
        pair = (int(match.group(1)), int(match.group(2)))
        if pair not in heads:
            heads.append(pair)
    return heads, mode


def _parts(text: str, what: str, lower: bool = True) -> list[str]:
    parts = [p.strip().lower() if lower else p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise SelectionError(f"empty {what} selection {text!r}")
    return parts


def resolve_picks(picks: list[int | str], size: int, what: str) -> list[int | str]:
    """Expand 'all' / 'last' against `size` and check every index is in range (negative ones become positive)."""
    out: dict[int | str, None] = {}
    for pick in picks:
        items = list(range(size)) if pick == "all" else [size - 1] if pick == "last" else [pick]
        for item in items:
            if isinstance(item, int) and not -size <= item < size:
                raise SelectionError(f"{what} {item} out of range: the model has {size} {what}s "
                                     f"(0-{size - 1}, or -{size}--1 from the end)")
            out[item + size if isinstance(item, int) and item < 0 else item] = None
    return list(out)


def check_maps(maps: list[MapKind], spec: ModelSpec) -> None:
    """Refuse maps the model cannot give: 'cls' without a CLS token, a token index past the last token, a rollout
    starting after the last layer, a MAP head's map of a model without one (`vitviz.core.analyses.mapkinds.unavailable`)."""
    for m in maps:
        why = unavailable(m, spec)
        if why is not None:
            raise SelectionError(why)


def check_classes(maps: list[MapKind], spec: ModelSpec) -> list[MapKind]:
    """The maps with every gradient map's class as an index of the model, without duplicates.

    A class is an index (0..C-1) or a label of `spec.labels`, matched without regard to case, as the whole label
    or one of its comma-separated names ('tabby' for 'tabby, tabby cat').

    Raises:
        SelectionError: a gradient map of a model without a classifier, an index out of range, a label the model
            does not have (the closest ones named), or one that names several classes.
    """
    out: list[MapKind] = []
    for m in maps:
        if m.kind in GRADIENT_KINDS:
            if spec.num_classes == 0:
                raise SelectionError(f"the {m.kind} map explains a class, but this model has no classifier (its output "
                                     "is a feature vector)")
            m = MapKind(m.kind, target=class_index(m.target, spec))
        if m not in out:
            out.append(m)
    return out


def class_index(target: int | str | None, spec: ModelSpec) -> int | None:
    """A class given as an index or a label (see `check_classes`) as an index of the model; None stays None (the
    top class)."""
    c = spec.num_classes
    if target is None:
        return None
    if isinstance(target, int):
        if not 0 <= target < c:
            raise SelectionError(f"class {target} out of range: the model has {c} classes (0-{c - 1})")
        return target
    wanted = " ".join(str(target).lower().split())
    labels = [" ".join(str(label).lower().split()) for label in spec.labels]
    hits = [i for i, label in enumerate(labels) if label == wanted]
    if not hits:
        hits = [i for i, label in enumerate(labels) if wanted in (n.strip() for n in label.split(","))]
    if len(hits) == 1:
        return hits[0]
    if hits:
        named = ", ".join(f"{i} ({spec.labels[i]!r})" for i in hits[:5])
        raise SelectionError(f"class {target!r} names {len(hits)} classes: {named}; give the index instead")
    if not spec.labels:
        raise SelectionError(f"class {target!r}: this model has no class labels; give an index 0-{c - 1}")
    import difflib

    close = difflib.get_close_matches(wanted, labels, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(spec.labels[labels.index(x)]) for x in close)}?" if close else ""
    raise SelectionError(f"class {target!r} is not a label of this model ({c} classes; give an index 0-{c - 1} "
                         f"or a label){hint}")


def check_layers(maps: list[MapKind], layers: list[LayerSel]) -> None:
    """Refuse layer 'mean' for PCA (a mean of colour images means nothing)."""
    if "mean" in layers and any(m.kind == "pca" for m in maps):
        raise SelectionError("the pca map has no mean over layers; give layer indices (e.g. --layers last or 0-3)")


def with_rollout(maps: list[MapKind], params: RolloutParams) -> list[MapKind]:
    """The maps with `params` as the settings of every rollout (each rollout keeps its own query)."""
    return [MapKind(m.kind, rollout=RolloutParams(params.fusion, params.discard, params.start, params.residual,
                                                  m.rollout.query))
            if m.kind in ("rollout", "poolrollout") else m for m in maps]


def combos(maps: list[MapKind], layers: list[LayerSel], heads: list[HeadSel],
           pool_heads: list[HeadSel] | None = None) -> list[Combo]:
    """Every (map, layer, head) to draw, in order. Rollout fuses the heads, and PCA and norms have none, so they
    have one head ('mean'); relevance, gradient rollout and the MAP head's 'pool' are one map of the whole model
    (layer 'all'); 'pool' takes `pool_heads` (the pooling head's; default `heads`)."""
    out: list[Combo] = []
    for m in maps:
        picks = pool_heads if m.kind == "pool" and pool_heads is not None else heads
        for layer in (layers if m.per_layer else ["all"]):
            for head in (picks if m.per_head else ["mean"]):
                if (m, layer, head) not in out:
                    out.append((m, layer, head))
    return out


def output_name(stem: str, m: MapKind, layer: LayerSel, head: HeadSel) -> str:
    """The name of one exported map, in the window as in `vitviz export`: `{image}_{map}_L{layer}_H{head}.png`;
    `{image}_{map}_L{layer}.png` for maps without heads (PCA, norms); `{image}_{map}_Lall.png` for a map of the
    whole model (relevance, gradient rollout), `{image}_{map}_Lall_H{head}.png` for one with heads (pool).

    The map part is `MapKind.label`: a rollout's carries any non-default setting (`rollout-max-d0.9-r0.3`), so a
    rerun with other settings writes new files instead of skipping the old ones as done; rollout has only head
    'mean'. A gradient map's carries its class (`relevance-c3`; `relevance` for the top class).
    """
    if not m.per_layer:
        return f"{stem}_{m.label}_Lall" + (f"_H{head}.png" if m.per_head else ".png")
    if m.kind in ("pca", "norms"):
        return f"{stem}_{m.label}_L{layer}.png"
    return f"{stem}_{m.label}_L{layer}_H{'mean' if m.kind in ('rollout', 'poolrollout') else head}.png"


def check_unique_names(todo: list[Combo], stem: str = "image") -> None:
    """Refuse two (map, layer, head) that `output_name` would give one file name: the second map would overwrite
    the first's file (or be skipped as done).

    Raises:
        SelectionError: naming both maps and the name."""
    seen: dict[str, Combo] = {}
    for combo in todo:
        name = output_name(stem, *combo)
        if name in seen and seen[name] != combo:
            first = seen[name][0]
            raise SelectionError(f"maps {_describe_map(first)} and {_describe_map(combo[0])} would both be written "
                                 f"as {name[len(stem) + 1:]}; expected maps with names of their own")
        seen[name] = combo


def _describe_map(m: MapKind) -> str:
    return f"text:{m.target!r}" if m.kind == "text" else repr(m.label)


def prompt_names(maps: list[MapKind]) -> dict[str, str]:
    """{label: prompt} of the text maps, for the manifest: which file holds which prompt."""
    return {m.label: str(m.target) for m in maps if m.kind == "text"}


def query_rows(maps: list[MapKind]) -> list[int] | None:
    """The only query rows the attention maps among these read (CLS and token maps), or None when one needs whole
    matrices (the rollout of the pooling query does); [] when none is an attention map."""
    rows = [m.query_row for m in maps if m.source == "attention" or m.kind == "poolrollout"]
    return None if any(r is None for r in rows) else sorted({int(r) for r in rows if r is not None})


def safe_stem(path: Path) -> str:
    """A file-name-safe stem of an image path."""
    return safe_name_stem(path.name)


def safe_name_stem(name: str) -> str:
    """`safe_stem` of a file name given as text (a listed image: no path object made): pathlib's stem, the name
    without its last suffix."""
    dot = name.rfind(".")
    stem = name[:dot] if 0 < dot < len(name) - 1 else name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem or "image")


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
    pool_heads: list[HeadSel] | None = None
    stream: bool = False   # the capture keeps only what the maps read, layer by layer (`streamable`)

    @property
    def rows(self) -> list[int] | None:
        """Query rows enough for every map (CLS / token maps without .npz): the capture keeps only those (one row,
        token 0, when only the MAP head's attention is wanted; [] when no attention map is)."""
        return captured_rows(self.maps, self.npz)

    @property
    def needs_attention(self) -> bool:
        """Whether the captured forward pass is needed: an attention map or a MAP head's, or the .npz (which holds
        attention)."""
        return self.npz or any(m.source in ("attention", "pool") for m in self.maps)

    @property
    def needs_pool(self) -> bool:
        """Whether a MAP head's attention is kept (its maps): the forward pass then runs through the head."""
        return any(m.source == "pool" for m in self.maps)

    @property
    def classes(self) -> list[int | None]:
        """The classes of the gradient maps, one forward and backward pass per image each (None: top class)."""
        out: list[int | None] = []
        for m in self.maps:
            if m.source == "gradients" and m.target not in out:
                out.append(m.target)  # type: ignore[arg-type]  # an index once `check_classes` has run
        return out

    @property
    def prompts(self) -> list[str]:
        """The text prompts of the text maps, one forward and backward pass per image each."""
        return [str(m.target) for m in self.maps if m.kind == "text"]

    @property
    def needs_features(self) -> bool:
        """Whether the token features are captured (the pca and norms maps)."""
        return any(m.source == "features" for m in self.maps)

    def combos(self) -> list[Combo]:
        """Every (map, layer, head) to draw; rollout has one head ('mean'), 'pool' the pooling head's."""
        return combos(self.maps, self.layers, self.heads, self.pool_heads)

    def jobs(self, pairs: list[tuple[Path, Path]], out: Path, stems: list[str]) -> list[Job]:
        """One job per (image, subfolder), its outputs named by `output_name` (+ `{stem}.npz`).

        Raises:
            SelectionError: two maps that would be written under one name (neither would be lost silently)."""
        todo = self.combos()
        check_unique_names(todo)
        jobs = []
        for i, ((path, sub), stem) in enumerate(zip(pairs, stems)):
            folder = out / inside(sub)
            outputs = [folder / output_name(stem, m, layer, head) for m, layer, head in todo]
            if self.npz:
                outputs.append(folder / f"{stem}.npz")
            jobs.append(Job(i, path, outputs))
        return jobs


class BudgetError(VitvizError):
    """An export whose images in flight do not fit the memory budget the user gave (`--memory`)."""


BATCH_BUDGET = 2 << 30   # bytes a batch's captured maps may take when --batch-size is not given
MOST_BATCH = 8           # the largest batch chosen on its own (the old default)


def streamable(maps: list[MapKind], npz: bool = False) -> bool:
    """Whether a capture can keep, of each layer as it is computed, only what these maps read and let the layer go
    (`Plan.stream`): a rollout among them, every other attention map a CLS / token map (its query rows), and nothing
    that needs the whole stack (.npz) or the MAP head's pass. A rollout then keeps each layer's heads fused (L, T, T)
    instead of the (L, H, T, T) stack: the maps of an image at 518 px are MiBs, not GiBs."""
    attention = [m for m in maps if m.source == "attention"]
    return (not npz and any(m.kind == "rollout" for m in attention) and not any(m.source == "pool" for m in maps)
            and all(m.kind == "rollout" or m.query_row is not None for m in attention))


def streamed_rows(maps: list[MapKind]) -> list[int]:
    """The query rows a streamed capture keeps (`streamable`): those of its CLS / token maps ([] for rollout
    alone)."""
    return sorted({int(m.query_row) for m in maps if m.source == "attention" and m.query_row is not None})


def captured_rows(maps: list[MapKind], npz: bool = False) -> list[int] | None:
    """The query rows a capture keeps for these maps (`Plan.rows`): those of the CLS / token maps without .npz
    (one row, token 0, when only the MAP head's attention is wanted; [] when no attention map is); None: all."""
    if npz:
        return None
    rows = query_rows(maps)
    return [0] if rows == [] and any(m.source == "pool" for m in maps) else rows


def _queries(spec: ModelSpec, maps: list[MapKind], npz: bool, stream: bool = False) -> int:
    """The query rows of each layer an image's capture holds: all T, or only the rows its maps read (a gradient
    map's passes hold whole matrices whatever the capture kept); `stream`: a streamed capture's (`streamable`)."""
    rows = streamed_rows(maps) if stream else captured_rows(maps, npz)
    return spec.num_tokens if rows is None or {m.kind for m in maps} & set(GRADIENT_KINDS) else len(rows)


def image_bytes(spec: ModelSpec, maps: list[MapKind], half: bool = False, npz: bool = False,
                stream: bool = False) -> int:
    """What one image holds while it is exported: its (L, H, T, T) attention -- only the query rows its maps read
    when that is all the capture keeps (`captured_rows`; `stream`: a streamed capture's, `streamable`), and then
    the (H, T, T) scores and softmax of the layer being computed too -- float16 with `half` (also with that
    layer's), a rollout its fused (L, T, T) stack and running product, a gradient map the maps' gradients too."""
    t, queries = spec.num_tokens, _queries(spec, maps, npz, stream)
    per_image = spec.depth * spec.num_heads * queries * t * (2 if half else 4)
    if half or queries < t:   # not written in place into the capture's array: one layer computed beside it
        per_image += 2 * spec.num_heads * t * t * 4
    kinds = {m.kind for m in maps}
    if kinds & {"rollout", "poolrollout"}:
        per_image += 2 * spec.depth * t * t * 4
    if kinds & set(GRADIENT_KINDS):
        per_image *= 3
    return per_image


def auto_batch_size(spec: ModelSpec, maps: list[MapKind], half: bool = False, budget: int | None = None,
                    free: int | None = None, npz: bool = False, stream: bool = False) -> tuple[int, str]:
    """The batch size `vitviz export` uses when the user sets none, and why: as many images per forward pass as
    fit the memory budget -- `budget` (the user's `--memory`, taken as given), else BATCH_BUDGET or a quarter of
    the `free` memory when that is less -- with two batches in flight (one running, one being written: the
    pipeline's bound); at least 1, at most MOST_BATCH. DINOv2 at 518 px (T = 1370) with rollout gets a batch of 1
    or 2, not 8.

    Raises:
        BudgetError: a `budget` that does not hold two images in flight (batch 1)."""
    from vitviz.core.running.runtime import format_bytes

    per_image = image_bytes(spec, maps, half, npz, stream)
    limit = budget or (min(BATCH_BUDGET, free // 4) if free else BATCH_BUDGET)
    check_budget(spec, maps, half, 1, budget, npz, stream)
    n = int(max(1, min(MOST_BATCH, limit // max(1, 2 * per_image))))
    kinds = {m.kind for m in maps}
    within = f"--memory {format_bytes(limit)}" if budget else format_bytes(limit)
    why = (f"batch size {n}: {format_bytes(per_image)} of attention per image ({_shape(spec, maps, npz, stream)}"
           f"{', rollout' if 'rollout' in kinds else ''}), two batches in flight within {within}; --batch-size N "
           "to choose")
    return n, why


def _shape(spec: ModelSpec, maps: list[MapKind], npz: bool, stream: bool = False) -> str:
    """'12 layers x 6 heads x 1374^2 tokens', or '... x 1 of 1374 query rows x 1374 tokens': what an image keeps."""
    t, queries = spec.num_tokens, _queries(spec, maps, npz, stream)
    return f"{spec.depth} layers x {spec.num_heads} heads x " + (f"{t}^2 tokens" if queries == t else
                                                                 f"{queries} of {t} query rows x {t} tokens")


def check_budget(spec: ModelSpec, maps: list[MapKind], half: bool, batch: int, budget: int | None,
                 npz: bool = False, stream: bool = False) -> None:
    """Refuse a `batch` whose two batches in flight (`image_bytes` each image) exceed the user's `budget` (none:
    nothing to check), naming what would fit.

    Raises:
        BudgetError: they do not fit."""
    from vitviz.core.running.runtime import format_bytes

    per_image = image_bytes(spec, maps, half, npz, stream)
    if budget is None or 2 * batch * per_image <= budget:
        return
    fits = budget // (2 * per_image)
    how = (f"--batch-size {fits} at most, or a larger --memory" if fits else
           f"--memory {format_bytes(2 * per_image)} at least{'' if half else ', or --half (half of it)'}")
    raise BudgetError(f"--memory {format_bytes(budget)}: {2 * batch} images in flight (two batches of {batch}: "
                      f"one running, one being written) hold {format_bytes(2 * batch * per_image)}, "
                      f"{format_bytes(per_image)} each ({_shape(spec, maps, npz, stream)}); expected {how}")
