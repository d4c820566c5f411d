"""The argparse pieces every command that loads a model shares: the overrides of `vitviz.load` and their types."""
from __future__ import annotations

import argparse
from typing import Any


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
    add_code_argument(g)


CODE_HELP = ("run your own model class: FILE.py:FACTORY is a function or class in FILE.py that returns the model "
             "(called without arguments); the weights file is loaded into it (read with weights_only=True, never "
             "executed) and its attention is captured as its code computes it. This runs FILE.py's code: only "
             "with this flag")


def add_code_argument(parser: Any) -> None:
    """`--code FILE.py:FACTORY` (the live-module path; running the user's code is asked for explicitly)."""
    parser.add_argument("--code", metavar="FILE.py:FACTORY", help=CODE_HELP)


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("heads", "family", "image_size", "eps", "mean", "std", "nest_key")
    keys += ("code",)  # --code FILE.py:FACTORY: vitviz.load(..., code=) runs that file's code (asked for)
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
