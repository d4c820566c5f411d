"""Checkpoint families: detection and key conversion into the canonical (timm) layout, and what each family knows.

One module per family, found in this package (`FAMILIES`, sorted by each module's `DETECT_ORDER`), each with
`NAMES` (the family names it handles), `detect(keys, raw) -> name | None` and `convert(sd, raw, family, overrides)
-> Converted`, and beside them the family's facts, as timm keeps a model's `_cfg` in the model's own file:

- `DETECT_ORDER`: where detection tries it (lowest first; `structural` last);
- `HELP`: one line on what the family is (the command line's `--family` help);

and, where it knows them (as timm's `_cfg()` gives each model the defaults it does not state, `FACT_DEFAULTS`
here gives the cautious answer a family that says nothing gets):

- `PREPROCESS`: {family name: `Recipe`}, its eval preprocessing (`recipe()`; checkpoint-formats.md §7); none:
  no eval recipe, the image is brought to the native size whole;
- `REGISTERED_SIZES`: whether its files follow the registered model sizes, so the embed-dim table is a fair
  answer for num_heads (`follows_registered_sizes()`); not stated: they do not;
- `NAME_HINTS`: (regular expression, family, priority) for file and repository names (`family_from_name()`,
  the catalog's guess); none: no guess from a name;
- `HF_MODEL_TYPES` ({transformers model_type: family}, `hf_family()`) and `EVAL_SIZE` ({family: (size, why)},
  `eval_size()`: the size it is evaluated at when its position table was trained larger);
- a windowed family: `WINDOWED`, the layout of the windowed reference model it converts to ('swin': stages and
  patch merging; 'sam': one stage of windowed and global blocks), `windowed_layout()`;
- a family whose library builds model objects: `read_object(module, what)` and `object_config(module)`, what its
  objects state beside their tensors (`vitviz.core.reading.objects`).

A new family is one new module in this package (and its test); nothing else lists it. `structural` comes last: it reads any layout by the
roles and shapes of its tensors, so a file with attention-shaped weights is never refused as "not a Vision
Transformer". The windowed families (`swin`, `sam`: Swin v1 / v2, SAM / ViTDet image encoders) come first: their
keys (`layers.S.blocks.B.attn`, `features.N.M.attn`, `blocks.N.attn.rel_pos_h`, a SAM neck) are in no plain ViT,
and `structural` would otherwise claim them; their files load into `vitviz.core.running.windowed`, not the reference ViT.

Each converter returns the canonical state dict plus `hints`: values the family fixes (eps, activation,
pooling, interpolation recipe, token coverage of the position embedding) together with where they came from.
Anything not fixed here is inferred from shapes in `vitviz.core.reading.hyperparams`.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, key_stems, strip_prefixes
from vitviz.errors import CompositeModelError, InconsistentCheckpointError, UnknownLayoutError

if TYPE_CHECKING:
    from vitviz.core.reading.checkpoint import RawCheckpoint

__all__ = ["Converted", "Hint", "FAMILIES", "FAMILY_NAMES", "REGISTERED_FAMILIES", "Recipe", "convert", "detect",
           "eval_size", "family_from_name", "follows_registered_sizes", "hf_family", "key_stems", "recipe"]

# What every family module declares beside NAMES / detect / convert (checked here, so a new one cannot forget).
REQUIRED_FACTS = ("DETECT_ORDER", "HELP")
# The facts a family states only where it knows them, and what one that does not state them gets.
FACT_DEFAULTS: dict[str, Any] = {"PREPROCESS": {}, "REGISTERED_SIZES": False, "NAME_HINTS": (),
                                 "HF_MODEL_TYPES": {}, "EVAL_SIZE": {}}
HELPERS = ("base",)   # modules of this package that are not families


def _discover() -> tuple[ModuleType, ...]:
    """Every family module of this package (a module per file, `HELPERS` aside), in detection order
    (`DETECT_ORDER`, lowest first): a new family is its file alone, registered by being here."""
    modules = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
               if info.name not in HELPERS and not info.name.startswith("_")]
    for module in modules:
        check_family_module(module)
    orders = [module.DETECT_ORDER for module in modules]
    if len(set(orders)) != len(orders):
        raise AssertionError(f"two families share a DETECT_ORDER: {sorted(orders)}")
    return tuple(sorted(modules, key=lambda module: module.DETECT_ORDER))


def fact(module: ModuleType, name: str) -> Any:
    """The family module's fact `name` (one of `FACT_DEFAULTS`), or its default where the module does not state it."""
    return getattr(module, name, FACT_DEFAULTS[name])


