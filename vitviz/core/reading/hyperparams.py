"""Build a `ModelSpec` from canonical tensors, family hints, metadata and the caller's overrides.

Every inferred value records where it came from in `ModelSpec.provenance`.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from vitviz.core.reading.checkpoint import RawCheckpoint
from vitviz.core.reading.families import (
    PREPROCESS as FAMILY_PREPROCESS, Converted, eval_size, follows_registered_sizes,
    recipe as family_recipe,
)
from vitviz.core.reading.metadata import (
    DIM_HEAD_KEYS, HEADS_KEYS, IMAGE_KEYS, LABEL_KEYS, MEAN_KEYS, STD_KEYS, args_info, as_int, as_labels, as_size,
    as_stats, find_value, heads_from_dim, metadata_sources, named_heads, parse_model_name, torchvision_weights,
)
from vitviz.core.options import (
    ACTIVATIONS, BLOCK_NORMS, HOW_TO_PASS, MLP_KINDS, POOLINGS, REFERENCE, REL_POS_RECIPES, ROPE_KINDS, ROPE_PRESETS,
    overrides_for,
)
from vitviz.core.spec import (
    IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, GuessWarning, ModelSpec, Preprocess, audit_provenance, known_source,
    provenance_kind, whole_patches,
)
from vitviz.errors import InconsistentCheckpointError, OverrideError, VitvizError

# The keywords of the reference route and the fields whose guess changes the model's numbers: `OPTIONS`'.
OVERRIDES = overrides_for(REFERENCE)
ROPE_FIELDS = ("rope", "rope_theta", "rope_half", "rope_xy", "rope_offset", "rope_ref_grid", "rope_periods")


class _Prov:
    """Collects (field, source) pairs."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}

    def set(self, name: str, value: Any, source: str) -> Any:
        self.items[name] = source
        return value


def infer_spec(conv: Converted, raw: RawCheckpoint, overrides: dict[str, Any], warn: bool = True) -> ModelSpec:
    """The full spec for `conv`; raises InconsistentCheckpointError when shapes contradict each other.

    Every guessed value is in the provenance as 'guess: ...' and, with `warn`, said as a `GuessWarning`."""
    sd, hints, prov = conv.tensors, conv.hints, _Prov()
    where = str(raw.path)
    if "patch_embed.proj.weight" not in sd:
        raise InconsistentCheckpointError(f"{where}: ViT layout without a patch embedding "
                                          "(patch_embed.proj.weight); expected a complete model")
    w = sd["patch_embed.proj.weight"]
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise InconsistentCheckpointError(f"{where}: patch embedding has shape {tuple(w.shape)}; expected "
                                          "(embed_dim, channels, patch, patch)")
    dim, in_chans, patch = int(w.shape[0]), int(w.shape[1]), int(w.shape[-1])
    depth = len({int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))})
    if depth == 0:
        raise InconsistentCheckpointError(f"{where}: no transformer blocks (blocks.N.*) found")
    sources = metadata_sources(raw.meta, raw.sidecars)
    name, name_fields = _model_name(conv, raw)
    info = parse_model_name(name) if name else None
    margs = (raw.config or {}).get("model_args") or {}
    if margs.get("num_heads") and "num_heads" not in hints:
        if not isinstance(margs["num_heads"], int) or isinstance(margs["num_heads"], bool):
            # a list is one count per stage (Swin): not a plain ViT's
            raise InconsistentCheckpointError(
                f"{where}: config.json model_args.num_heads is {margs['num_heads']!r}; expected one whole number of "
                "heads for this plain ViT's blocks (a list is one count per stage, as a hierarchical model has)")
        hints = {**hints, "num_heads": (int(margs["num_heads"]), "metadata: config.json model_args")}
    qkv = sd.get("blocks.0.attn.qkv.weight")
    width = int(qkv.shape[0]) // 3 if qkv is not None else dim
    heads = _heads(sd, hints, overrides, info, name, width, prov, where, sources, conv.family)
    counts = _token_counts(sd)
    pos_kind = _pos_kind(sd, hints, overrides, prov, where)
    pos_prefix, pos_grid = _pos_layout(sd, hints, raw, conv, counts, patch, name_fields, info, prov, where,
                                       overrides.get("image_size"), sources, pos_kind)
    fields = dict(
        family=overrides.get("family") or conv.family, source=where, patch_size=patch, embed_dim=dim,
        depth=depth, num_heads=heads, in_chans=in_chans, pos_prefix=pos_prefix, pos_grid=pos_grid,
        pos_embed="pos_embed" in sd or pos_kind not in ("learned", "none"),
        pos_kind="learned" if pos_kind == "none" else pos_kind, **counts,
        **_shape_flags(sd, hints, overrides, dim, width, prov),
    )
    fields.update(_rope(hints, overrides, prov, pos_grid, where, "rope.freqs" in sd))
    if "rope" not in prov.items:  # RoPE has no weights: its absence is read off a stored table and no config naming it
        prov.set("rope", "", "shape: a stored position table, no RoPE frequencies, nothing naming RoPE"
                 if "pos_embed" in sd or "rel_pos_bias.relative_position_bias_table" in sd
                 or "blocks.0.attn.relative_position_bias_table" in sd or "shared_rel_pos.mlp.fc1.weight" in sd
                 or "blocks.0.attn.rel_pos.mlp.fc1.weight" in sd else
                 (f"default: no RoPE frequencies and nothing naming RoPE; positions from the computed {pos_kind} table"
                  if pos_kind in POS_KINDS_COMPUTED else
                  "default: no position table and nothing naming RoPE: a model without positions"))
    fields.update(_heads_extra(sd, hints, fields, prov))
    fields["eps"] = _pick("eps", overrides, hints, 1e-6, prov, "default: timm LayerNorm eps")
    act = overrides.get("act")
    fields["mlp_kind"] = prov.set("mlp_kind", act, "override") if act else \
        _pick("mlp_kind", {}, hints, "gelu", prov, "default: exact GELU")
    fields["pos_interp"] = _pick("pos_interp", overrides, hints, "timm", prov, "default: timm recipe")
    fields["block_norm"] = _pick("block_norm", overrides, hints, "pre", prov, "default: pre-norm blocks")
    fields["attn_scale"] = float(_pick("attn_scale", overrides, hints, 0.0, prov, "default: head_dim ** -0.5"))
    if "norm_kind" in hints:  # only a family whose norms are not LayerNorms says so (AIMv2's RMSNorm)
        fields["norm_kind"] = str(prov.set("norm_kind", hints["norm_kind"][0], hints["norm_kind"][1]))
    if "patch_pad" in hints:  # only a family whose patch conv is padded says so (ViTPose)
        fields["patch_pad"] = int(prov.set("patch_pad", int(hints["patch_pad"][0]), hints["patch_pad"][1]))
    if fields["pre_logits"]:
        fields["pre_logits_act"] = _pick("pre_logits_act", {"pre_logits_act": overrides.get("head_act")}, hints,
                                         "tanh", prov, "default: Tanh (timm / JAX representation layer)")
    _check_choices(fields, where)
    # a composite model's tower runs at its own table's size (Depth Anything's DINOv2 at 518), not at the size its
    # family's classifiers are evaluated at
    fields["image_size"] = _image_size(overrides, conv.family if raw.tower is None else "", pos_grid, patch, prov)
    fields["preprocess"] = _preprocess(conv, raw, overrides, fields["image_size"], in_chans, sources, prov)
    fields["labels"] = _labels(conv, raw, overrides, fields["num_classes"], sources, prov)
    for key in ("num_heads", "pos_grid", "pos_prefix"):
        prov.items.setdefault(key, "shape")
    for key in ("patch_order", "token_order", "patch_embed", "model_args"):
        if key in hints:
            prov.set(key, hints[key][0], hints[key][1])
    if overrides.get("eps_final") is not None:
        fields["eps_final"] = prov.set("eps_final", float(overrides["eps_final"]), "override")
    elif "eps_final" in hints and overrides.get("eps") is None:
        fields["eps_final"] = prov.set("eps_final", float(hints["eps_final"][0]), hints["eps_final"][1])
    _derived_sources(sd, fields, prov)
    if raw.nest_others:
        prov.set("nest_key", raw.nest_key, nest_key_source(raw))
    prov.set("identity", fields["family"], _identity(conv, raw, name))
    spec = ModelSpec(**fields, provenance=tuple(sorted(prov.items.items())))
    if os.environ.get("VITVIZ_AUDIT") and (problems := audit_provenance(spec)):
        raise AssertionError(f"{where}: provenance audit ({spec.family}): " + "; ".join(problems))
    if warn:
        warn_guesses(spec)
    return spec


