"""`vitviz info CHECKPOINT`: the family and every inferred field of a checkpoint, with where each came from."""
from __future__ import annotations

import argparse
import warnings
from typing import Any

from vitviz.cli.jsonout import document
from vitviz.cli.options import MODEL_HELP, add_override_arguments, guess_lines, overrides_from, with_remembered
from vitviz.core.protocol import WINDOWS, capabilities_of
from vitviz.errors import VitvizError


def build_info_parser(sub: Any) -> None:
    p = sub.add_parser("info", help="describe a checkpoint: family, every inferred field and its source")
    p.add_argument("checkpoint", nargs="?", help=MODEL_HELP + "; with --code, the weights "
                   "for the code's model (optional)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--device", default="cpu", help="device to load on (default: cpu)")
    p.add_argument("--forget", action="store_true", help="forget the answers remembered for this file (the "
                   "window's \"Remember for this file\": heads, norm order, activation, attention scale), then "
                   "describe it without them")
    add_override_arguments(p)


def run_info(args: argparse.Namespace) -> int:
    import vitviz
    from vitviz.cli.models import resolve_cli_model

    if args.checkpoint is None and args.code is None:
        raise VitvizError("info needs a CHECKPOINT (or --code FILE.py:FACTORY)")
    quiet = getattr(args, "quiet", False)
    checkpoint = None if args.checkpoint is None else resolve_cli_model(args.checkpoint, quiet)  # a name: its file
    if getattr(args, "forget", False):
        forget_answers(checkpoint)
    overrides = with_remembered(checkpoint, overrides_from(args))
    from vitviz.core.spec import GuessWarning

    with warnings.catch_warnings():  # said below, with the option that fixes each, instead of as warnings
        warnings.simplefilter("ignore", GuessWarning)
        model = vitviz.load(checkpoint, device=args.device, **overrides)
    if WINDOWS in capabilities_of(model):  # Swin, SAM / ViTDet: stages and windows instead of one token grid
        return _windowed_info(model, args.json)
    layers = getattr(model, "layers", None)  # the live path: which mechanism found which layer
    from vitviz.core.analyses.verify import apply_verification, remembered_verification

    check = remembered_verification(model)   # what `vitviz verify` / an export found, never checked again here
    if check is not None:
        apply_verification(model, check)
    spec = model.spec
    if args.json:
        data = spec.to_dict()
        data["verification"] = None if check is None else {**check.to_dict(), "remembered": True}
        data["labels"] = len(spec.labels)
        data["dropped_keys"] = model.dropped
        if layers is not None:
            data["attention_layers"] = [{"module": name, "mechanism": how} for name, how in layers]
            data["skipped_attention"] = [{"module": name, "mechanism": how, "shape": list(shape)}
                                         for name, how, shape in getattr(model, "skipped", ())]
        print(document("info", data))
        return 0
    prov = dict(spec.provenance)
    print(f"{spec.source}\n  family: {spec.family}")
    rows = [("image_size", spec.image_size), ("patch_size", spec.patch_size), ("grid", spec.grid),
            ("embed_dim", spec.embed_dim), ("depth", spec.depth), ("num_heads", spec.num_heads),
            ("prefix tokens", ", ".join(spec.prefix_names) or "none"), ("pos_prefix", spec.pos_prefix),
            ("pos_grid", spec.pos_grid), ("pos_interp", spec.pos_interp), ("eps", spec.eps),
            ("mlp_kind", spec.mlp_kind), ("mlp_hidden", spec.mlp_hidden), ("qkv_bias", spec.qkv_bias),
            ("qk_norm", spec.qk_norm), ("layer_scale", spec.layer_scale), ("pooling", spec.pooling),
            ("final_norm", spec.final_norm), ("fc_norm", spec.fc_norm), ("pre_logits", spec.pre_logits),
            ("num_classes", spec.num_classes), ("in_chans", spec.in_chans)]
    rows += [(name, value) for name, value, default in (
        ("attn_width", spec.attn_width, spec.embed_dim), ("attn_scale", spec.attn_scale or "head_dim**-0.5", ""),
        ("attn_proj", spec.attn_proj, True), ("block_norm", spec.block_norm, "pre"),
        ("pos_kind", spec.pos_kind, "learned"), ("patch_norm_in", spec.patch_norm_in, False),
        ("patch_norm", spec.patch_norm, False), ("patch_pad", spec.patch_pad, 0),
        ("norm_kind", spec.norm_kind, "layer"),
        ("norm_extra", spec.norm_extra, False),
        ("pre_logits_act", spec.pre_logits_act if spec.pre_logits else "tanh", "tanh"),
        ("positions", spec.position_kind, "learned"), ("norm_pre", spec.norm_pre, False),
        ("embed_out", spec.embed_out, 0), ("head_bias", spec.head_bias, True), ("attn_norm", spec.attn_norm, False),
        ("mlp_norm", spec.mlp_norm, False), ("rope", spec.rope, ""),
        ("rope_theta", spec.rope_theta if spec.rope else "", ""), ("rope_half", spec.rope_half, False),
        ("rope_xy", spec.rope_xy, False), ("rope_offset", spec.rope_offset, 0.0),
        ("rope_ref_grid", spec.rope_ref_grid, (0, 0)), ("rope_periods", spec.rope_periods, False),
        ("rel_pos", spec.rel_pos, ""), ("rel_pos_mlp", spec.rel_pos_mlp, 0),
        ("rel_pos_interp", spec.rel_pos_interp if spec.rel_pos and not spec.rel_pos_mlp else "", ""),
        ("pool_heads", spec.pool_num_heads, 0), ("pool_mlp", spec.pool_mlp, 0),
        ("pool_act", (spec.pool_act or spec.mlp_kind) if spec.pooling == "map" else "", ""),
        ("pool_prefix", spec.pool_prefix, False),
    ) if (value != default or (name in prov and value != "")) and (spec.rope or not name.startswith("rope_"))
        and (name != "pos_kind" or spec.pos_embed)]   # pos_kind is the kind of table: none, nothing to say
    shown = {"grid": "pos_grid", "attn_width": "attn_dim", "prefix tokens": "cls_token"}
    for name, value in rows:
        field = shown.get(name, name)
        if field in prov and not spec.relevant(field) and name != "prefix tokens":
            continue   # e.g. the pooling head's width without a pooling head
        src = prov.get(name.split(" ")[0] if name != "prefix tokens" else "", "")
        kind = spec.kind_of(field) if field in prov else ""
        print(f"  {name:<14} {str(value):<24} {kind:<8} {('(' + src + ')') if src else ''}".rstrip())
    print(f"  identity       {prov.get('identity', '')}")
    pp = spec.preprocess
    print(f"  parameters     {spec.num_params:,}")
    print(f"  preprocess     {pp.mode}: resize {pp.resize}, crop {pp.crop}, {pp.interpolation}, "
          f"mean {pp.mean}, std {pp.std}  ({prov.get('preprocess', '')})")
    print(f"  labels         {len(spec.labels)}  ({prov.get('labels', 'none')})")  # a note, not an attention setting
    if model.dropped:
        print(f"  ignored keys   {len(model.dropped)}: {', '.join(model.dropped[:5])}")
    for line in guess_lines(spec):  # loudly: nothing in the file gave these
        print(f"  !! {line}")
    if layers is None:
        print("  verdict        " + (f"{check.summary()} (remembered from an earlier check)" if check is not None
                                     else "not checked here (vitviz verify MODEL compares it with its original)"))
    if layers is not None:
        print(f"  path           {prov.get('path', '')}")
        for i, (name, how) in enumerate(layers):
            print(f"  layer {i:<8} {name:<36} {how}")
        for name, how, shape in getattr(model, "skipped", ()):   # seen, but not attention over the image tokens
            print(f"  skipped        {name:<36} {how} {tuple(shape)}")
    return 0