def _merged(attr: str) -> dict[str, Any]:
    """One family attribute ({name: value}) of every module, merged; a name two families claim is a bug."""
    out: dict[str, Any] = {}
    for module in FAMILIES:
        for key, value in fact(module, attr).items():
            if key in out:
                raise AssertionError(f"{module.__name__}.{attr}[{key!r}]: already declared by another family")
            out[key] = value
    return out


def check_family_module(module: ModuleType) -> None:
    """Raise AssertionError naming what a family module does not declare (run on every registered one at import)."""
    missing = [a for a in ("NAMES", "detect", "convert", *REQUIRED_FACTS) if not hasattr(module, a)]
    if missing:
        raise AssertionError(f"{module.__name__} does not declare {', '.join(missing)} (see vitviz.core.reading.families)")


FAMILIES: tuple[ModuleType, ...] = _discover()
FAMILY_NAMES: dict[str, ModuleType] = {name: module for module in FAMILIES for name in module.NAMES}
PREPROCESS: dict[str, Recipe] = _merged("PREPROCESS")
HF_MODEL_TYPES: dict[str, str] = _merged("HF_MODEL_TYPES")
EVAL_SIZES: dict[str, tuple[int, str]] = _merged("EVAL_SIZE")
# The windowed families: each name -> the windowed reference model's layout its files convert to ('swin', 'sam').
WINDOWED_LAYOUTS: dict[str, str] = {name: module.WINDOWED for module in FAMILIES if hasattr(module, "WINDOWED")
                                    for name in module.NAMES}
# The families whose files follow the registered sizes, by the name before any '-' (hf-vit is hf's).
REGISTERED_FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(
    name.split("-")[0] for module in FAMILIES if fact(module, "REGISTERED_SIZES") for name in module.NAMES))
# (pattern, family, priority, registry position), highest priority first: the order names are tried in.
_NAME_HINTS = sorted(((re.compile(pattern), family, priority, i) for i, module in enumerate(FAMILIES)
                      for pattern, family, priority in fact(module, "NAME_HINTS")), key=lambda h: (-h[2], h[3]))


def recipe(family: str) -> Recipe | None:
    """The eval preprocessing of `family` ('hf-clip' its own, 'hf-vit' hf's: the full name, else the name
    before its first '-'); None for a layout without one (hand-written, vit-pytorch, nn.TransformerEncoder)."""
    return PREPROCESS.get(family, PREPROCESS.get(family.split("-")[0]))


def follows_registered_sizes(family: str) -> bool:
    """Whether files of `family` follow the registered model sizes (a head count from the width table is then a
    fair answer, not a guess)."""
    return family.split("-")[0] in REGISTERED_FAMILIES


def eval_size(family: str) -> tuple[int, str] | None:
    """(size, why) when `family` is evaluated at `size` px whatever size its position table was trained at."""
    return EVAL_SIZES.get(family)


def family_from_name(name: str) -> str | None:
    """A family guess from a file or repository name (the catalog's), by each family's `NAME_HINTS`: the hint of
    the highest priority that matches the lower-cased name; None when no family claims it (not a ViT)."""
    n = name.lower()
    return next((family for pattern, family, _, _ in _NAME_HINTS if pattern.search(n)), None)


def windowed_layout(family: str) -> str | None:
    """The windowed reference model's layout ('swin', 'sam') a windowed family's files convert to; None for a
    family of plain ViTs."""
    return WINDOWED_LAYOUTS.get(family)


def hf_family(model_type: str) -> str | None:
    """The family of a transformers `model_type` (config.json) that vitviz reads as a plain ViT, else None."""
    return HF_MODEL_TYPES.get(model_type)


def family_help() -> str:
    """What the command line's `--family` says: every family name, grouped by module with its `HELP`."""
    return "; ".join(f"{'/'.join(m.NAMES)} ({m.HELP})" for m in FAMILIES)