def warn_guesses(spec: Any, describe: Callable[[Any, str], str] | None = None) -> None:
    """Say loudly (a `GuessWarning` each, num_heads first) which values nothing in the file gave, and how to pass
    the right ones (`describe(spec, name)`: a plain ViT's words by default, `WindowedSpec.describe_guess` for a
    windowed spec's own settings)."""
    for name, _ in sorted(spec.guesses, key=lambda g: g[0] != "num_heads"):
        warnings.warn(f"{spec.source}: {(describe or describe_guess)(spec, name)}", GuessWarning, stacklevel=3)


# The tensor each structural flag is read from (its presence or absence is the value).
_FLAG_KEYS = {
    "qkv_bias": "blocks.0.attn.qkv.bias", "qk_norm": "blocks.0.attn.q_norm.weight", "layer_scale": "blocks.0.ls1.gamma",
    "patch_bias": "patch_embed.proj.bias", "final_norm": "norm.weight", "fc_norm": "fc_norm.weight",
    "head_dist": "head_dist.weight", "attn_proj": "blocks.0.attn.proj.weight", "proj_bias": "blocks.0.attn.proj.bias",
    "mlp_bias": "blocks.0.mlp.fc1.bias", "patch_norm_in": "patch_embed.norm_in.weight",
    "patch_norm": "patch_embed.norm.weight", "norm_extra": "norm_extra.weight", "norm_pre": "norm_pre.weight",
    "head_bias": "head.bias", "attn_norm": "blocks.0.attn.norm.weight", "mlp_norm": "blocks.0.mlp.norm.weight",
    "cls_token": "cls_token", "dist_token": "dist_token", "reg_tokens": "reg_token", "pos_embed": "pos_embed",
    "pre_logits": "pre_logits.fc.weight", "rel_pos": "relative_position_bias_table",
}
_SHAPE_OF = {"patch_size": "patch_embed.proj.weight", "embed_dim": "patch_embed.proj.weight",
             "in_chans": "patch_embed.proj.weight", "depth": "blocks.N.*", "mlp_hidden": "blocks.0.mlp.fc1.weight",
             "num_classes": "head.weight", "attn_dim": "blocks.0.attn.qkv.weight", "pool_mlp": "attn_pool.mlp.fc1.weight"}


def _derived_sources(sd: dict[str, torch.Tensor], fields: dict[str, Any], prov: _Prov) -> None:
    """A 'shape: ...' entry for every field read off the tensors themselves (which tensor is there, its shape),
    so that every field that changes the computation says where it came from."""
    for name, key in _SHAPE_OF.items():
        prov.items.setdefault(name, f"shape: {key}")
    for name, key in _FLAG_KEYS.items():
        present = any(k == key or k.endswith("." + key) for k in sd) if "." not in key else key in sd
        prov.items.setdefault(name, f"shape: {key} {'present' if present else 'absent'}")


