"""The data that crosses boundaries: what a model is (`ModelSpec`) and what one run captured (`AttentionResult`).

Neither imports torch, so the GUI can hold and display them without loading torch on its own thread.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitviz.core.summary import result_summary
from vitviz.core.options import CROP_MODES
from vitviz.errors import VitvizError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def known_source(source: str) -> bool:
    """Whether `source` starts with a prefix `provenance_kind` knows (anything else is read as an assumption)."""
    text = str(source).strip().lower()
    return any(text.startswith(prefix) for prefix, _ in _KIND_OF_PREFIX)


def audit_provenance(spec: Any, fields: tuple[str, ...] | None = None) -> list[str]:
    """What is wrong with `spec`'s provenance, one line each (empty when nothing): a setting that changes the
    computation with no entry (it would be an assumption nobody described), a source whose kind is unknown, or
    an assumed setting that is not flagged. `infer_spec` runs it when VITVIZ_AUDIT is set (the test suite sets
    it, so every spec any test builds, of every family, is walked).

    `spec` is a `Provenanced` spec (a ModelSpec, the windowed models' `WindowedSpec`), `fields` the settings to
    walk (default: the spec's own `compute_fields` and `pseudo_fields`)."""
    prov = dict(spec.provenance)
    flagged = {name for name, _ in spec.guesses}
    problems = []
    for name in fields if fields is not None else spec.compute_fields + spec.pseudo_fields:
        if not spec.relevant(name):
            continue
        if name not in prov:
            problems.append(f"{name}: no provenance (where does {getattr(spec, name, '?')!r} come from?)")
        elif not known_source(prov[name]):
            problems.append(f"{name}: source {prov[name]!r} has no known kind (read/derived/named/given/verified/assumed)")
        elif spec.kind_of(name) == ASSUMED and name not in flagged and not (name.startswith("rope_")
                                                                              and "rope" in flagged):
            problems.append(f"{name}: assumed ({prov[name]}) but not flagged")
    if "identity" not in prov and spec.family != "live":
        problems.append("identity: nothing says whether the model is named")
    return problems


def parse_size(text: str) -> tuple[int, int]:
    """'224' -> (224, 224); '224x320' (or '224×320', '224*320') -> (224, 320). Raises ValueError otherwise."""
    parts = text.lower().replace("×", "x").replace("*", "x").split("x")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"invalid size {text!r}; expected N or HxW, e.g. 224 or 224x320") from None
    if len(nums) not in (1, 2) or min(nums) < 1:
        raise ValueError(f"invalid size {text!r}; expected N or HxW with positive numbers")
    return (nums[0], nums[-1])


def whole_patches(size: tuple[int, int], patch: int, at_least_one: bool = False) -> tuple[int, int]:
    """(h, w) rounded down to whole `patch` px patches, as the patch embedding drops the remainder. A side
    smaller than one patch becomes 0 (callers that need a patch reject it first), or one patch with
    `at_least_one`."""
    h, w = size[0] - size[0] % patch, size[1] - size[1] % patch
    return (max(patch, h), max(patch, w)) if at_least_one else (h, w)


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes the model's input tensor.

    `mode='center'`: resize the shorter side to `resize` (keeping the aspect ratio; for a non-square `crop` the
    image is scaled to cover `crop / crop_pct`), then center-crop to `crop`. `mode='squash'`: resize straight to
    `crop`, ignoring the aspect ratio (Hugging Face ViT).
    """

    crop: tuple[int, int] = (224, 224)
    resize: int = 248
    mode: str = "center"
    interpolation: str = "bicubic"
    mean: tuple[float, ...] = INCEPTION_MEAN
    std: tuple[float, ...] = INCEPTION_STD

    @classmethod
    def from_timm_cfg(cls, cfg: dict[str, Any], size: tuple[int, int], crop_pct: float = 0.875,
                      interpolation: str = "bicubic", mean: tuple[float, ...] = IMAGENET_MEAN,
                      std: tuple[float, ...] = IMAGENET_STD) -> "Preprocess":
        """timm's `pretrained_cfg` (crop_pct, interpolation, mean, std, crop_mode) as the eval recipe at `size`;
        what it leaves out comes from the arguments. The checkpoint reader (`hyperparams`) and the live path
        (`vitviz.core.running.live`) both read timm's settings here."""
        pct = float(cfg.get("crop_pct", crop_pct))
        return cls(crop=(int(size[0]), int(size[1])), resize=int(math.floor(min(size) / pct)),
                   mode="squash" if cfg.get("crop_mode") == "squash" else "center",
                   interpolation=str(cfg.get("interpolation", interpolation)),
                   mean=tuple(float(v) for v in cfg.get("mean", mean)),
                   std=tuple(float(v) for v in cfg.get("std", std)))

    def with_overrides(self, overrides: Any, in_chans: int) -> tuple["Preprocess", list[str]]:
        """The recipe with the user's `mean`, `std`, `interpolation`, `resize` and `crop_mode` (those not None),
        and the names of those given, in that order. Both the checkpoint reader and the live path apply them here.

        Raises:
            VitvizError: mean/std with another number of values than 1 or one per channel, an unknown crop mode,
                a resize below 1 px.
        """
        for key in ("mean", "std"):
            values = overrides.get(key)
            if values is not None and len(tuple(values)) not in (1, in_chans):
                raise VitvizError(f"{key} override has {len(tuple(values))} values; expected 1 or {in_chans} (one "
                                  "per channel)")
        if overrides.get("crop_mode") is not None and overrides["crop_mode"] not in CROP_MODES:
            raise VitvizError(f"crop_mode {overrides['crop_mode']!r}; expected one of {', '.join(CROP_MODES)}")
        if overrides.get("resize") is not None and int(overrides["resize"]) < 1:
            raise VitvizError(f"resize {overrides['resize']}; expected a positive size in pixels")
        fields: dict[str, Any] = {}
        changed: list[str] = []
        for key, attr in (("mean", "mean"), ("std", "std"), ("interpolation", "interpolation"), ("resize", "resize"),
                          ("crop_mode", "mode")):
            value = overrides.get(key)
            if value is not None:
                fields[attr] = (tuple(float(v) for v in value) if key in ("mean", "std")
                                else int(value) if key == "resize" else value)
                changed.append(key)
        return (dataclasses.replace(self, **fields) if fields else self), changed

    @staticmethod
    def overridden_source(source: str, changed: list[str]) -> str:
        """A recipe's provenance once `changed` settings were the user's: '...; mean, std overridden', and a guessed
        recipe whose statistics (mean and std) are both given is no longer a guess ('override: ...')."""
        if not changed:
            return source
        source += f"; {', '.join(changed)} overridden"
        if {"mean", "std"} <= set(changed) and source.startswith("guess"):
            source = "override: " + source.split(": ", 1)[1]
        return source

    def at_size(self, size: tuple[int, int]) -> "Preprocess":
        """The same recipe for another input size, keeping the resize/crop ratio."""
        ratio = self.resize / max(1, min(self.crop))
        return dataclasses.replace(self, crop=size, resize=int(round(min(size) * ratio)))


class GuessWarning(UserWarning):
    """A value the file does not hold was guessed or assumed (e.g. num_heads, the norm order); the message says how
    to pass the right one."""


# Where a value came from, in four kinds plus the caller's own word (see `provenance_kind`), and one a check earned:
# 'verified' -- a setting the file does not state that the comparison with an original implementation whose
# parameters fit the file exactly confirmed (`vitviz.core.analyses.verify`); no longer an assumption, never a 'given' one.
READ, DERIVED, NAMED, GIVEN, ASSUMED, VERIFIED = "read", "derived", "named", "given", "assumed", "verified"
PROVENANCE_KINDS = (READ, DERIVED, NAMED, GIVEN, VERIFIED, ASSUMED)
# Source prefixes and their kind, longest first where one is the start of another. A source nobody described
# (no entry, or a prefix not listed) is an assumption: silence is never read as certainty.
_KIND_OF_PREFIX = (
    ("override", GIVEN), ("given", GIVEN), ("remembered", GIVEN), ("verified", VERIFIED), ("model object", READ), ("metadata", READ), ("read", READ),
    ("capture", READ), ("not used", READ), ("live", READ), ("attribute", READ), ("shape", DERIVED), ("derived", DERIVED),
    ("named", NAMED), ("guess", ASSUMED), ("assumed", ASSUMED), ("default", ASSUMED), ("family", ASSUMED),
    ("table", ASSUMED), ("layout", ASSUMED),
)
# Settings that fill in for a model the file only names: they are facts of that model when it is named
# (`identity` is named), and conventions of a layout when it is not.
_CONVENTIONS = ("default", "family", "table", "layout")

# Every ModelSpec field that changes what the model computes from an image, and the pseudo-fields (settings with
# no field of their own) that can appear in the provenance. Each needs a provenance entry; an assumed one is
# flagged wherever the model is shown (`ModelSpec.assumptions`). tests/core/test_provenance.py keeps this list whole.
COMPUTE_FIELDS = (
    "image_size", "patch_size", "embed_dim", "depth", "num_heads", "in_chans", "mlp_hidden", "mlp_kind",
    "num_classes", "cls_token", "dist_token", "reg_tokens", "pos_embed", "pos_prefix", "pos_interp", "pos_grid",
    "eps", "eps_final", "qkv_bias", "qk_norm", "layer_scale", "patch_bias", "final_norm", "fc_norm", "pooling",
    "pre_logits", "head_dist", "attn_dim", "attn_scale", "attn_proj", "proj_bias", "mlp_bias", "block_norm",
    "patch_norm_in", "patch_norm", "patch_pad", "norm_kind", "pos_kind", "norm_extra", "pre_logits_act", "norm_pre",
    "head_bias", "embed_out",
    "attn_norm", "mlp_norm", "rope", "rope_theta", "rope_half", "rope_xy", "rope_offset", "rope_ref_grid",
    "rope_periods", "rel_pos", "rel_pos_mlp", "rel_pos_interp", "pool_heads", "pool_mlp", "pool_act", "pool_prefix",
    "preprocess",
)
PSEUDO_FIELDS = ("patch_order", "token_order", "patch_embed", "model_args", "resize_recipe", "nest_key")
# Fields that do not change the computation: what the model is called, its class names, its size.
OTHER_FIELDS = ("family", "source", "labels", "num_params", "provenance")


def provenance_kind(source: str, named: bool = False) -> str:
    """The kind of a provenance `source`: 'read' (a tensor, config or metadata in or beside the file), 'derived'
    (tensor shapes), 'named' (fixed by a model the file's config or the user names), 'given' (the caller's
    override) or 'assumed' (a convention, a family default, a guess).

    A family's default or table value ('default: ...', 'family: ...', 'table: ...') is named when the model itself
    is (`named`: a config names its architecture or model type), and assumed otherwise."""
    text = str(source).strip().lower()
    for prefix, kind in _KIND_OF_PREFIX:
        if text.startswith(prefix):
            if named and prefix in _CONVENTIONS:
                return NAMED
            return kind
    return ASSUMED


class Provenanced:
    """The provenance API a spec dataclass shares (`ModelSpec`, the windowed models' `WindowedSpec`): it has
    `provenance` ((field, source) pairs) and `relevant(name)`, and names its settings in the class attributes
    `compute_fields` (change the computation), `pseudo_fields` (settings with no field of their own) and
    `other_fields` (do not change it)."""

    compute_fields: tuple[str, ...] = ()
    pseudo_fields: tuple[str, ...] = ()
    other_fields: tuple[str, ...] = ()
    provenance: tuple[tuple[str, str], ...]

    def relevant(self, name: str) -> bool:  # pragma: no cover - every spec says its own
        raise NotImplementedError

    def folded(self, name: str) -> bool:
        """Whether an assumed `name` is said with another setting (one flag for both) rather than on its own."""
        return False

    def source_of(self, name: str) -> str:
        return dict(self.provenance).get(name, "default")

    @property
    def named(self) -> bool:
        """Whether a config or the caller names the model (its architecture, model type or arch), so that the
        family's defaults are facts of that model rather than conventions of a key layout."""
        return provenance_kind(self.source_of("identity")) in (READ, NAMED, GIVEN)

    def kind_of(self, name: str) -> str:
        """The provenance kind of field `name` ('read', 'derived', 'named', 'given' or 'assumed')."""
        return provenance_kind(self.source_of(name), self.named)

    @property
    def assumptions(self) -> tuple[tuple[str, str], ...]:
        """(field, source) of every setting that changes the computation and is assumed -- a convention, a family
        default of a model nobody named, or a guess -- in field order: each is flagged wherever the model is
        shown (info, GuessWarning, the window, the export manifest)."""
        prov = dict(self.provenance)
        return tuple((name, prov.get(name, "default: no provenance recorded"))
                     for name in self.compute_fields + self.pseudo_fields
                     if self.relevant(name) and self.kind_of(name) == ASSUMED and not self.folded(name))

    @property
    def guesses(self) -> tuple[tuple[str, str], ...]:
        """(field, source) of every value to flag and to ask the user about: the assumptions (a class-name list is
        not one: it never changes attention; see `notes`)."""
        return self.assumptions

    @property
    def notes(self) -> tuple[tuple[str, str], ...]:
        """(field, source) of assumed values that do not change the computation (e.g. ImageNet class names for a
        1000-class head): said quietly, never as a warning."""
        return tuple((k, v) for k, v in self.provenance
                     if k in self.other_fields and provenance_kind(v, self.named) == ASSUMED)

    def kinds(self) -> dict[str, str]:
        """{field: kind} for every field that changes the computation now."""
        return {name: self.kind_of(name) for name in self.compute_fields + self.pseudo_fields if self.relevant(name)}


@dataclass(frozen=True)
class Traits:
    """How a model is laid out, as its spec says itself (`ModelSpec.traits`, `WindowedSpec.traits`): what the
    window, export and the analyses ask instead of which kind of spec it is.

    blocks: its layers are blocks counted over stages whose grids differ (Swin, SAM / ViTDet): a layer selection
        names a block (its stage and place said beside it), each stage has its own head count, and there is no
        mean over them.
    plain_settings: the plain ViT's settings apply (Model settings, the assumed-settings dialog, provenance marks).
    pos_table: whether a position table may be asked for (a windowed model's only where it has an absolute one).
    """
    blocks: bool
    plain_settings: bool
    pos_table: bool

    @property
    def layer_word(self) -> str:
        """What one of its layers is called on an axis or a label: 'block' or 'layer'."""
        return "block" if self.blocks else "layer"

    @property
    def layer_mean(self) -> bool:
        """Whether its maps have a mean over layers (blocks over stages do not: the stages' grids differ)."""
        return not self.blocks


PLAIN_TRAITS = Traits(blocks=False, plain_settings=True, pos_table=True)   # a plain ViT's (and nothing loaded yet)


@dataclass(frozen=True)
class ModelSpec(Provenanced):
    """Everything vitviz knows about a loaded model, including every switch that changes its numerics.

    `provenance` maps a field name to where its value came from: 'metadata: <file/key>', 'shape: <key>',
    'named: <model>', 'table', 'family', 'default', 'override' or 'guess: <why>'; `provenance_kind` sorts each
    into read / derived / named / given / assumed, and `assumptions` lists what is assumed (flagged everywhere).
    The entry 'identity' says whether the model is named (a config names its architecture: the family's
    defaults are then that model's facts) or recognised by its key layout only.
    """

    compute_fields, pseudo_fields, other_fields = COMPUTE_FIELDS, PSEUDO_FIELDS, OTHER_FIELDS   # not fields

    family: str
    source: str
    image_size: tuple[int, int]
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    in_chans: int = 3
    mlp_hidden: int = 0
    mlp_kind: str = "gelu"            # 'gelu' | 'gelu_tanh' | 'quick_gelu' | 'swiglu'
    num_classes: int = 0
    cls_token: bool = True
    dist_token: bool = False
    reg_tokens: int = 0
    pos_embed: bool = True
    pos_prefix: int = 1               # how many leading prefix tokens the position embedding covers
    pos_interp: str = "timm"          # resampling recipe, see vitviz.core.posembed
    pos_grid: tuple[int, int] = (14, 14)   # grid the stored position embedding was trained at
    eps: float = 1e-6
    eps_final: float = 0.0            # eps of the final norms (norm, fc_norm, norm_extra) when it differs; 0: eps
    qkv_bias: bool = True
    qk_norm: bool = False
    layer_scale: bool = False
    patch_bias: bool = True
    final_norm: bool = True           # `norm` over all tokens before pooling
    fc_norm: bool = False             # norm after pooling
    pooling: str = "token"            # 'token' (token 0) | 'avg' (patches) | 'avg_all' (every token) | 'cls_avg'
                                      # | 'map' (a latent query attends over the tokens: SigLIP, PE; see pool_*)
    pre_logits: int = 0               # width of the pre-logits layer (Linear + pre_logits_act), 0 when absent
    head_dist: bool = False
    attn_dim: int = 0                 # attention width heads x head_dim (vit-pytorch dim_head); 0: embed_dim
    attn_scale: float = 0.0           # factor on q @ k^T; 0: head_dim ** -0.5
    attn_proj: bool = True            # output projection after attention (False: the heads' concat is the output)
    proj_bias: bool = True            # bias of the attention output projection
    mlp_bias: bool = True             # biases of mlp.fc1 / mlp.fc2
    block_norm: str = "pre"           # 'pre': x + f(norm(x)); 'post': norm(x + f(x)) (nn.TransformerEncoderLayer)
    patch_norm_in: bool = False       # LayerNorm over each flattened patch before the projection (dual patchnorm)
    patch_norm: bool = False          # LayerNorm after the patch projection
    norm_kind: str = "layer"          # the embed-dim norms: 'layer' (LayerNorm) | 'rms' (RMSNorm, weight only: AIMv2)
    patch_pad: int = 0                # zero padding of the patch projection conv (ViTPose: 2 px, so each patch
                                      # is shifted up-left by 2 px; the grid is unchanged while 2 * pad < patch)
    pos_kind: str = "learned"         # 'learned' (a stored table) | 'sincos2d' (computed, vit-pytorch SimpleViT) |
                                      # 'sincos1d' (computed over the token sequence, tutorial ViTs)
    norm_extra: bool = False          # a second LayerNorm over all tokens after `norm` (two stacked final norms)
    pre_logits_act: str = "tanh"      # activation after the pre-logits layer
    norm_pre: bool = False            # LayerNorm on the tokens before the blocks (CLIP `ln_pre`, Perception Encoder)
    head_bias: bool = True            # bias of the head (CLIP's `proj` has none)
    embed_out: int = 0                # width of an embedding projection head (CLIP `proj`): the output is an image
                                      # embedding (features), not class scores; 0: none
    attn_norm: bool = False           # LayerNorm on the heads' output before the projection (EVA-02 sub-LN)
    mlp_norm: bool = False            # LayerNorm after the MLP activation, before fc2 (EVA-02 `scale_mlp`)
    rope: str = ""                    # 2-D rotary embedding of the patch tokens' q and k: '' (none) | 'axial' (timm
                                      # Eva / EVA-02 / PE / RoPE-ViT axial) | 'dinov3' | 'mixed' (learned, per layer)
    rope_theta: float = 10000.0       # RoPE base (timm `rope_temperature`; DINOv3 100)
    rope_half: bool = False           # rotate-half pairs (i, i + hd/2) instead of interleaved pairs (2i, 2i+1)
    rope_xy: bool = False             # coordinates in (x, y) = (column, row) order (timm grid_indexing 'xy')
    rope_offset: float = 0.0          # added to the patch coordinates (timm `rope_grid_offset`)
    rope_ref_grid: tuple[int, int] = (0, 0)  # positions rescaled so the grid spans this one (EVA `ref_feat_shape`)
    rope_periods: bool = False        # the RoPE periods are stored in the file (original DINOv3) and used as stored
    rel_pos: str = ""                 # relative position bias (BEiT): '' | 'layer' (a table per block) | 'shared'
    rel_pos_mlp: int = 0              # hidden width of timm's log-coordinate relative position MLP (vit_relpos_*:
                                      # the bias computed for any grid); 0: a stored table (BEiT)
    rel_pos_interp: str = "timm"      # resampling of the bias table at another grid: 'timm' (BEiT's geometric
                                      # progression, linear) | 'hf' (transformers: bilinear)
    pool_heads: int = 0               # heads of the MAP pooling head (pooling 'map'); 0: num_heads
    pool_mlp: int = 0                 # hidden width of the MAP head's MLP
    pool_act: str = ""                # activation of the MAP head's MLP; '': mlp_kind
    pool_prefix: bool = False         # the MAP head also attends to the prefix tokens (timm Eva / PE)
    preprocess: Preprocess = field(default_factory=Preprocess)
    labels: tuple[str, ...] = ()
    num_params: int = 0
    provenance: tuple[tuple[str, str], ...] = ()

    @property
    def traits(self) -> Traits:
        """A plain ViT's layout: layers over one token grid, the plain settings, a position table to ask for."""
        return PLAIN_TRAITS

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid (rows, columns) at `image_size`."""
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    @property
    def prefix_names(self) -> tuple[str, ...]:
        """Names of the prefix tokens in token order, e.g. ('cls', 'reg0', 'reg1')."""
        names: list[str] = []
        if self.cls_token:
            names.append("cls")
        if self.dist_token:
            names.append("dist")
        names.extend(f"reg{i}" for i in range(self.reg_tokens))
        return tuple(names)

    @property
    def num_prefix(self) -> int:
        return len(self.prefix_names)

    @property
    def num_tokens(self) -> int:
        gh, gw = self.grid
        return self.num_prefix + gh * gw

    @property
    def attn_width(self) -> int:
        """Width of q, k and v: num_heads x head_dim (the embed dim unless the model says otherwise)."""
        return self.attn_dim or self.embed_dim

    @property
    def head_dim(self) -> int:
        return self.attn_width // self.num_heads

    @property
    def pool_num_heads(self) -> int:
        """Heads of the MAP pooling head (0 when the model has none)."""
        return (self.pool_heads or self.num_heads) if self.pooling == "map" else 0

    @property
    def position_kind(self) -> str:
        """How the model knows where a patch is: 'learned', 'sincos2d', 'rope', 'learned+rope', 'relative',
        'learned+relative' or 'none' (the position panel shows what applies)."""
        parts = [self.pos_kind] if self.pos_embed else []
        if self.rope:
            parts.append("rope")
        if self.rel_pos:
            parts.append("relative")
        return "+".join(parts) or "none"

    @property
    def heads_guessed(self) -> bool:
        """Whether num_heads is a guess (no metadata, override or shape gave it): the window should ask."""
        return self.source_of("num_heads").startswith("guess")

    def relevant(self, name: str) -> bool:
        """Whether field `name` changes what this model computes now (e.g. the pooling head's settings only with
        a MAP head, the position resampling only away from the stored grid, nothing structural on the live path,
        where the module's own code runs)."""
        if name in OTHER_FIELDS or name == "identity":
            return False
        if self.family == "live":
            return name in ("image_size", "preprocess", "in_chans")
        if name in PSEUDO_FIELDS:
            return name in dict(self.provenance)
        if name.startswith("rope_"):
            return bool(self.rope)
        if name.startswith("pool_"):
            return self.pooling == "map"
        off_grid = tuple(self.grid) != tuple(self.pos_grid)
        conditional = {
            "pos_interp": self.pos_embed and off_grid,
            "rel_pos_interp": bool(self.rel_pos) and not self.rel_pos_mlp and off_grid,
            "rel_pos_mlp": bool(self.rel_pos_mlp),
            "pre_logits_act": bool(self.pre_logits), "mlp_kind": bool(self.mlp_hidden),
            "eps_final": bool(self.eps_final), "pos_kind": self.pos_embed, "pos_prefix": self.pos_embed,
            "attn_scale": True, "embed_out": bool(self.embed_out), "patch_pad": bool(self.patch_pad),
            "norm_kind": self.norm_kind != "layer",
        }
        return conditional.get(name, True)

    def folded(self, name: str) -> bool:
        # a RoPE preset is one assumption: its settings are said (and fixed, --rope NAME) with it
        return name.startswith("rope_") and self.relevant("rope") and self.kind_of("rope") == ASSUMED

    def token_name(self, index: int) -> str:
        """A readable name for token `index`: 'cls', 'reg0', or 'patch (r, c)'."""
        if index < self.num_prefix:
            return self.prefix_names[index]
        r, c = divmod(index - self.num_prefix, self.grid[1])
        return f"patch ({r}, {c})"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field plus the derived grid and prefix names."""
        out = dataclasses.asdict(self)
        out["grid"] = list(self.grid)
        out["prefix_names"] = list(self.prefix_names)
        out["provenance"] = dict(self.provenance)
        out["attn_width"] = self.attn_width
        out["heads_guessed"] = self.heads_guessed
        out["position_kind"] = self.position_kind
        out["guesses"] = dict(self.guesses)
        out["assumptions"] = dict(self.assumptions)
        out["provenance_kinds"] = self.kinds()
        out["notes"] = dict(self.notes)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=list)


def top_classes(logits: np.ndarray, labels: tuple[str, ...], k: int = 5) -> list[tuple[int, str, float]]:
    """The k most probable classes of one image's `logits` (softmax) as (index, label, probability), a class
    without a label named 'class N'; empty without a classifier (no logits)."""
    if logits.size == 0:
        return []
    z = logits.astype(np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    return [(int(i), labels[i] if i < len(labels) else f"class {i}", float(p[i])) for i in np.argsort(-p)[:k]]


@dataclass(frozen=True, eq=False)
class AttentionResult:
    """What one forward pass captured.

    Attributes:
        attentions: (L, H, T, T) post-softmax attention, float32 (or float16 when asked); rows sum to 1.
        logits: (C,) float32 class scores; (0,) for a headless backbone or a run with `logits=False`.
        input: (C, H, W) the preprocessed tensor as float32 NumPy.
        image: (H, W, 3) uint8 RGB, the image as the model saw it (after resize and crop, before normalising).
        spec: the model spec at the resolution of this run (image_size/grid may differ from the native ones).
        source: the path or a description of the image.
        features: a headless backbone's pooled output (D,) (its `logits` are then empty); None for a classifier.
        source_box: the region (left, top, right, bottom) of the original image the model saw, in its pixels.
        source_size: the original image's (h, w).
        pool_attention: (H', T) float32, a MAP pooling head's attention (SigLIP, PE: `spec.pooling == 'map'`): its
            latent query's softmax over the tokens, per pooling head (rows sum to 1; zeros on prefix tokens the
            head does not see). It is that model's "CLS attention"; None for other models or a `logits=False` run.
        interventions: what was done to the model during the run (`vitviz.core.running.interventions`: ablated
            heads, patched attention or blocks, knocked-out tokens), one description each; () for a clean run.
    """

    attentions: np.ndarray
    logits: np.ndarray
    input: np.ndarray
    image: np.ndarray
    spec: ModelSpec
    source: str = ""
    features: np.ndarray | None = None
    source_box: tuple[float, float, float, float] | None = None
    source_size: tuple[int, int] | None = None
    pool_attention: np.ndarray | None = None
    interventions: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return result_summary(self)   # shapes and the top class, never the arrays

    @property
    def grid(self) -> tuple[int, int]:
        return self.spec.grid

    @property
    def num_prefix(self) -> int:
        return self.spec.num_prefix

    def top_k(self, k: int = 5) -> list[tuple[int, str, float]]:
        """The k most probable classes as (index, label, probability); empty without a classifier."""
        return top_classes(self.logits, self.spec.labels, k)

    def pool_map(self, head: int | str = "mean") -> np.ndarray:
        """The MAP head's attention over the patches as a (gh, gw) map: one pooling head, or 'mean' / 'max' over
        them -- the "CLS attention" of a model that pools with a latent query instead of a CLS token.

        Raises:
            ValueError: the result has no pooling attention (not a MAP model, or a `logits=False` run).
        """
        if self.pool_attention is None:
            raise ValueError(f"no pooling attention: the model pools with {self.spec.pooling!r}"
                             + (" (a MAP head's attention needs the full forward pass, logits=True)"
                                if self.spec.pooling == "map" else "; only MAP-head models (SigLIP, PE) have one"))
        rows = self.pool_attention
        if head == "mean":
            row = rows.mean(axis=0)
        elif head == "max":
            row = rows.max(axis=0)
        elif isinstance(head, (int, np.integer)) and -rows.shape[0] <= int(head) < rows.shape[0]:
            row = rows[int(head)]
        else:
            raise ValueError(f"head must be 'mean', 'max' or an index in [0, {rows.shape[0]}), found {head!r}")
        return np.asarray(row[self.num_prefix:], np.float32).reshape(self.grid)  # (N,) -> (gh, gw)

    @property
    def nbytes(self) -> int:
        extra = self.features.nbytes if self.features is not None else 0
        extra += self.pool_attention.nbytes if self.pool_attention is not None else 0
        return int(self.attentions.nbytes + self.logits.nbytes + self.input.nbytes + self.image.nbytes + extra)


def split_output(out: np.ndarray, spec: ModelSpec) -> tuple[np.ndarray, np.ndarray | None]:
    """One image's model output as (logits, features): a headless backbone's output is its pooled features,
    not class scores, so its logits are empty (and no top-5 is made up from them)."""
    if spec.num_classes == 0 and out.size:
        return np.zeros(0, np.float32), out
    return out, None