def convert(raw: RawCheckpoint, family: str | None = None, overrides: dict[str, Any] | None = None) -> Converted:
    """Detect the family of `raw` (or use `family`) and convert its keys to the canonical layout; `overrides`
    (the caller's load() overrides) reach readers that need one, e.g. a patch flatten order."""
    from vitviz.core.reading.towers import refuse_windowed

    refuse_windowed(raw.config, str(raw.path))   # tensors of a plain ViT, attention that is not
    sd, dropped = strip_prefixes(dict(raw.tensors))
    detected = family or detect(set(sd), raw)
    full = detected.split(":")[0]
    name = full if full in FAMILY_NAMES else full.split("-")[0]  # 'hf-clip' is clip's, 'hf-vit' is hf's
    module = FAMILY_NAMES.get(name)
    if module is None:
        raise UnknownLayoutError(
            f"{raw.path}: family {detected!r} is not supported; expected one of {', '.join(sorted(FAMILY_NAMES))}")
    named = named_by(raw) if module.__name__.endswith(".structural") and not family else ""
    if named and _composite(raw.config or {}):
        # a model whose config names parts (a vision-language or depth model): its layout is not guessed
        from vitviz.core.reading.towers import ROUTE

        raise CompositeModelError(f"{raw.path}: its config names {named}, a composite model (it states "
                                  f"{', '.join(k for k in _PARTS if isinstance((raw.config or {}).get(k), dict))}) "
                                  "whose vision part vitviz does not open from the whole model's file. To see its "
                                  f"attention, {ROUTE}")
    # a family named by the caller decides the sub-family defaults (interpolation, preprocessing)
    try:
        out = module.convert(sd, raw, name if family else None, overrides or {})
    except (UnknownLayoutError, InconsistentCheckpointError) as e:
        if not named:
            raise
        from vitviz.core.reading.towers import ROUTE

        raise type(e)(f"{e}. Its config names {named}, a model vitviz reads only by the structure of its "
                      f"tensors; to see its attention, {ROUTE}") from e
    out.dropped = dropped + out.dropped
    if raw.tower is not None and raw.preprocessor and "preprocess" not in out.hints:
        # a composite model's processor prepares the images its tower sees
        from vitviz.core.reading.families.hf import _hf_preprocess

        pre = _hf_preprocess(raw.preprocessor)
        if pre:
            out.hints["preprocess"] = (pre, f"metadata: preprocessor_config.json (the {raw.tower.model_type!r} "
                                            "processor)")
    return out


# Sub-configs of a composite transformers model (its parts).
_PARTS = ("vision_config", "text_config", "backbone_config", "qformer_config", "audio_config")


def _composite(cfg: dict[str, Any]) -> bool:
    """Whether a transformers config names a model of several parts that is not a family vitviz reads."""
    model_type = cfg.get("model_type")
    return isinstance(model_type, str) and model_type not in HF_MODEL_TYPES and \
        any(isinstance(cfg.get(k), dict) for k in _PARTS)


def named_by(raw: RawCheckpoint) -> str:
    """What the config beside a file names it ('transformers model_type 'convnext'', 'timm architecture
    'resnet50'', 'an open_clip model config'), '' when nothing does or it names a transformers model vitviz reads:
    said when its layout is refused."""
    cfg = raw.config or {}
    if isinstance(cfg.get("architecture"), str):
        return f"timm architecture {cfg['architecture']!r} (config.json)"
    if isinstance(cfg.get("model_type"), str) and cfg["model_type"] and cfg["model_type"] not in HF_MODEL_TYPES:
        arch = cfg.get("architectures")
        arch = f", {arch[0]}" if isinstance(arch, list) and arch and isinstance(arch[0], str) else ""
        return f"transformers model_type {cfg['model_type']!r}{arch} (config.json)"
    if any(isinstance(d, dict) and ("model_cfg" in d or "vision_cfg" in d) for _, d in raw.sidecars):
        return "an open_clip model config (open_clip_config.json)"
    return ""


def what_config_names(raw: RawCheckpoint) -> tuple[str, str]:
    """(what the config beside a file names it, the name a message must hold): ("transformers model_type 'eomt'
    (EomtForUniversalSegmentation, config.json)", 'eomt'), ("timm architecture 'cait_xxs24_224' (config.json)",
    'cait_xxs24_224'), an open_clip config; ('', '') when nothing names it (a bare state dict)."""
    cfg = raw.config or {}
    if isinstance(cfg.get("architecture"), str) and cfg["architecture"]:
        return f"timm architecture {cfg['architecture']!r} (config.json)", cfg["architecture"]
    if isinstance(cfg.get("model_type"), str) and cfg["model_type"]:
        arch = cfg.get("architectures")
        arch = f"{arch[0]}, " if isinstance(arch, list) and arch and isinstance(arch[0], str) else ""
        return f"transformers model_type {cfg['model_type']!r} ({arch}config.json)", cfg["model_type"]
    named = named_by(raw)
    return named, named


# A refusal says a route when it names what to pass or run: vitviz.load(module), --code, an option (heads=N).
_ROUTE_SAID = re.compile(r"vitviz\.load\(|--code|code=|\blive\b|--[a-z][a-z-]+|\b[a-z_]+=\S")