def _identity(conv: Converted, raw: RawCheckpoint, name: str) -> str:
    """Whether something names the model (then the family's defaults are that model's facts), or only its key
    layout was recognised (then they are conventions: assumed, and flagged)."""
    cfg = raw.config or {}
    if isinstance(cfg.get("architecture"), str):
        return f"named: timm architecture {cfg['architecture']!r} (config.json)"
    if raw.tower is not None:   # a composite model's vision tower (vitviz.core.reading.towers)
        return f"named: {raw.tower.describe()} (config.json)"
    if conv.family.startswith("hf") and (cfg.get("model_type") or cfg.get("vision_config")):
        return f"named: transformers model_type {cfg.get('model_type') or 'vision_config'!r} (config.json)"
    if conv.hints.get("open_clip_config"):
        return f"named: open_clip model config ({conv.hints['open_clip_config'][1]})"
    tv = torchvision_weights(raw.weights_file.name) if conv.family == "torchvision" and raw.weights_file else None
    if tv:
        return f"named: torchvision {tv['arch']} (file name)"
    if name:
        return f"named: model name {name!r} (training args)"
    published = _published_file(raw)
    if published:
        return published
    return (f"derived: the key layout of a {conv.family} file; nothing names the model, so its family's "
            "settings are assumptions")


_HUB_NAME = re.compile(r"^(?P<name>.+)-(?P<hash>[0-9a-f]{8,64})\.(?:pth|pt|bin|safetensors)$")
HASH_LIMIT = 4 << 30      # bytes: the largest file hashed to check its torch-hub name (published ViTs: up to 2.5 GB)
HASH_SLACK = 4            # a file this many times larger than its tensors (plus 64 MiB) is no published release


def _published_file(raw: RawCheckpoint) -> str:
    """'named: ...' when the file is a published release under its torch-hub name 'NAME-HASH.pth' and its sha256
    starts with HASH (the check torch.hub makes): the file is then that model, not a look-alike; '' otherwise.

    The hash reads the whole file, so it is bounded: a file far larger than the tensors it holds (padding, extra
    data: not the release) is not hashed, and one over HASH_LIMIT is not hashed either, which its provenance says.
    """
    path = raw.weights_file
    m = _HUB_NAME.match(path.name) if path is not None else None
    if m is None or not path.is_file():
        return ""
    size = path.stat().st_size
    held = sum(t.numel() * t.element_size() for t in raw.tensors.values())
    if raw.tower is None and size > HASH_SLACK * held + (64 << 20):
        return ""
    if size > HASH_LIMIT:
        return (f"derived: the key layout of a {m.group('name')!r} file; its torch-hub name is not checked (a "
                f"{size / (1 << 30):.1f} GiB file is not hashed, over {HASH_LIMIT >> 30} GiB), so its family's "
                "settings are assumptions")
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    if not digest.hexdigest().startswith(m.group("hash")):
        return ""
    return (f"named: the published file {m.group('name')!r} (its sha256 starts with {m.group('hash')}, as its "
            "torch-hub name says)")


def nest_key_source(raw: RawCheckpoint) -> str:
    """The provenance of the state dict taken from a training checkpoint that holds several different ones (EMA
    and raw weights, a teacher and a student): nothing in the file says which the user means."""
    others = ", ".join(repr(k) for k in raw.nest_others)
    return (f"assumed: the weights under {raw.nest_key!r} (vitviz's order: EMA first, as timm loads them; DINO's "
            f"teacher); the file also holds other weights under {others} (pass nest_key={raw.nest_others[0]!r})")


def describe_guess(spec: ModelSpec, name: str, cli: bool = False) -> str:
    """'num_heads = 1 is a guess: <why>; if that is wrong, pass heads=N (CLI --heads N); heads that divide ...'
    (with `cli`, only the command-line option)."""
    source = spec.source_of(name)
    value: Any = getattr(spec, name, "")
    if name == "preprocess":
        value = f"mean {spec.preprocess.mean}, std {spec.preprocess.std}"
    elif name == "eps" and not spec.eps_final:
        value = f"{value} (every LayerNorm, the final norms included; their own: eps_final=E, CLI --eps-final E)"
    elif name == "attn_scale" and not value:
        value = f"head_dim**-0.5 ({spec.head_dim ** -0.5:.4g})"
    elif name == "rope" and not value:
        value = "none"
    elif name == "pool_heads" and not value:
        value = f"{spec.num_heads} (the model's heads)"
    elif name == "nest_key":
        value = re.search(r"'([^']*)'", source).group(1) if "'" in source else ""
    elif name in ("token_order", "patch_order") and not value:
        value = dict(spec.provenance).get(name, "")  # a pseudo-field: no spec value, only its provenance
        value = {"token_order": "prefix tokens first", "patch_order": "p1p2c"}.get(name, value)
    elif isinstance(value, (tuple, list)) and len(value) > 6:   # e.g. 1000 labels: a few and the count
        value = f"({', '.join(repr(v) for v in value[:3])}, ... {len(value)} in all)"
    guessed = source.startswith("guess")
    why = re.sub(r"\s*\(pass [^)]*\)", "", re.sub(r"^(guess|assumed|default|family|table|layout):\s*", "", source))
    if source in ("default", "family", "table"):  # a bare word: say what it means
        why = f"the {source} value; nothing in the file says otherwise"
    how = HOW_TO_PASS.get(name, f"{name}=...")
    if cli and (m := re.search(r"\(CLI ([^)]*)\)", how)):
        how = m.group(1)
    if name == "num_heads":
        w = spec.attn_width
        how += f"; heads that divide the width {w}: " + ", ".join(str(h) for h in range(1, min(w, 64) + 1)
                                                                   if w % h == 0)
    what = "a guess" if guessed else "assumed"
    shown = f"{name} = {value}" if value not in ("", None) else name   # a pseudo-field: its source says it all
    return f"{shown} is {what}: {why}; if that is wrong, pass {how}"