def forget_answers(checkpoint: Any) -> None:
    """`--forget`: drop the answers remembered for `checkpoint` and say on stderr what was forgotten (or that
    nothing was remembered).

    Raises:
        VitvizError: no CHECKPOINT (a model built by --code alone has no file to remember answers for).
    """
    import sys

    from vitviz.catalog import answers

    if checkpoint is None:
        raise VitvizError("--forget needs a CHECKPOINT: answers are remembered per model file")
    gone = answers.forget(str(checkpoint))
    print(f"vitviz: forgot what you told the window for {checkpoint}: {answers.describe(gone)}" if gone
          else f"vitviz: nothing was remembered for {checkpoint}", file=sys.stderr)


# the windowed spec's settings in the order info lists them (after the stages and blocks)
_WINDOWED_ROWS = ("image_size", "patch_size", "in_chans", "eps", "eps_embed", "eps_neck", "mlp_kind", "qkv_bias",
                  "attn_kind", "rel_pos", "pretrained_windows", "block_norm", "merge_norm", "patch_norm", "pos_embed",
                  "pos_grid", "pos_interp", "order", "shift_rule", "mask_value", "final_norm", "neck", "neck_dim",
                  "residual_blocks", "num_classes", "pooling", "windows", "shifts", "heads")


def _windowed_info(model: Any, as_json: bool) -> int:
    """`vitviz info` of a windowed model: its stages (depth, heads, width, grid, windows), every block's attention
    ('windowed (7×7, shift 3)' / 'global (64×64)'), every setting with its kind and source, the assumptions."""
    from vitviz.core.options import cli_wording
    from vitviz.core.options import WINDOWED_HOW_TO_PASS
    from vitviz.core.winspec import NAMING

    spec = model.spec
    if as_json:
        data = spec.to_dict()
        data["labels"] = len(spec.labels)
        data["dropped_keys"] = model.dropped
        print(document("info", data))
        return 0
    prov = dict(spec.provenance)
    print(f"{spec.source}\n  family: {spec.family} ({spec.arch}, windowed attention: {spec.depth} blocks in "
          f"{spec.num_stages} stage{'s' if spec.num_stages > 1 else ''})")
    for st in spec.stages():
        print(f"  stage {st['stage']}        depth {st['depth']}, heads {st['heads']}, width {st['dim']}, grid "
              f"{st['grid'][0]}×{st['grid'][1]} ({st['stride']} px per token): {'; '.join(st['attention'])}")
    for line in spec.describe_blocks():
        print(f"    {line}")
    for name in _WINDOWED_ROWS:
        if not spec.relevant(name) or name not in prov:
            continue
        value = getattr(spec, name)
        if name in ("windows", "shifts", "heads"):
            value = "per block, above" if name != "heads" else value
        print(f"  {name:<18} {str(value):<22} {spec.kind_of(name):<8} ({prov[name]})")
    print(f"  identity           {prov.get('identity', '')}")
    pp = spec.preprocess
    print(f"  parameters         {spec.num_params:,}")
    print(f"  preprocess         {pp.mode}: resize {pp.resize}, crop {pp.crop}, {pp.interpolation}, mean {pp.mean}, "
          f"std {pp.std}  ({prov.get('preprocess', '')})")
    print(f"  labels             {len(spec.labels)}  ({prov.get('labels', 'none')})")
    if model.dropped:
        print(f"  ignored keys       {len(model.dropped)}: {', '.join(model.dropped[:5])}")
    for name, source in spec.assumptions:
        print(f"  !! {'GUESSED' if source.startswith('guess') else 'ASSUMED'} {name}: "
              + cli_wording(f"{source}; if that is wrong, pass {WINDOWED_HOW_TO_PASS.get(name, NAMING)}"))
    return 0