def named_refusal(error: Exception, raw: RawCheckpoint) -> Exception:
    """`error` (a layout vitviz does not read) said with what the file's config names and the route that works,
    as an error of the same type; `error` itself when it says both already. A bare state dict's is said with what
    its keys look like and the route (`_bare_refusal`)."""
    what, name = what_config_names(raw)
    text = str(error)
    if not what:    # a bare state dict (a model object's refusal is its live path's to say)
        return error if str(raw.path).startswith("<") else _bare_refusal(error, raw)
    said = text.replace(str(raw.path), "")      # (a folder named after its model names nothing: the words must)
    if name.lower() in said.lower() and _ROUTE_SAID.search(said):
        return error
    from vitviz.core.reading.towers import ROUTE

    route = ROUTE if what.startswith("transformers") else (
        "open it with its own code: build it in Python (timm.create_model / open_clip) and pass it to "
        "vitviz.load(module), or name a factory that builds it with --code FILE.py:FACTORY --model FILE")
    return type(error)(f"{text.rstrip('.')}. Its config names {what}, which vitviz does not convert exactly to "
                       f"its reference ViT; to see its attention, {route}")


# What a bare state dict's keys say it could be, where its layout is refused (nothing beside it names the model):
# (pattern over its keys, what, the route; '' for the route of its own code run live).
_LOOKS_LIKE = (
    (re.compile(r"(^|\.)blocks_token_only\.\d+\."), "timm CaiT (cait_*: talking heads and class-attention layers)",
     ""),
    (re.compile(r"\.attn\.meta_mlp\."), "timm SwinV2-CR (swinv2_cr_*: windows with a continuous position MLP)", ""),
    (re.compile(r"^network\.\d+\.\d+\.attn\.attn\.weight$"), "timm VOLO (volo_*: outlook attention, then class "
     "attention)", "no route shows its attention yet: vitviz.load(model) refuses its outlook attention too (its own "
     "code's maps are not plain softmax attention over the tokens)"),
    (re.compile(r"^patch_embed\.backbone\."), "a timm hybrid ViT (vit_*_r50_* / vit_*_resnet*: a CNN backbone as "
                                               "its patch embedding)", ""),
)
_OWN_CODE = ("To see its attention, build the model in Python (e.g. timm.create_model(NAME) with these weights "
             "loaded) and pass it to vitviz.load(model) (its own code runs, attention captured where it is computed), "
             "or name a factory that builds it with --code FILE.py:FACTORY")


def _bare_refusal(error: Exception, raw: RawCheckpoint) -> Exception:
    """`error` for a file nothing names (a bare state dict) said with what its keys look like and the route that
    works (its own code), as an error of the same type; `error` itself when it says a route already."""
    text = str(error)
    if _ROUTE_SAID.search(text):
        return error
    looks, route = next(((what, route) for pattern, what, route in _LOOKS_LIKE
                         if any(pattern.search(k) for k in raw.tensors)), ("", ""))
    looks = f"; its keys look like {looks}" if looks else ""
    return type(error)(f"{text.rstrip('.')}. Nothing beside the file names its model (a bare state dict){looks}. "
                       f"{route[:1].upper() + route[1:] if route else _OWN_CODE}")


def detect(keys: set[str], raw: RawCheckpoint) -> str:
    """The family of a prefix-stripped key set (checkpoint-formats.md §9)."""
    for module in FAMILIES:
        found = module.detect(keys, raw)
        if found:
            return found
    # structural claims every file with attention-shaped weights, so what is left has none
    if any(k.startswith("visual.") for k in keys):
        hint = "keys under visual. but no CLIP vision tower (visual.class_embedding / visual.trunk.) in them"
    else:
        hint = "no attention weights (no query/key/value or in-projection tensors), so not a Vision Transformer"
    named = named_by(raw)
    if named:  # the config names a model vitviz does not convert: say which, and the route that works
        from vitviz.core.reading.towers import ROUTE

        hint += (f"; its config names {named}, a model whose layout vitviz does not convert to its reference ViT. "
                 f"To see its attention, {ROUTE}")
    raise UnknownLayoutError(
        f"{raw.path}: unknown checkpoint layout ({len(keys)} tensors; {hint}). Most common key stems: "
        f"{', '.join(key_stems(sorted(keys)))}. Expected a ViT state dict from timm, DeiT, DINO/DINOv2, MAE, "
        "torchvision or Hugging Face (keys like patch_embed.proj.weight, blocks.N.attn.qkv.weight), or a hand-written "
        "ViT with q/k/v modules (query/key/value, to_q, q_mappings.N, ...). If it is a Vision Transformer whose "
        "attention modules have names vitviz does not know, open it with its own code: vitviz.load(path, "
        "code='FILE.py:FACTORY') (CLI --code FILE.py:FACTORY), which captures its attention where the code "
        "computes it")