def _rope(hints: dict[str, Any], overrides: dict[str, Any], prov: _Prov, pos_grid: tuple[int, int],
          where: str, has_freqs: bool) -> dict[str, Any]:
    """The RoPE fields: a `rope=` preset override, else the family's hints (every field with its source).
    A reference grid of (-1, -1) is the native grid (Perception Encoder)."""
    out: dict[str, Any] = {}
    preset = overrides.get("rope")
    if preset is not None:
        if preset not in ROPE_PRESETS:
            raise VitvizError(f"{where}: rope={preset!r}; expected one of {', '.join(ROPE_PRESETS)}")
        values = dict(ROPE_PRESETS[preset])
        if values.get("rope_ref_grid") == (-1, -1):
            values["rope_ref_grid"] = tuple(pos_grid)
        if values.get("rope") == "mixed" and not has_freqs:
            raise VitvizError(f"{where}: rope={preset!r} needs the learned frequencies (rope.freqs), which the file "
                              "does not hold")
        for name in ROPE_FIELDS:
            out[name] = prov.set(name, values.get(name, ModelSpec.__dataclass_fields__[name].default),
                                 f"override: rope={preset!r}")
        if preset != "none" and hints.get("rope_periods", (False,))[0]:
            out["rope_periods"] = prov.set("rope_periods", True, hints["rope_periods"][1])
        return out
    if "rope" not in hints or not hints["rope"][0]:
        return out
    rope_source = hints["rope"][1]
    for name in ROPE_FIELDS:
        if name in hints:
            value = hints[name][0]
            if name == "rope_ref_grid":
                value = tuple(pos_grid) if tuple(value) == (-1, -1) else tuple(value)
            # a preset's settings share the preset's word (a family's "see rope" included)
            source = hints[name][1] if known_source(hints[name][1]) else rope_source
            out[name] = prov.set(name, value, source)
        else:  # not in the preset: the spec's own value, which the preset (and so its source) leaves as it is
            prov.set(name, ModelSpec.__dataclass_fields__[name].default, rope_source)
    if out.get("rope") == "mixed" and not has_freqs:
        raise VitvizError(f"{where}: RoPE-Mixed needs its learned frequencies (rope.freqs), which the file does "
                          "not hold")
    if out.get("rope") not in ROPE_KINDS:
        raise VitvizError(f"{where}: RoPE kind {out.get('rope')!r}; expected one of {', '.join(ROPE_KINDS)}")
    return out


def _heads_extra(sd: dict[str, torch.Tensor], hints: dict[str, Any], fields: dict[str, Any],
                 prov: _Prov) -> dict[str, Any]:
    """Fields of the newer families read from shapes and hints: CLIP's projection head, the MAP pooling head,
    BEiT's relative position bias, EVA-02's sub-LNs, `norm_pre`."""
    out: dict[str, Any] = dict(norm_pre="norm_pre.weight" in sd, attn_norm="blocks.0.attn.norm.weight" in sd,
                               mlp_norm="blocks.0.mlp.norm.weight" in sd,
                               head_bias="head.bias" in sd or "head.weight" not in sd)
    if "embed_out" in hints and "head.weight" in sd:
        out["embed_out"] = prov.set("embed_out", int(sd["head.weight"].shape[0]), hints["embed_out"][1])
        fields["num_classes"] = prov.set("num_classes", 0, f"{hints['embed_out'][1]} (the head is an embedding "
                                         "projection, not a classifier)")
        prov.items.pop("labels", None)
    if fields.get("pooling") == "map":
        out["pool_mlp"] = int(sd["attn_pool.mlp.fc1.weight"].shape[0])
        heads = hints.get("pool_heads", (0, "default: the model's heads (timm AttentionPoolLatent)"))
        out["pool_heads"] = prov.set("pool_heads", int(heads[0]), heads[1])
        for name, default, why in (("pool_act", "", "default: the MAP head's MLP uses the blocks' activation "
                                    "(timm AttentionPoolLatent)"),
                                   ("pool_prefix", False, "default: the MAP head attends to the patch tokens only "
                                    "(timm AttentionPoolLatent over a model without prefix tokens)")):
            if name in hints:
                out[name] = prov.set(name, hints[name][0], hints[name][1])
            else:
                prov.set(name, default, why)
    if "rel_pos_bias.relative_position_bias_table" in sd:
        out["rel_pos"] = prov.set("rel_pos", "shared", "shape: rel_pos_bias.relative_position_bias_table")
    elif "blocks.0.attn.relative_position_bias_table" in sd:
        out["rel_pos"] = prov.set("rel_pos", "layer", "shape: blocks.N.attn.relative_position_bias_table")
    for key, where in (("shared_rel_pos.mlp.fc1.weight", "shared"), ("blocks.0.attn.rel_pos.mlp.fc1.weight", "layer")):
        if key in sd:  # timm's log-coordinate MLP (vit_relpos_*): computed for any grid, nothing to resample
            out["rel_pos"] = prov.set("rel_pos", where, f"shape: {key.replace('0', 'N', 1)}")
            out["rel_pos_mlp"] = prov.set("rel_pos_mlp", int(sd[key].shape[0]), f"shape: {key}")
            break
    if out.get("rel_pos") and not out.get("rel_pos_mlp"):
        recipe = hints.get("rel_pos_interp", ("timm", "default: timm / unilm BEiT table resampling"))
        if recipe[0] not in REL_POS_RECIPES:
            raise VitvizError(f"relative-position recipe {recipe[0]!r}; expected one of {REL_POS_RECIPES}")
        out["rel_pos_interp"] = prov.set("rel_pos_interp", recipe[0], recipe[1])
    return out


