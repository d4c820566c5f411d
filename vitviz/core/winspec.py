"""What a windowed model is (`WindowedSpec`) and what one run of it captured (`WindowedResult`), no torch.

Swin (v1 and v2) and the SAM / ViTDet image encoders attend inside windows, not over the whole image:

- Swin: stages of blocks at halving resolutions (patch merging between stages); every block attends inside
  M x M windows, every second one with the windows shifted by M // 2 (a cyclic roll of the grid, with a mask that
  keeps tokens the roll brought together from attending to each other); no class token, the head averages the
  last stage's tokens.
- SAM / ViTDet: one stage of plain ViT blocks, most attending inside M x M windows (no shift), a few globally,
  each with a decomposed relative position bias computed from q; a convolutional neck after the blocks.

A block's attention is therefore (windows, heads, window tokens, window tokens); `BlockGeometry` says where each
window token sits on the stage's grid (after the shift, with the padding tokens a window may hold), so that the
maps of `vitviz.core.analyses.winmaps` can place it over the image. The `(L, H, T, T)` contract of `AttentionResult` stays
for plain ViTs; these models have a result of their own.

`WindowedSpec` follows `ModelSpec`'s provenance rules (`vitviz.core.spec.provenance_kind`): every setting that
changes the computation has a source -- read, derived (shapes), named, given (an override) or assumed -- and an
assumed one is flagged wherever the model is shown (`assumptions`); `audit` is `audit_provenance` for this spec.
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from vitviz.core.options import WINDOWED_HOW_TO_PASS
from vitviz.core.summary import result_summary
from vitviz.core.spec import Preprocess, Provenanced, Traits, audit_provenance, top_classes

ARCHS = ("swin", "swinv2", "sam")
# How to say a windowed setting that no option of its route takes: a config or file name naming the model.
NAMING = "a config.json naming the model (timm architecture, transformers model_type), or its release file name"
# How a shifted block pads its grid to whole windows and rolls it: 'pad_roll' pads the bottom and right first,
# then rolls the padded grid (torchvision, transformers); 'roll_pad' rolls the grid, then pads (timm).
ORDERS = ("pad_roll", "roll_pad")
# Which window and shift a block uses at a run's grid: 'built' -- those it was built with at the native size
# (timm, transformers Swin v2: a window no larger than the stage's native grid, no shift where it covers it);
# 'fits' -- its own window always, no shift along a side that one window covers after padding (torchvision);
# 'min_side' -- no shift once the shorter side fits in one window (transformers Swin v1, at every run).
SHIFT_RULES = ("built", "fits", "min_side")

# Every field that changes what the model computes (each needs a provenance entry; tests keep the list whole),
# the pseudo-fields (settings with no field of their own), and the fields that do not change the computation.
COMPUTE_FIELDS = (
    "arch", "image_size", "patch_size", "in_chans", "depths", "heads", "dims", "mlp_hidden", "windows", "shifts",
    "pretrained_windows", "eps", "eps_embed", "eps_neck", "mlp_kind", "qkv_bias", "attn_kind", "rel_pos",
    "block_norm", "merge_norm", "patch_norm", "pos_embed", "pos_grid", "pos_interp", "order", "shift_rule",
    "mask_value", "final_norm", "neck", "neck_dim", "residual_blocks", "num_classes", "pooling", "preprocess",
)
PSEUDO_FIELDS = ("model_args", "nest_key")
OTHER_FIELDS = ("family", "source", "labels", "num_params", "provenance")


@dataclass(frozen=True)
class BlockGeometry:
    """Where one block's windows lie at one run.

    Attributes:
        block: the block's index over the whole model; stage / index: its stage and its place in the stage.
        grid: the stage's token grid (rows, cols) at this run.
        window: (rows, cols) of one window; the whole grid for a block with global attention.
        shift: the cyclic shift (rows, cols) of the grid before it is cut into windows ((0, 0): none).
        padded: the grid padded to whole windows (bottom and right; padding tokens are zeros).
        order: 'pad_roll' or 'roll_pad' (see ORDERS).
        is_global: the block attends over the whole grid (SAM / ViTDet global blocks).
        stride: input pixels per token of this stage (patch size x 2 ** stage for Swin).
    """

    block: int
    stage: int
    index: int
    grid: tuple[int, int]
    window: tuple[int, int]
    shift: tuple[int, int]
    padded: tuple[int, int]
    order: str
    is_global: bool
    stride: int

    @property
    def layout(self) -> tuple[int, int]:
        """Windows along (rows, cols)."""
        return (self.padded[0] // self.window[0], self.padded[1] // self.window[1])

    @property
    def num_windows(self) -> int:
        return self.layout[0] * self.layout[1]

    @property
    def window_tokens(self) -> int:
        return self.window[0] * self.window[1]

    @property
    def shifted(self) -> bool:
        return any(self.shift)

    def describe(self) -> str:
        """'windowed (7×7, shift 3)', 'windowed (7×7)' or 'global (64×64)'."""
        if self.is_global:
            return f"global ({self.grid[0]}×{self.grid[1]})"
        shift = "" if not self.shifted else (f", shift {self.shift[0]}" if self.shift[0] == self.shift[1]
                                             else f", shift {self.shift[0]}×{self.shift[1]}")
        return f"windowed ({self.window[0]}×{self.window[1]}{shift})"

    @cached_property
    def positions(self) -> np.ndarray:
        """(windows, window tokens) int64: the grid index r * cols + c of each window token, or -1 for a padding
        token. Windows are in row-major order of the padded (shifted) grid and tokens in row-major order inside
        their window, as the models cut them; each grid cell appears exactly once."""
        gh, gw = self.grid
        hp, wp = self.padded
        wh, ww = self.window
        sh, sw = self.shift
        i = np.arange(hp)[:, None]                                       # rows of the rolled, padded grid
        j = np.arange(wp)[None, :]
        if self.order == "pad_roll":   # rolled[i, j] = padded[(i + sh) % hp, (j + sw) % wp]
            r, c = (i + sh) % hp, (j + sw) % wp
            real = (r < gh) & (c < gw)
        else:                          # rolled then padded: a cell past the grid is padding
            real = (i < gh) & (j < gw)
            r, c = (i + sh) % gh, (j + sw) % gw
        index = np.where(real, r * gw + c, -1)                            # (hp, wp)
        nh, nw = self.layout
        cut = index.reshape(nh, wh, nw, ww).transpose(0, 2, 1, 3)        # (nh, nw, wh, ww)
        return np.ascontiguousarray(cut.reshape(nh * nw, wh * ww))

    @cached_property
    def slot_of(self) -> np.ndarray:
        """(gh * gw, 2) int64: for each grid cell, its (window, token) in `positions`."""
        out = np.zeros((self.grid[0] * self.grid[1], 2), np.int64)
        pos = self.positions
        w, t = np.nonzero(pos >= 0)
        out[pos[w, t]] = np.stack([w, t], axis=1)
        return out

    def regions(self) -> np.ndarray:
        """(windows, window tokens) int: the region of the shift mask each token belongs to (tokens of different
        regions of one window do not attend to each other); all 0 without a shift."""
        hp, wp = self.padded
        wh, ww = self.window
        sh, sw = self.shift
        if not self.shifted:
            return np.zeros((self.num_windows, self.window_tokens), np.int64)
        mask = np.zeros((hp, wp), np.int64)
        count = 0
        for h in (slice(0, -wh), slice(-wh, -sh), slice(-sh, None)):
            for w in (slice(0, -ww), slice(-ww, -sw), slice(-sw, None)):
                mask[h, w] = count   # the models' own slice assignment (a zero shift makes its slice the whole side)
                count += 1
        nh, nw = self.layout
        return mask.reshape(nh, wh, nw, ww).transpose(0, 2, 1, 3).reshape(nh * nw, wh * ww)

    def window_cells(self, window: int) -> np.ndarray:
        """(gh, gw) bool: the grid cells window `window` holds (after the shift: a window rolled across the edge
        holds cells from both sides)."""
        out = np.zeros(self.grid[0] * self.grid[1], bool)
        pos = self.positions[window]
        out[pos[pos >= 0]] = True
        return out.reshape(self.grid)

    def to_dict(self) -> dict[str, Any]:
        return {"block": self.block, "stage": self.stage, "index": self.index, "grid": list(self.grid),
                "window": list(self.window), "shift": list(self.shift), "padded": list(self.padded),
                "order": self.order, "global": self.is_global, "stride": self.stride,
                "attention": self.describe()}


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class WindowedSpec(Provenanced):
    """Everything vitviz knows about a windowed model (Swin v1 / v2, SAM / ViTDet), every switch that changes its
    numerics with its source (`provenance`, as `ModelSpec`'s; the entry 'identity' says whether the model is
    named).

    Per stage: `depths`, `heads`, `dims` (channel width), `mlp_hidden`, `pretrained_windows` (Swin v2's
    continuous bias normalises its coordinates by this window; (0, 0): the block's own). Per block (over all
    stages, in order): `windows` ((0, 0): global attention) and `shifts` as built at the native `image_size`.
    """

    compute_fields, pseudo_fields, other_fields = COMPUTE_FIELDS, PSEUDO_FIELDS, OTHER_FIELDS   # not fields

    family: str
    source: str
    arch: str
    image_size: tuple[int, int]
    patch_size: int
    in_chans: int
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    dims: tuple[int, ...]
    mlp_hidden: tuple[int, ...]
    windows: tuple[tuple[int, int], ...]
    shifts: tuple[tuple[int, int], ...]
    pretrained_windows: tuple[tuple[int, int], ...] = ()
    eps: float = 1e-5                 # the blocks' and the final norm's LayerNorm eps
    eps_embed: float = 1e-5           # the patch embedding's and the patch mergings' LayerNorm eps
    eps_neck: float = 1e-6            # SAM's neck LayerNorm2d eps
    mlp_kind: str = "gelu"
    qkv_bias: bool = True
    attn_kind: str = "dot"            # 'dot': softmax((q * scale) @ k^T + bias); 'cosine': Swin v2's scaled cosine
    rel_pos: str = "table"            # 'table' (Swin v1), 'cpb' (Swin v2's log-spaced MLP), 'decomposed' (SAM), ''
    block_norm: str = "pre"           # 'pre': x + f(norm(x)); 'res_post': x + norm(f(x)) (Swin v2)
    merge_norm: str = "before"        # patch merging: 'before' norm(4C) then reduce (v1); 'after' reduce then norm
    patch_norm: bool = True           # LayerNorm after the patch embedding (Swin)
    pos_embed: bool = False           # an absolute position table (SAM (1, gh, gw, D); transformers Swin's option)
    pos_grid: tuple[int, int] = (0, 0)
    pos_interp: str = "timm"          # its resampling at another grid (vitviz.core.posembed recipes)
    order: str = "roll_pad"
    shift_rule: str = "built"
    mask_value: float = -100.0        # what the shift mask adds between regions (transformers Swin v2 adds it twice)
    final_norm: bool = True
    neck: str = ""                    # SAM: 'conv' (1x1 conv, LN2d, 3x3 conv, LN2d), 'norm' (one LN2d) or ''
    neck_dim: int = 0                 # the conv neck's width (SAM: 256)
    residual_blocks: tuple[int, ...] = ()   # ViTDet: blocks followed by a convolutional bottleneck (x + f(x))
    num_classes: int = 0
    pooling: str = "avg"              # the head (or the features) average the last stage's tokens
    preprocess: Preprocess = field(default_factory=Preprocess)
    labels: tuple[str, ...] = ()
    num_params: int = 0
    provenance: tuple[tuple[str, str], ...] = ()

    # -------------------------------------------------------------------------------------------- structure
    @property
    def num_stages(self) -> int:
        return len(self.depths)

    @property
    def depth(self) -> int:
        """Blocks over all stages."""
        return sum(self.depths)

    @property
    def embed_dim(self) -> int:
        return self.dims[0]

    @property
    def grid(self) -> tuple[int, int]:
        """The patch grid of the first stage at `image_size`."""
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    @property
    def num_features(self) -> int:
        """Width of the pooled output (the head's input)."""
        return self.neck_dim if self.neck == "conv" else self.dims[-1]

    @property
    def num_heads(self) -> int:
        """The most heads of any stage (the heads of a block: `heads_of`)."""
        return max(self.heads)

    # what code written for plain ViTs asks of a spec: no prefix tokens, no class token
    num_prefix = 0
    prefix_names = ()
    cls_token = False
    windowed = True

    @property
    def traits(self) -> Traits:
        """Blocks counted over stages whose grids differ, none of the plain ViT's settings, and a position table
        only where it has an absolute one (SAM's)."""
        return Traits(blocks=True, plain_settings=False, pos_table=bool(self.pos_embed))

    def describe_guess(self, name: str) -> str:
        """'pooling is assumed: <why>; if that is wrong, pass <how>' for an assumed field: what the load warning,
        `vitviz info` and the window say (how: an option this route takes, else a config naming the model)."""
        source = self.source_of(name)
        why = re.sub(r"^(guess|assumed|default|family|table|layout):\s*", "", source)
        what = "a guess" if source.startswith("guess") else "assumed"
        return f"{name} is {what}: {why}; if that is wrong, pass {WINDOWED_HOW_TO_PASS.get(name, NAMING)}"

    def stage_of(self, block: int) -> tuple[int, int]:
        """(stage, index in the stage) of block `block`."""
        if not 0 <= block < self.depth:
            raise IndexError(f"block {block} out of range: the model has {self.depth} blocks (0-{self.depth - 1})")
        for s, d in enumerate(self.depths):
            if block < d:
                return s, block
            block -= d
        raise AssertionError("unreachable")

    def heads_of(self, block: int) -> int:
        return self.heads[self.stage_of(block)[0]]

    def stage_grids(self, image_size: tuple[int, int] | None = None) -> tuple[tuple[int, int], ...]:
        """Each stage's token grid at `image_size` (default: the spec's): the patch grid, then halved (rounded
        up: patch merging pads an odd side) at every stage after the first of a Swin."""
        h, w = image_size or self.image_size
        g = (h // self.patch_size, w // self.patch_size)
        out = [g]
        for _ in range(1, self.num_stages):
            g = ((g[0] + 1) // 2, (g[1] + 1) // 2)
            out.append(g)
        return tuple(out)

    def stride(self, stage: int) -> int:
        """Input pixels per token of `stage`."""
        return self.patch_size * (2 ** stage if self.arch != "sam" else 1)

    def geometry(self, image_size: tuple[int, int] | None = None) -> tuple[BlockGeometry, ...]:
        """Every block's windows at `image_size` (default: the native size), by the model's `shift_rule` and
        `order`. Raises ValueError where the original cannot run (transformers Swin v1 with a stage grid smaller
        than its window: its bias table no longer fits)."""
        grids = self.stage_grids(image_size)
        out = []
        b = 0
        for s, depth in enumerate(self.depths):
            g = grids[s]
            for i in range(depth):
                built, shift = self.windows[b], self.shifts[b]
                if built == (0, 0):   # global attention: one window, the whole grid, never padded
                    out.append(BlockGeometry(b, s, i, g, g, (0, 0), g, self.order, True, self.stride(s)))
                    b += 1
                    continue
                window = built
                if self.shift_rule == "fits":
                    padded = (_ceil_to(g[0], window[0]), _ceil_to(g[1], window[1]))
                    shift = tuple(0 if window[d] >= padded[d] else shift[d] for d in range(2))
                elif self.shift_rule == "min_side" and min(g) <= window[0]:
                    if min(g) < window[0]:
                        at = tuple(image_size or self.image_size)
                        raise ValueError(f"stage {s} has a {g[0]}x{g[1]} grid at {at} px, "
                                         f"smaller than its {window[0]}x{window[1]} window: transformers' Swin "
                                         "cannot run that size (its bias table no longer fits the window)")
                    shift = (0, 0)
                padded = (_ceil_to(g[0], window[0]), _ceil_to(g[1], window[1]))
                out.append(BlockGeometry(b, s, i, g, window, tuple(shift), padded, self.order, False,
                                         self.stride(s)))
                b += 1
        return tuple(out)

    def describe_blocks(self) -> list[str]:
        """One line per block at the native size: 'stage 0 block 1: windowed (7×7, shift 3)'."""
        return [f"stage {g.stage} block {g.index}: {g.describe()}" for g in self.geometry()]

    def stages(self) -> list[dict[str, Any]]:
        """Per stage at the native size: depth, heads, width, window(s), grid (for info and the window's model
        panel)."""
        geo = self.geometry()
        out = []
        for s, grid in enumerate(self.stage_grids()):
            blocks = [g for g in geo if g.stage == s]
            kinds = sorted({g.describe() for g in blocks})
            out.append({"stage": s, "depth": self.depths[s], "heads": self.heads[s], "dim": self.dims[s],
                        "grid": list(grid), "stride": self.stride(s), "attention": kinds})
        return out

    # ------------------------------------------------------------------------------------------- provenance
    def relevant(self, name: str) -> bool:
        """Whether field `name` changes what this model computes (e.g. the shift mask only with shifted blocks,
        the position resampling only away from the stored grid, the neck's eps only with a neck)."""
        if name in OTHER_FIELDS or name == "identity":
            return False
        if name in PSEUDO_FIELDS:
            return name in dict(self.provenance)
        swin = self.arch != "sam"
        shifted = any(any(s) for s in self.shifts) or self.shift_rule != "built"
        conditional = {
            "pretrained_windows": self.rel_pos == "cpb", "eps_neck": bool(self.neck),
            "eps_embed": swin, "merge_norm": swin and self.num_stages > 1, "patch_norm": swin,
            "pos_grid": self.pos_embed, "pos_interp": self.pos_embed and tuple(self.grid) != tuple(self.pos_grid),
            "order": swin and shifted, "mask_value": swin and shifted, "shift_rule": swin, "shifts": swin,
            "mlp_kind": True,
            "pooling": True, "neck": not swin, "neck_dim": self.neck == "conv", "final_norm": swin,
            "residual_blocks": bool(self.residual_blocks),
        }
        return conditional.get(name, True)

    @property
    def heads_guessed(self) -> bool:
        return self.source_of("heads").startswith("guess")

    def token_name(self, index: int) -> str:
        r, c = divmod(index, self.grid[1])
        return f"patch ({r}, {c})"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["grid"] = list(self.grid)
        out["depth"] = self.depth
        out["stages"] = self.stages()
        out["blocks"] = [g.to_dict() for g in self.geometry()]
        out["provenance"] = dict(self.provenance)
        out["assumptions"] = dict(self.assumptions)
        out["guesses"] = dict(self.guesses)
        out["provenance_kinds"] = self.kinds()
        out["notes"] = dict(self.notes)
        out["windowed"] = True
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=list)


def audit(spec: WindowedSpec) -> list[str]:
    """`vitviz.core.spec.audit_provenance` over a windowed spec's own settings: a setting that changes the
    computation with no entry, with a source of no known kind, or assumed and not flagged (empty when none)."""
    return audit_provenance(spec)


@dataclass(frozen=True, eq=False)
class WindowedResult:
    """What one forward pass of a windowed model captured.

    Attributes:
        blocks: per block, (windows, heads, window tokens, window tokens) post-softmax attention, float32 (or
            float16 when asked); rows sum to 1 (over the window's tokens, padding included). A global block is
            one window of the whole grid.
        geometry: per block, where its windows lie at this run (`BlockGeometry`).
        logits: (C,) class scores; (0,) for a model without a classifier.
        features: the pooled output (D,) of a model without a classifier (else None).
        feature_map: SAM's neck output (C, gh, gw) (else None).
        input / image / spec / source / source_box / source_size: as `AttentionResult`'s.
    """

    blocks: tuple[np.ndarray, ...]
    geometry: tuple[BlockGeometry, ...]
    logits: np.ndarray
    input: np.ndarray
    image: np.ndarray
    spec: WindowedSpec
    source: str = ""
    features: np.ndarray | None = None
    feature_map: np.ndarray | None = None
    source_box: tuple[float, float, float, float] | None = None
    source_size: tuple[int, int] | None = None

    @property
    def grid(self) -> tuple[int, int]:
        return self.spec.grid

    num_prefix = 0

    def __repr__(self) -> str:
        return result_summary(self)   # shapes and the top class, never the arrays

    def attention(self, block: int) -> np.ndarray:
        """Block `block`'s (windows, heads, n, n) attention."""
        return self.blocks[block]

    def spec_line(self, block: int) -> str:
        """'stage 1 block 0: windowed (7×7, shift 3)' for block `block` at this run."""
        g = self.geometry[block]
        return f"stage {g.stage} block {g.index}: {g.describe()}"

    def top_k(self, k: int = 5) -> list[tuple[int, str, float]]:
        """The k most probable classes as (index, label, probability); empty without a classifier."""
        return top_classes(self.logits, self.spec.labels, k)

    @property
    def nbytes(self) -> int:
        extra = sum(a.nbytes for a in (self.features, self.feature_map) if a is not None)
        return int(sum(a.nbytes for a in self.blocks) + self.logits.nbytes + self.input.nbytes
                   + self.image.nbytes + extra)

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays of an .npz: 'block{i}' (windows, heads, n, n) and 'block{i}_positions' (windows, n: grid
        index or -1 for padding) per block, 'logits', 'input', 'image', 'features' / 'feature_map' when present,
        'spec' (JSON) and 'geometry' (JSON)."""
        out: dict[str, np.ndarray] = {}
        for g, a in zip(self.geometry, self.blocks):
            out[f"block{g.block}"] = np.asarray(a)
            out[f"block{g.block}_positions"] = g.positions
        out.update(logits=np.asarray(self.logits), input=np.asarray(self.input), image=np.asarray(self.image),
                   spec=np.array(self.spec.to_json()), source=np.array(self.source),
                   geometry=np.array(json.dumps([g.to_dict() for g in self.geometry])))
        if self.features is not None:
            out["features"] = np.asarray(self.features)
        if self.feature_map is not None:
            out["feature_map"] = np.asarray(self.feature_map)
        return out
