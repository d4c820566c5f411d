"""Command line: `vitviz` (the window), `vitviz info CHECKPOINT`, `vitviz export ...`, `vitviz models`.

CHECKPOINT (and `--model`) is a path or a named model `torchvision:ARCH[:WEIGHTS]`, resolved everywhere by
`vitviz.catalog.resolve_model_arg`.

The window's module is imported only inside the function that opens it, and torch only by the commands that
load a model, so `vitviz --help` is instant.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Sequence

from vitviz.errors import VitvizError

SUBCOMMANDS = ("info", "export", "models")


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """The overrides of `vitviz.load`, shared by every command that loads a model."""
    g = parser.add_argument_group("model overrides (anything vitviz infers can be overridden)")
    g.add_argument("--heads", type=int, help="number of attention heads")
    g.add_argument("--family", help="checkpoint family (timm, deit, deit3, dino, dinov2, mae, torchvision, hf, seed)")
    g.add_argument("--image-size", type=_size, help="input size: N or HxW (position embedding is resampled)")
    g.add_argument("--eps", type=float, help="LayerNorm epsilon")
    g.add_argument("--mean", type=_floats, help="normalisation mean, e.g. 0.485,0.456,0.406")
    g.add_argument("--std", type=_floats, help="normalisation std")
    g.add_argument("--nest-key", help="which state dict of a training checkpoint (state_dict, state_dict_ema, teacher...)")


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("heads", "family", "image_size", "eps", "mean", "std", "nest_key")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def _size(text: str) -> tuple[int, int]:
    from vitviz.core.spec import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None


def build_info_parser(sub: Any) -> None:
    p = sub.add_parser("info", help="describe a checkpoint: family, every inferred field and its source")
    p.add_argument("checkpoint", help="a weights file, a model folder, or a named model torchvision:ARCH[:WEIGHTS] "
                   "(downloaded into the torch hub cache if it is not there yet)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--device", default="cpu", help="device to load on (default: cpu)")
    add_override_arguments(p)


def run_info(args: argparse.Namespace) -> int:
    import vitviz
    from vitviz.catalog_cli import resolve_cli_model

    checkpoint = resolve_cli_model(args.checkpoint)   # a named model: its cached (or downloaded) file
    model = vitviz.load(checkpoint, device=args.device, **overrides_from(args))
    spec = model.spec
    if args.json:
        data = spec.to_dict()
        data["labels"] = len(spec.labels)
        data["dropped_keys"] = model.dropped
        print(json.dumps(data, indent=2, default=list))
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
    for name, value in rows:
        src = prov.get(name.split(" ")[0] if name != "prefix tokens" else "", "")
        print(f"  {name:<14} {str(value):<24} {('(' + src + ')') if src else ''}")
    pp = spec.preprocess
    print(f"  parameters     {spec.num_params:,}")
    print(f"  preprocess     {pp.mode}: resize {pp.resize}, crop {pp.crop}, {pp.interpolation}, "
          f"mean {pp.mean}, std {pp.std}  ({prov.get('preprocess', '')})")
    print(f"  labels         {len(spec.labels)}  ({prov.get('labels', 'none')})")
    if model.dropped:
        print(f"  ignored keys   {len(model.dropped)}: {', '.join(model.dropped[:5])}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitviz", description="See what a Vision Transformer attends to.")
    sub = parser.add_subparsers(dest="command")
    build_info_parser(sub)
    from vitviz.batch import add_export_parser
    from vitviz.catalog_cli import add_models_parser

    add_export_parser(sub)
    add_models_parser(sub)
    return parser


def window_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitviz", description="See what a Vision Transformer attends to. "
                                     f"Subcommands: {', '.join(SUBCOMMANDS)} (vitviz info --help).")
    from vitviz.gui.args import add_window_arguments

    add_window_arguments(parser)
    return parser


_PICK_OPTIONS = ("--layers", "--which-heads")


def _attach_negative_picks(argv: list[str]) -> list[str]:
    """`--layers -1,0` -> `--layers=-1,0`: argparse takes '-1,0' for an option (only a bare '-1' passes as a value)."""
    out: list[str] = []
    for token in argv:
        if out and out[-1] in _PICK_OPTIONS and re.fullmatch(r"-\d+(,[^ ]*)+", token):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = _attach_negative_picks(list(sys.argv[1:] if argv is None else argv))
    try:
        if argv and argv[0] in SUBCOMMANDS:
            args = build_parser().parse_args(argv)
            if args.command == "info":
                return run_info(args)
            if args.command == "models":
                from vitviz.catalog_cli import run_models_command
                return run_models_command(args)
            from vitviz.batch import run_export_command
            return run_export_command(args)
        args = window_parser().parse_args(argv)
        from vitviz.gui.args import run_window
        return run_window(args)
    except VitvizError as e:
        print(f"vitviz: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vitviz info ... | head`
        sys.stderr.close()
        return 0