def _check_choices(fields: dict[str, Any], where: str) -> None:
    checks = (("pooling", POOLINGS), ("block_norm", BLOCK_NORMS), ("mlp_kind", MLP_KINDS),
              ("pre_logits_act", ACTIVATIONS))
    for name, allowed in checks:
        if name in fields and fields[name] not in allowed:
            raise VitvizError(f"{where}: {name} {fields[name]!r}; expected one of {', '.join(allowed)}")
    if fields["attn_scale"] < 0:
        raise VitvizError(f"{where}: attn_scale {fields['attn_scale']}; expected a positive factor (0: head_dim**-0.5)")


def _model_name(conv: Converted, raw: RawCheckpoint) -> tuple[str, dict[str, Any]]:
    cfg = raw.config or {}
    if isinstance(cfg.get("architecture"), str):  # timm hub config.json
        return cfg["architecture"], {}
    name, fields = args_info(raw.meta)
    if not name and conv.family == "torchvision":
        tv = torchvision_weights(raw.weights_file.name if raw.weights_file else "")
        if tv:
            return tv["arch"], {"image_size": tv["image_size"], "source": f"metadata: file name ({tv['weights']})"}
    return name, fields


POS_KINDS_COMPUTED = ("sincos1d", "sincos2d")


def _pos_kind(sd: dict[str, torch.Tensor], hints: dict[str, Any], overrides: dict[str, Any], prov: _Prov,
              where: str) -> str:
    """'learned' (a stored table), a computed table ('sincos1d', 'sincos2d') or 'none': a stored table is what it
    is; without one, the override (`pos_kind=`), the family's word, or none."""
    asked = overrides.get("pos_kind")
    if "pos_embed" in sd:
        if asked and asked != "learned":
            raise OverrideError(f"{where}: pos_kind={asked!r}, but the file holds a position table "
                              f"pos_embed {tuple(sd['pos_embed'].shape)}; expected pos_kind= only for a file without "
                              "one (the table in the file is the one the model adds)")
        return prov.set("pos_kind", "learned", "shape: pos_embed (a stored position table)")
    if asked:
        return prov.set("pos_kind", asked, "override")
    if "pos_kind" in hints:
        return prov.set("pos_kind", hints["pos_kind"][0], hints["pos_kind"][1])
    return prov.set("pos_kind", "learned", "default: a stored position table")


def _pick(name: str, overrides: dict[str, Any], hints: dict[str, Any], default: Any, prov: _Prov,
          default_src: str) -> Any:
    if overrides.get(name) is not None:
        return prov.set(name, overrides[name], "override")
    if name in hints:
        return prov.set(name, hints[name][0], hints[name][1])
    return prov.set(name, default, default_src)


def _relative_position_heads(sd: dict[str, torch.Tensor]) -> tuple[int, str] | None:
    """The head count a relative position bias states: one column per head of BEiT's table, one output per head of
    timm's relpos MLP; None without one."""
    table = sd.get("blocks.0.attn.relative_position_bias_table", sd.get("rel_pos_bias.relative_position_bias_table"))
    if table is not None and table.dim() == 2:
        return int(table.shape[1]), "shape: relative_position_bias_table (one column per head)"
    fc2 = sd.get("blocks.0.attn.rel_pos.mlp.fc2.weight")
    if fc2 is not None and fc2.dim() == 2:
        return int(fc2.shape[0]), "shape: attn.rel_pos.mlp.fc2 (one output per head)"
    return None


def _heads(sd: dict[str, torch.Tensor], hints: dict[str, Any], overrides: dict[str, Any], info: Any,
           name: str, width: int, prov: _Prov, where: str, sources: list[tuple[str, dict[str, Any]]],
           family: str) -> int:
    """num_heads: override, family metadata (config.json, per-head modules), training args / text configs beside
    the file (`heads`, `num_heads`, `dim_head`, ...), the model name, q_norm's width, the family's default, and
    last the width (`width` = q/k/v width): a table for the registered families, a said guess otherwise."""
    cfg_heads = hints.get("num_heads")
    qn = sd.get("blocks.0.attn.q_norm.weight")
    meta_heads = find_value(sources, HEADS_KEYS, as_int)
    meta_dim_head = find_value(sources, DIM_HEAD_KEYS, as_int)
    rel_heads = _relative_position_heads(sd)
    if overrides.get("heads"):
        heads, src = int(overrides["heads"]), "override"
    elif cfg_heads:
        heads, src = cfg_heads
    elif meta_heads:
        heads, src = meta_heads
    elif meta_dim_head and width % meta_dim_head[0] == 0:
        heads, src = width // meta_dim_head[0], f"{meta_dim_head[1]} (width {width} / head dim)"
    elif info is not None and (by_name := named_heads(name, width)) is not None:
        heads, src = by_name
    elif rel_heads is not None:
        heads, src = rel_heads
    elif qn is not None:
        heads, src = width // int(qn.shape[0]), "shape: attn.q_norm.weight (head_dim)"
    elif hints.get("default_heads") and width == hints["default_heads"][0][1]:
        heads, src = hints["default_heads"][0][0], hints["default_heads"][1]
    elif hints.get("dim_head") and width % hints["dim_head"][0] == 0:
        heads, src = width // hints["dim_head"][0], hints["dim_head"][1]
    else:
        heads, src = heads_from_dim(width)
        if not follows_registered_sizes(family) and not src.startswith("guess"):
            src = f"guess: {src} (a {family} layout need not follow the registered sizes)"
    if heads <= 0 or width % heads:
        raise InconsistentCheckpointError(f"{where}: {heads} heads ({src}) do not divide the attention width {width}; "
                                          "expected a head count that divides the width of q/k/v (pass heads=N)")
    return prov.set("num_heads", int(heads), src)


