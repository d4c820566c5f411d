"""The names of every choice vitviz offers, and every override of `vitviz.load`, in one place.

- The choice lists: activations, poolings, norm orders, crop modes, resampling filters, position-embedding recipes,
  RoPE presets, patch orders. The reference model (`vitviz.core.running.model`), the position code (`vitviz.core.posembed`),
  the loader's checks, the command line and the window's Model settings read their lists here.
- `OPTIONS`: one `Option` record per override -- its keyword, the kind of value it takes, its choices and bounds,
  its command-line flag and help, the spec fields it answers and the loading routes that take it. Derived from it:
  the command line's arguments (`vitviz.cli.options.add_override_arguments`), the check of every value
  (`vitviz.core.reading.validate.check_overrides`, which maps each `Option.value` to its primitive), the keyword lists of
  the three routes (`overrides_for`), `HOW_TO_PASS` (what a warning about an assumed field tells the user to pass)
  and `NUMERIC_FIELDS`. A new override is one record here (and its use where the model is built).

Stdlib only (no torch, numpy or Qt), so the command line and the window can import it before anything heavy; it
imports no other vitviz module (the checks stay with their primitives in `validate`, named here by `value`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

# MLP activations a user may name (`act=`, `head_act=`); `vitviz.core.running.model.make_act` builds each.
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "relu", "silu", "tanh")
# `ModelSpec.mlp_kind`: an activation, or a gated MLP read off its shapes (not a choice of activation).
MLP_KINDS = ACTIVATIONS + ("swiglu",)
# `ModelSpec.block_norm`: where each block's LayerNorms sit (see `vitviz.core.running.model.Block`).
BLOCK_NORMS = ("pre", "post", "res_post")
# Poolings whose head reads one D-wide vector (the class token, the mean of the patches, of every token): what a
# user may ask for on the command line, and what LeGrad can apply to a mean-pooled layer.
ONE_VECTOR_POOLINGS = ("token", "avg", "avg_all")
# `ModelSpec.pooling`: also the class token beside the patch mean (DINOv2's linear head), and a MAP head.
POOLINGS = ONE_VECTOR_POOLINGS + ("cls_avg", "map", "max", "avgmax")
# The poolings the command line offers: the one-vector ones and timm's max / avgmax (the others are read off shapes).
CLI_POOLINGS = ONE_VECTOR_POOLINGS + ("max", "avgmax")
# How the image is brought to the model's input size (`Preprocess.mode`), with the words the window shows.
CROP_MODE_LABELS = {"center": "resize, centre crop", "squash": "squash to size", "squash_crop": "squash, centre crop"}
CROP_MODES = tuple(CROP_MODE_LABELS)
# Resampling filters (Pillow's names; `vitviz.core.running.images.PIL_FILTERS` maps them to Pillow's constants).
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
# How a head is ablated (vitviz.core.running.interventions): zeros, its mean over reference images, another image's
ABLATION_MODES = ("zero", "mean", "resample")
# How a learned position table is resampled at another input size (`vitviz.core.posembed.resample_grid`).
POS_RECIPES = ("timm", "torchvision", "hf", "dino", "dinov2", "dinov2_reg", "deit", "bilinear_aa", "bilinear", "bucket")
# How a relative position bias table is resampled (`vitviz.core.posembed.resize_rel_pos_table`).
REL_POS_RECIPES = ("timm", "hf")
# `ModelSpec.rope`: the RoPE coordinate kinds (`vitviz.core.posembed.rope_coords`).
ROPE_KINDS = ("axial", "dinov3", "mixed")
# The RoPE settings of the model families that use it (timm eva.py), by the name a user passes as `rope=`.
# rope_ref_grid (-1, -1): the model's native grid.
ROPE_PRESETS: dict[str, dict[str, object]] = {
    "dinov3": dict(rope="dinov3", rope_theta=100.0, rope_half=True),
    "eva02": dict(rope="axial", rope_theta=10000.0, rope_ref_grid=(16, 16)),
    "pe": dict(rope="axial", rope_theta=10000.0, rope_xy=True, rope_offset=1.0, rope_ref_grid=(-1, -1)),
    "rope_vit": dict(rope="axial", rope_theta=100.0, rope_xy=True),        # Naver RoPE-ViT, axial
    "rope_mixed": dict(rope="mixed", rope_theta=10.0, rope_xy=True),       # Naver RoPE-ViT, learned frequencies
    "timm_rope": dict(rope="axial", rope_theta=10000.0, rope_ref_grid=(16, 16)),  # timm vit_*_rope_reg*_gap_256
    "none": dict(rope=""),
}
ROPE_PRESET_NAMES = tuple(ROPE_PRESETS)
# Pixel order of a Linear patch embedding: einops '(p1 p2 c)' or unfold '(c p1 p2)'.
PATCH_ORDERS = ("p1p2c", "cp1p2")
# The position table of a file that stores none: computed (`vitviz.core.posembed`) or none at all.
POS_KINDS = ("sincos1d", "sincos2d", "none")


def alternatives(choices: tuple[str, ...] | list[str], quote: bool = True) -> str:
    """"'a'|'b'|'c'" (quoted, as a Python argument is written) or 'a|b|c' (as a command-line value)."""
    return "|".join(f"'{c}'" if quote else c for c in choices)


# ------------------------------------------------------------------------------------------------ the overrides

# The loading routes an override can apply to: the reference ViT (a converted checkpoint), a windowed model (Swin,
# SAM, ViTDet: `vitviz.core.running.winload`) and the live path (a module run from its own code: `vitviz.core.running.live`).
REFERENCE, WINDOWED, LIVE = "reference", "windowed", "live"
ROUTES = (REFERENCE, WINDOWED, LIVE)
# What an override's value is: `vitviz.core.reading.validate.VALUE_CHECKS` checks each kind, `vitviz.cli.options` parses it.
VALUE_KINDS = ("heads", "family", "size", "number", "stats", "positive_stats", "choice", "labels", "text", "device",
               "resize", "count", "bool", "channels", "window", "blocks")


@dataclass(frozen=True)
class Option:
    """One override of `vitviz.load`.

    name:      the keyword (`heads`); its flag is `--` + name with dashes (`--eps-final`), unless `flag` says
               otherwise or is '' (not on the command line: a Python-only value, or each command's own flag).
    value:     what it takes, one of `VALUE_KINDS`; `bounds` (low, high) for a number or count, `low_open` whether a
               number may equal `low`.
    choices:   the names a `choice` accepts; `cli_choices` those the command line offers when fewer (the API also
               takes what a file's shapes decide, e.g. act='swiglu', pooling='map').
    metavar:   how its value is written in help and in `HOW_TO_PASS` ('N', 'E'); `api_metavar` in Python when that
               differs ('(I, J, ...)' for the command line's 'I,J').
    fields:    the spec fields it answers: a warning that one of them was assumed says to pass this option.
    numeric:   whether a wrong value changes the model's numbers (not only its input or labels).
    routes:    the loading routes that take it (`ROUTES`); the loader refuses it on any other.
    help:      the command line's help text.
    remembered: whether the window asks it when assumed (Review assumptions) and can remember its answer for a
               file (`vitviz.catalog.answers`, read by every command).
    setting:   its label in the window's Model settings ('' when it has no row there).
    provenance: the spec field whose provenance says where its value came from, when not the first of `fields`.
    """

    name: str
    value: str
    help: str = ""
    choices: tuple[str, ...] = ()
    cli_choices: tuple[str, ...] = ()
    bounds: tuple[float, float] = (0.0, float("inf"))
    low_open: bool = True
    metavar: str = ""
    api_metavar: str = ""
    fields: tuple[str, ...] = ()
    numeric: bool = False
    routes: tuple[str, ...] = (REFERENCE, WINDOWED, LIVE)
    flag: str | None = None
    remembered: bool = False
    setting: str = ""
    provenance: str = ""

    def __post_init__(self) -> None:
        if self.value not in VALUE_KINDS:
            raise ValueError(f"option {self.name}: value {self.value!r} is not one of {', '.join(VALUE_KINDS)}")
        if (self.value == "choice") != bool(self.choices):
            raise ValueError(f"option {self.name}: choices are given exactly for a 'choice' value")
        if not set(self.routes) <= set(ROUTES) or not self.routes:
            raise ValueError(f"option {self.name}: routes {self.routes} are not among {', '.join(ROUTES)}")
        if (self.remembered or self.setting) and not self.provenance_field:
            raise ValueError(f"option {self.name}: a remembered or shown option names the spec field it answers")

    @property
    def provenance_field(self) -> str:
        """The spec field whose provenance says where this option's value came from ('' when it answers none)."""
        return self.provenance or next(iter(self.fields), "")

    @property
    def cli_flag(self) -> str:
        """'--eps-final' ('' when the command line has no flag for it)."""
        if self.flag is not None:
            return self.flag
        return "--" + self.name.replace("_", "-")

    @property
    def offered(self) -> tuple[str, ...]:
        """The choices the command line offers."""
        return self.cli_choices or self.choices

    @property
    def api_how(self) -> str:
        """How Python passes it: "act='gelu'|'relu'", "heads=N"."""
        if self.value == "choice":
            return f"{self.name}={alternatives(self.offered)}"
        return f"{self.name}={self.api_metavar or self.metavar or '...'}"

    @property
    def cli_how(self) -> str:
        """How the command line passes it ('--act gelu|relu', '--heads N'; '' without a flag)."""
        if not self.cli_flag:
            return ""
        value = alternatives(self.offered, quote=False) if self.value == "choice" else self.metavar or "..."
        return f"{self.cli_flag} {value}"

    @property
    def how(self) -> str:
        """How to pass it, as a warning says: "act='gelu'|'relu' (CLI --act gelu|relu)", "heads=N (CLI --heads N)"."""
        return self.api_how + (f" (CLI {self.cli_how})" if self.cli_flag else "")


_BOTH = (REFERENCE, WINDOWED)      # a converted model's structure: the live path runs the module's own code
OPTIONS: tuple[Option, ...] = (
    Option("heads", "heads", "number of attention heads", metavar="N", fields=("num_heads", "heads"), numeric=True,
           remembered=True, setting="Heads"),
    # ("heads": a windowed spec's name for it, `vitviz.core.winspec.WindowedSpec.heads`)
    Option("family", "family", "checkpoint family, when the detected one is wrong", metavar="NAME",
           fields=("embed_out",), numeric=True, routes=_BOTH),
    Option("image_size", "size", "input size: N or HxW (position embedding is resampled)", metavar="N|HxW",
           api_metavar="N", fields=("image_size", "pos_grid"), setting="Image size"),
    Option("eps", "number", "LayerNorm epsilon (every norm)", bounds=(0.0, 1.0), metavar="E", fields=("eps",),
           numeric=True, routes=_BOTH),
    Option("eps_final", "number", "epsilon of the final norms (norm, fc_norm) when it differs from the blocks' "
           "(e.g. blocks 1e-6, final norm 1e-5)", bounds=(0.0, 1.0), metavar="E", fields=("eps_final",),
           numeric=True, routes=(REFERENCE,)),
    Option("mean", "stats", "normalisation mean, e.g. 0.485,0.456,0.406 (1 or 3 values; a 1-channel MNIST model: "
           "0.1307)", metavar="M", fields=("preprocess",), setting="Mean"),
    Option("std", "positive_stats", "normalisation std, e.g. 0.229,0.224,0.225 (MNIST: 0.3081)", metavar="S",
           fields=("preprocess",), setting="Std"),
    Option("resize", "resize", "resize the image's shorter side to PX before the crop (--crop-mode center); the "
           "crop is the model's input size", metavar="PX", fields=("resize_recipe",), setting="Resize",
           provenance="preprocess"),
    Option("crop_mode", "choice", "center: resize keeping the aspect ratio, then crop the middle; squash: resize "
           "the whole image to the input size (no crop); squash_crop: squash to --resize, then crop the middle",
           choices=CROP_MODES, fields=("resize_recipe",), setting="Crop", provenance="preprocess"),
    Option("interpolation", "choice", "resampling filter for the resize", choices=INTERPOLATIONS),
    Option("block_norm", "choice", "where each block's LayerNorms sit: pre (ViT: x + f(norm(x))), post (norm(x + "
           "f(x)): nn.TransformerEncoderLayer with norm_first=False) or res_post (x + norm(f(x)): Swin v2, timm "
           "*_rpn_*)", choices=BLOCK_NORMS, fields=("block_norm",), numeric=True, routes=(REFERENCE,),
           remembered=True, setting="Norm order"),
    Option("act", "choice", "MLP activation (nn.TransformerEncoderLayer: relu unless built with activation='gelu')",
           choices=MLP_KINDS, cli_choices=ACTIVATIONS, fields=("mlp_kind",), numeric=True, routes=_BOTH,
           remembered=True, setting="Activation"),
    Option("pooling", "choice", "what the head sees: token 0 (the class token, or the first patch without one), "
           "the mean of the patches, or of every token, or the patches' max (timm global_pool 'max', 'avgmax': half "
           "mean, half max)", choices=POOLINGS, cli_choices=CLI_POOLINGS,
           fields=("pooling",), numeric=True, routes=(REFERENCE,)),
    Option("attn_scale", "number", "factor on q·k (default head_dim**-0.5; e.g. 1 for none, or dim**-0.5 as the "
           "first vit-pytorch versions)", bounds=(0.0, 1e6), low_open=False, metavar="S", fields=("attn_scale",),
           numeric=True, routes=(REFERENCE,), remembered=True, setting="Attn scale"),
    Option("patch_order", "choice", "pixel order of a Linear patch embedding: einops '(p1 p2 c)' or unfold "
           "'(c p1 p2)'", choices=PATCH_ORDERS, fields=("patch_order",), numeric=True, routes=(REFERENCE,)),
    Option("pos_kind", "choice", "the position table of a file that holds none (a non-persistent buffer): sincos1d "
           "(1-D sin-cos over every token, the 'ViT from scratch' tutorial's get_positional_embeddings), sincos2d "
           "(vit-pytorch SimpleViT) or none", choices=POS_KINDS, fields=("pos_kind",), numeric=True,
           routes=(REFERENCE,)),
    Option("pos_interp", "choice", "how the position table is resampled at another input size: timm (bicubic, "
           "antialias), deit / dino (bicubic, no antialias), torchvision, hf, ...", choices=POS_RECIPES,
           fields=("pos_interp",), routes=_BOTH),
    Option("head_act", "choice", "activation between the two Linears of a two-layer head", choices=ACTIVATIONS,
           fields=("pre_logits_act",), numeric=True, routes=(REFERENCE,)),
    Option("rope", "choice", "the rotary position embedding of a RoPE ViT no config names (DINOv3, EVA-02, "
           "Perception Encoder, Naver RoPE-ViT, timm vit_*_rope_reg*_gap), or none", choices=ROPE_PRESET_NAMES,
           fields=("rope",), numeric=True, routes=(REFERENCE,)),
    Option("nest_key", "text", "which state dict of a training checkpoint (state_dict, state_dict_ema, teacher...)",
           metavar="KEY", fields=("nest_key",), numeric=True),
    Option("labels", "labels", metavar="[...]", fields=("labels",), flag=""),
    Option("device", "device", flag=""),            # each command has its own --device
    Option("window", "window", "windowed models (Swin v2, SAM without relative positions), whose files hold no "
           "window size: N, or one per stage (8,8,8,8)", metavar="N", fields=("windows",), numeric=True,
           routes=(WINDOWED,)),
    Option("global_blocks", "blocks", "SAM / ViTDet: the blocks with global attention, when neither the file nor its "
           "config says (SAM ViT-B: 2,5,8,11)", metavar="I,J", api_metavar="(I, J, ...)", fields=("global_blocks",), numeric=True,
           routes=(WINDOWED,)),
    Option("code", "text", "run your own model class: FILE.py:FACTORY is a function or class in FILE.py that returns "
           "the model (called without arguments); the weights file is loaded into it (read with weights_only=True, "
           "never executed) and its attention is captured as its code computes it. This runs FILE.py's code: only "
           "with this flag", metavar="FILE.py:FACTORY", fields=("token_order", "patch_embed", "model_args"),
           routes=(LIVE,)),
    Option("grid", "size", "with --code: the patch grid (rows x columns) at the input size, when the module has no "
           "patch embedding and its token count fits several", metavar="RxC", routes=(LIVE,)),
    Option("num_prefix", "count", "with --code: how many tokens come before (or after) the patches (class token, "
           "registers), when the token count leaves it open", bounds=(0, float("inf")), metavar="N", routes=(LIVE,)),
    Option("in_chans", "channels", "with --code: the input channels (e.g. 1 for an MNIST model), when neither its "
           "first layer nor its statistics say", metavar="C", routes=(LIVE,)),
    Option("live", "bool", flag="", routes=(LIVE,)),   # load(module, live=True): run it as written
)
OPTION = {o.name: o for o in OPTIONS}


def overrides_for(*routes: str) -> tuple[str, ...]:
    """The keywords that apply to any of `routes`, in `OPTIONS` order."""
    return tuple(o.name for o in OPTIONS if set(o.routes) & set(routes))


def only_for(route: str) -> tuple[str, ...]:
    """The keywords that apply to `route` alone (the windowed models' window=, the live path's grid=)."""
    return tuple(o.name for o in OPTIONS if o.routes == (route,))


def remembered_options(options: tuple[Option, ...] = OPTIONS) -> tuple[str, ...]:
    """The overrides that can be remembered for a file (`Option.remembered`: the window's "Remember for this file",
    `vitviz.catalog.answers`), in `options` order."""
    return tuple(o.name for o in options if o.remembered)


def setting_fields(options: tuple[Option, ...] = OPTIONS) -> dict[str, str]:
    """The window's Model settings: each override it shows (`Option.setting`) -> the spec field whose provenance
    says where its value came from, in `options` order."""
    return {o.name: o.provenance_field for o in options if o.setting}


REMEMBERABLE = remembered_options()
FORGET_HOW = "vitviz info FILE --forget, or the window's Model settings › Forget remembered answers"


def remembered_source(name: str, value: Any) -> str:
    """The provenance of a setting whose value is an answer remembered for the file (override `name`):
    'remembered: you answered 4 in the window for this file (forget: ...)'."""
    shown = f"{float(value):g}" if name == "attn_scale" else str(value)
    if name == "attn_scale" and not value:
        shown = "0 (head_dim^-0.5)"
    return f"remembered: you answered {shown} in the window for this file (forget: {FORGET_HOW})"


# Spec fields no option sets: what a warning tells the user to do instead (how to answer it), and whether a wrong
# value changes the model's numbers.
@dataclass(frozen=True)
class Unanswered:
    field: str
    how: str
    numeric: bool = True


UNANSWERED: tuple[Unanswered, ...] = (
    Unanswered("pool_heads", "a config.json beside the file stating the pooling head's heads (timm "
                             "model_args.attn_pool_num_heads; there is no option for it yet)"),
    Unanswered("rel_pos_interp", "a config.json naming the model (timm architecture, transformers model_type)"),
    Unanswered("norm_kind", "a config.json naming the model (timm architecture aimv2_*): its norms are RMSNorms"),
    Unanswered("token_order", "the model's own code (CLI --code FILE.py:FACTORY): vitviz's reference ViT puts the "
                              "prefix tokens first"),
    Unanswered("patch_embed", "the model's own code (CLI --code FILE.py:FACTORY)", numeric=False),
    Unanswered("model_args", "the model's own code (CLI --code FILE.py:FACTORY), or verify it against timm "
                             "(vitviz verify)", numeric=False),
)


def how_to_pass(route: str | None = None) -> dict[str, str]:
    """Each answerable field -> how to pass it (with `route`, only by the options that route takes: a windowed
    model's pooling is no option's to set); a field two options answer together (the normalisation's mean and
    std, the resize and its crop) joins them: "mean=M and std=S (CLI --mean M --std S)"."""
    by_field: dict[str, list[Option]] = {}
    for o in OPTIONS:
        if o.name == "code" or (route is not None and route not in o.routes):   # code: said in UNANSWERED
            continue
        for f in o.fields:
            by_field.setdefault(f, []).append(o)
    out: dict[str, str] = {}
    for f, opts in by_field.items():
        api = " and ".join(o.api_how for o in opts)
        cli = " ".join(o.cli_how for o in opts if o.cli_how)
        out[f] = f"{api} (CLI {cli})" if cli else api
    if route in (None, REFERENCE):     # the reference ViT's fields no option sets
        out.update({u.field: u.how for u in UNANSWERED if u.field not in out})
    return out


HOW_TO_PASS: dict[str, str] = how_to_pass()
# what a warning about a windowed model's assumed field says (`vitviz.core.running.winload`; its other fields: a config)
WINDOWED_HOW_TO_PASS: dict[str, str] = how_to_pass(WINDOWED)
# Fields whose guess would change the model's numbers (a preprocessing or label guess changes only its input).
NUMERIC_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(
    [f for o in OPTIONS if o.numeric and o.name != "code" for f in o.fields]
    + [u.field for u in UNANSWERED if u.numeric]))


# "pass NAME=VALUE" in a library message, with the command line's "(CLI --flag V)" beside it or not: each surface
# says it its own way (`reword_advice`): Python as written, the command line as its flag, the window as its control.
_VALUE = r"(?:'[^']*'|\"[^\"]*\"|\([^)]*\)|[^\s;,)]+)"
_PAIR = re.compile(r"(?P<name>[a-z_]+)=(?P<value>" + _VALUE + ")")
_ADVICE = re.compile(r"pass (?P<pairs>[a-z_]+=" + _VALUE + r"(?: and [a-z_]+=" + _VALUE + r")*)(?P<cli> \(CLI [^)]*\))?")


def advice_value(value: str) -> str:
    """A Python value of an advice as the other surfaces write it: "'relu'" -> 'relu', '(h, w)' -> 'HxW'."""
    value = value.strip()
    if value[:1] in "'\"" and value[-1:] == value[:1]:
        return value[1:-1]
    if value.startswith("(") and value.endswith(")"):
        parts = [part.strip() for part in value[1:-1].split(",") if part.strip()]
        return "x".join(part.upper() if part.isalpha() and len(part) == 1 else part for part in parts)  # (h, w): HxW
    return value


def reword_advice(message: str, render: Callable[[Option, str], str], joiner: str = " and ") -> str:
    """Every "pass NAME=VALUE[ and NAME=VALUE ...]" of overrides vitviz knows (with the "(CLI ...)" beside it, if
    any) replaced by each pair's `render(option, value)` (the value as `advice_value` writes it), joined by `joiner`;
    other text, and advice naming anything that is no override (a timm keyword in a sentence), unchanged."""
    def sub(m: re.Match) -> str:
        pairs = [(OPTION.get(p.group("name")), p.group("value")) for p in _PAIR.finditer(m.group("pairs"))]
        if any(option is None for option, _ in pairs):
            return m.group(0)
        return joiner.join(render(option, advice_value(value)) for option, value in pairs)

    return _ADVICE.sub(sub, message)


def cli_wording(message: str) -> str:
    """A library message as the command line says it: 'pass heads=N (CLI --heads N)' -> 'pass --heads N',
    "pass act='relu'" -> 'pass --act relu' (an override without a flag keeps its Python form)."""
    message = re.sub(r"pass ([^;]*?) \(CLI ([^)]*)\)", r"pass \2", message)
    return reword_advice(message, lambda o, value: f"pass {o.cli_flag} {value}" if o.cli_flag
                         else f"pass {o.name}={value} (in Python)")