def _token_counts(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    reg = sd.get("reg_token")
    return dict(cls_token="cls_token" in sd, dist_token="dist_token" in sd,
                reg_tokens=int(reg.shape[1]) if reg is not None else 0)


def _shape_flags(sd: dict[str, torch.Tensor], hints: dict[str, Any], overrides: dict[str, Any], dim: int,
                 width: int, prov: _Prov) -> dict[str, Any]:
    head = sd.get("head.weight")
    pre = sd.get("pre_logits.fc.weight")
    proj = "blocks.0.attn.proj.weight" in sd
    flags = dict(
        mlp_hidden=int(sd["blocks.0.mlp.fc1.weight"].shape[0]) if "blocks.0.mlp.fc1.weight" in sd else 0,
        num_classes=int(head.shape[0]) if head is not None else 0,
        qkv_bias="blocks.0.attn.qkv.bias" in sd, qk_norm="blocks.0.attn.q_norm.weight" in sd,
        layer_scale="blocks.0.ls1.gamma" in sd, patch_bias="patch_embed.proj.bias" in sd,
        final_norm="norm.weight" in sd, fc_norm="fc_norm.weight" in sd,
        pre_logits=int(pre.shape[0]) if pre is not None else 0, head_dist="head_dist.weight" in sd,
        attn_dim=width if width != dim else 0, attn_proj=proj, proj_bias=not proj or "blocks.0.attn.proj.bias" in sd,
        mlp_bias="blocks.0.mlp.fc1.weight" not in sd or "blocks.0.mlp.fc1.bias" in sd,
        patch_norm_in="patch_embed.norm_in.weight" in sd, patch_norm="patch_embed.norm.weight" in sd,
        norm_extra="norm_extra.weight" in sd,
    )
    if overrides.get("pooling"):
        flags["pooling"] = prov.set("pooling", overrides["pooling"], "override")
    elif "pooling" in hints:
        flags["pooling"] = prov.set("pooling", hints["pooling"][0], hints["pooling"][1])
    elif "attn_pool.latent" in sd:
        flags["pooling"] = prov.set("pooling", "map", "shape: attn_pool.latent (MAP head: a latent query pools)")
    elif flags["fc_norm"] or "cls_token" not in sd:
        flags["pooling"] = prov.set("pooling", "avg", "shape: fc_norm or no cls_token -> average of patches")
    else:
        flags["pooling"] = prov.set("pooling", "token", "shape: cls_token")
    return flags


def _pos_layout(sd: dict[str, torch.Tensor], hints: dict[str, Any], raw: RawCheckpoint, conv: Converted,
                counts: dict[str, Any], patch: int, name_fields: dict[str, Any], info: Any, prov: _Prov,
                where: str, requested: Any = None,
                sources: list[tuple[str, dict[str, Any]]] | None = None,
                pos_kind: str = "learned") -> tuple[int, tuple[int, int]]:
    """How many prefix tokens the position embedding covers, and the grid it was trained at.

    Without metadata the grid is taken as square, unless the caller's `image_size` fits the embedding: then a
    non-square training size is read from it.
    """
    n_prefix = int(counts["cls_token"]) + int(counts["dist_token"]) + counts["reg_tokens"]
    size, size_src = _stored_image_size(hints, raw, name_fields, info, sources or [], patch)
    if size is None and requested and "pos_embed" in sd:
        req = (int(requested), int(requested)) if isinstance(requested, (int, float)) else tuple(map(int, requested))
        n = (req[0] // patch) * (req[1] // patch)
        if int(sd["pos_embed"].shape[1]) - n in ([hints["pos_prefix"][0]] if "pos_prefix" in hints else [n_prefix, 0]):
            size, size_src = req, "override: image_size fits the position embedding"
    pos = sd.get("pos_embed")
    table = sd.get("blocks.0.attn.relative_position_bias_table", sd.get("rel_pos_bias.relative_position_bias_table"))
    if pos is None and table is not None:  # BEiT without an absolute table: the bias table was made for the grid
        side = (math.isqrt(int(table.shape[0]) - 3) + 1) // 2
        grid = (size[0] // patch, size[1] // patch) if size else (side, side)
        if (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3 != int(table.shape[0]):
            raise InconsistentCheckpointError(
                f"{where}: relative position bias table has {int(table.shape[0])} rows, which does not fit the "
                f"grid {grid}; expected (2gh-1)(2gw-1)+3 rows")
        return 0, prov.set("pos_grid", grid, size_src if size else "shape: relative position bias table")
    if pos is None:
        if size is None and requested and pos_kind in POS_KINDS_COMPUTED:  # a computed table is made for the input
            size = (int(requested), int(requested)) if isinstance(requested, (int, float)) else \
                tuple(map(int, requested))
            size_src = "override: image_size (the computed position table is made for it)"
        if size is None and pos_kind in POS_KINDS_COMPUTED and int(sd["patch_embed.proj.weight"].shape[1]) == 1 \
                and 28 % patch == 0:   # a 1-channel model that says no size: MNIST's
            size, size_src = (28, 28), ("guess: a 1-channel model with no stored position table and no image size in "
                                        "any metadata: 28 px, MNIST's size")
        grid = (size[0] // patch, size[1] // patch) if size else (14, 14)
        kind = pos_kind
        computed = kind not in ("learned", "none") or bool(hints.get("rope", ("",))[0])
        if kind == "sincos1d":  # a table over the whole sequence: the prefix tokens have rows too
            prov.set("pos_prefix", n_prefix, f"derived: pos_kind sincos1d, a table over every token, the "
                                             f"{n_prefix} prefix token(s) first")
            return n_prefix, prov.set("pos_grid", grid, size_src if size else
                                      "guess: no stored position table and no image size in any metadata; a 14x14 "
                                      f"grid ({14 * patch} px)")
        return 0, prov.set("pos_grid", grid, size_src if size else
                           ("guess: no stored position table and no image size in any metadata; a 14x14 grid "
                            f"({14 * patch} px)" if computed else "default"))
    length = int(pos.shape[1])
    options = [hints["pos_prefix"][0]] if "pos_prefix" in hints else [n_prefix, 0]

    def fits(k: int) -> bool:
        n = length - k
        if size:
            return (size[0] // patch) * (size[1] // patch) == n
        return n > 0 and math.isqrt(n) ** 2 == n

    def prefix_source(k: int) -> str:
        # the family's word is needed only when the other count would fit the table too
        other = {n_prefix, 0} - {k}
        if "pos_prefix" in hints and any(fits(o) for o in other):
            return hints["pos_prefix"][1]
        return f"shape: pos_embed length ({length} rows = {k} prefix + patches)"

    for k in options:
        n = length - k
        if size:
            grid = (size[0] // patch, size[1] // patch)
            if grid[0] * grid[1] == n:
                prov.set("pos_prefix", k, prefix_source(k))
                return k, prov.set("pos_grid", grid, size_src)
        elif fits(k):
            prov.set("pos_prefix", k, prefix_source(k))
            return k, prov.set("pos_grid", (math.isqrt(n),) * 2, "shape: pos_embed length (square grid)")
    expect = f"image size {size} ({size_src}) with patch {patch}" if size else "a square grid"
    raise InconsistentCheckpointError(
        f"{where}: pos_embed has {length} rows, which does not fit {expect} plus {options} prefix tokens "
        f"({n_prefix} prefix tokens in the file); pass image_size=(h, w) if the model was trained non-square")


def _stored_image_size(hints: dict[str, Any], raw: RawCheckpoint, name_fields: dict[str, Any],
                       info: Any, sources: list[tuple[str, dict[str, Any]]],
                       patch: int) -> tuple[tuple[int, int] | None, str]:
    if "pos_image_size" in hints:
        return tuple(hints["pos_image_size"][0]), hints["pos_image_size"][1]
    if "pos_grid_shape" in hints:  # a (1, D, gh, gw) position table
        (gh, gw), src = hints["pos_grid_shape"]
        return (gh * patch, gw * patch), src
    cfg = raw.config or {}
    margs = cfg.get("model_args") or {}
    pcfg = cfg.get("pretrained_cfg") or {}
    if margs.get("img_size"):
        s = margs["img_size"]
        return ((s, s) if isinstance(s, int) else tuple(s)), "metadata: config.json model_args"
    if pcfg.get("input_size"):
        return tuple(pcfg["input_size"][-2:]), "metadata: config.json pretrained_cfg"
    if name_fields.get("image_size"):
        s = name_fields["image_size"]
        return (s, s), name_fields.get("source", "metadata: training args")
    found = find_value(sources, IMAGE_KEYS, as_size)
    if found:
        return found
    if info is not None and info.image:
        return (info.image, info.image), "metadata: model name"
    return None, ""


def _image_size(overrides: dict[str, Any], family: str, pos_grid: tuple[int, int], patch: int,
                prov: _Prov) -> tuple[int, int]:
    s = overrides.get("image_size")
    if s:
        size = (int(s), int(s)) if isinstance(s, (int, float)) else (int(s[0]), int(s[1]))
        if min(size) < patch:
            raise VitvizError(f"image_size {size} is smaller than one {patch} px patch")
        whole = whole_patches(size, patch)
        if whole != size:  # the patch embedding drops the remainder: say so instead of keeping a size never used
            return prov.set("image_size", whole, f"override {size[0]}x{size[1]}, rounded down to whole {patch} px "
                                                 "patches")
        return prov.set("image_size", size, "override")
    evaluated = eval_size(family)
    if evaluated and pos_grid[0] * patch > evaluated[0]:
        return prov.set("image_size", (evaluated[0],) * 2, f"default: {evaluated[1]} (position embedding resampled)")
    grid_source = prov.items.get("pos_grid", "")
    source = ("shape: position embedding grid" if not grid_source or grid_source.startswith("shape")
              else f"{grid_source} (the native grid x {patch} px patches)")   # no table to read it from (RoPE)
    return prov.set("image_size", (pos_grid[0] * patch, pos_grid[1] * patch), source)


def _preprocess(conv: Converted, raw: RawCheckpoint, overrides: dict[str, Any], size: tuple[int, int],
                in_chans: int, sources: list[tuple[str, dict[str, Any]]], prov: _Prov) -> Preprocess:
    """The family's recipe, or the one its metadata states; mean/std from training args or text configs when
    they are there. A model that is clearly not an ImageNet model (not 3 channels, or 32 px or less) whose
    family recipe is only a default gets no ImageNet statistics: no normalisation, said as a guess unless
    metadata gives mean/std. A 1-channel model, or one of a layout without an eval recipe (hand-written,
    vit-pytorch, nn.TransformerEncoder), is not resized-and-cropped either: the image is brought to the native
    size as a whole; an RGB model of a family with a recipe keeps that family's resize and crop."""
    fam = conv.family if conv.family in FAMILY_PREPROCESS else conv.family.split("-")[0]
    own = family_recipe(conv.family)   # None: a layout without an eval recipe (the image is taken whole below)
    crop_pct, interp, mean, std, mode = own or family_recipe("timm")
    fields: dict[str, Any] = dict(crop=size, resize=int(math.floor(min(size) / crop_pct)), interpolation=interp,
                                  mean=mean, std=std, mode=mode)
    src = f"default: {conv.family} family"
    tv = torchvision_weights(raw.weights_file.name) if conv.family == "torchvision" and raw.weights_file else None
    pcfg = (raw.config or {}).get("pretrained_cfg") or {}
    stated = True
    if tv:
        fields.update(resize=tv["resize"], crop=(tv["crop"],) * 2, interpolation=tv["interpolation"],
                      mean=tv["mean"], std=tv["std"])
        src = f"metadata: torchvision {tv['weights']}"
    elif pcfg:
        fields.update(dataclasses.asdict(Preprocess.from_timm_cfg(pcfg, size, crop_pct, interp, mean, std)))
        src = "metadata: config.json pretrained_cfg"
    elif "preprocess" in conv.hints:
        fields.update(conv.hints["preprocess"][0])
        src = conv.hints["preprocess"][1]
    else:
        stated = False
    meta_mean, meta_std = find_value(sources, MEAN_KEYS, as_stats), find_value(sources, STD_KEYS, as_stats)
    native = in_chans != 3 or max(size) <= 32
    imagenet_stats = tuple(fields["mean"]) in (IMAGENET_MEAN, INCEPTION_MEAN)
    if not stated and not overrides.get("family") and (own is None or native and imagenet_stats):
        what = (f"a {in_chans}-channel" if in_chans != 3 else "an RGB") + f" {size[0]}x{size[1]} px model"
        if in_chans != 3 or own is None:  # no family recipe fits: the image as a whole
            fields.update(resize=min(size), mode="squash")
            recipe = f"the image resized to {size[0]}x{size[1]} as a whole (no crop)"
        else:  # an RGB model of a family with an eval recipe: its resize and crop, as its own tools do
            recipe = f"the {fam} family's resize {fields['resize']} and {fields['mode']} crop"
        if native:
            fields.update(mean=(0.0,), std=(1.0,))
            src = (f"guess: {what} is not an ImageNet model, so no ImageNet statistics: pixels only scaled to "
                   f"[0, 1] (mean 0, std 1); {recipe}")
        else:
            fields.update(mean=IMAGENET_MEAN, std=IMAGENET_STD)
            src = f"guess: {what} without preprocessing metadata: ImageNet mean/std; {recipe}"
        if meta_mean and meta_std:
            src = f"{recipe} ({what})"
    if meta_mean and meta_std:  # what the training run normalised with beats any default
        fields.update(mean=meta_mean[0], std=meta_std[0])
        src = f"{meta_mean[1]} and {meta_std[1].split(': ', 1)[1]}; recipe: {src}"
    pp = Preprocess(**fields)
    if tuple(pp.crop) != tuple(size):
        pp = pp.at_size(size) if overrides.get("image_size") else replace(pp, crop=tuple(size))
    pp, changed = pp.with_overrides(overrides, in_chans)
    src = Preprocess.overridden_source(src, changed)
    prov.set("preprocess", pp, src)
    if not stated and provenance_kind(src) != "assumed":
        # the statistics are read or given, but nothing states how the image is resized and cropped: that stays an
        # assumption of its own (the whole recipe is flagged with `preprocess` when the statistics are assumed too)
        how = (f"resize {pp.resize}, {pp.mode} crop to {pp.crop[0]}x{pp.crop[1]}, {pp.interpolation}")
        given = [k for k in ("resize", "crop_mode") if overrides.get(k) is not None]
        prov.set("resize_recipe", how, "override" if len(given) == 2 else
                 f"assumed: {how} (no config or metadata states the eval resize and crop"
                 + (f"; {given[0]} given" if given else "") + ")")
    return pp


def _labels(conv: Converted, raw: RawCheckpoint, overrides: dict[str, Any], num_classes: int,
            sources: list[tuple[str, dict[str, Any]]], prov: _Prov) -> tuple[str, ...]:
    cfg = raw.config or {}
    tv = torchvision_weights(raw.weights_file.name) if conv.family == "torchvision" and raw.weights_file else None
    meta = find_value(sources, LABEL_KEYS, lambda v: (lambda t: t if t and len(t) == num_classes else None)(as_labels(v)))
    candidates: list[tuple[Any, str]] = [
        (overrides.get("labels"), "override"), (conv.hints.get("labels", (None,))[0], "metadata: config.json"),
        (raw.labels, "metadata: class_indices.json"),
        (tv["categories"] if tv else None, "metadata: torchvision weights"),
        (cfg.get("label_names"), "metadata: config.json label_names"),
        (meta[0] if meta else None, meta[1] if meta else ""),
    ]
    for labels, src in candidates:
        if labels:
            labels = tuple(labels.values()) if isinstance(labels, dict) else tuple(map(str, labels))
            if len(labels) == num_classes:
                return prov.set("labels", labels, src)
    if num_classes == 1000:
        return prov.set("labels", imagenet_labels(), "guess: 1000 classes -> ImageNet-1k names")
    return prov.set("labels", (), "none")


def imagenet_labels() -> tuple[str, ...]:
    """The 1000 ImageNet-1k class names in index order, from vitviz's own resources (the list torchvision ships),
    so that no model fails to open over its label names when torchvision is missing or broken."""
    from vitviz.resources_path import resource

    names = tuple(resource("imagenet_classes.txt").read_text(encoding="utf-8").splitlines())
    if len(names) != 1000:
        raise VitvizError(f"{resource('imagenet_classes.txt')}: {len(names)} class names; expected 1000 "
                          "(reinstall vitviz)")
    return names

