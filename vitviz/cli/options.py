"""The argparse pieces every command that loads a model shares: the overrides of `vitviz.load` and their types,
and how guessed values are said (`vitviz: warning: ...` on stderr, once per value)."""
from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections import UserString
from typing import Any, Callable, TextIO, TypeVar

# the choice lists are vitviz.core.options' (stdlib only: parsing the command line imports no torch)
from vitviz.core.options import (
    ACTIVATIONS, BLOCK_NORMS, CROP_MODES, INTERPOLATIONS, ONE_VECTOR_POOLINGS, PATCH_ORDERS, POS_RECIPES,
    ROPE_PRESET_NAMES,
)

T = TypeVar("T")


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """The overrides of `vitviz.load`, shared by every command that loads a model."""
    g = parser.add_argument_group("model overrides (anything vitviz infers can be overridden)")
    g.add_argument("--heads", type=int, help="number of attention heads")
    g.add_argument("--family", help=LazyText(_family_help))
    g.add_argument("--image-size", type=_size, help="input size: N or HxW (position embedding is resampled)")
    g.add_argument("--eps", type=float, help="LayerNorm epsilon (every norm)")
    g.add_argument("--eps-final", type=float, metavar="EPS", help="epsilon of the final norms (norm, fc_norm) when "
                   "it differs from the blocks' (e.g. blocks 1e-6, final norm 1e-5)")
    g.add_argument("--mean", type=_floats, help="normalisation mean, e.g. 0.485,0.456,0.406 (1 or 3 values; "
                   "a 1-channel MNIST model: 0.1307)")
    g.add_argument("--std", type=_floats, help="normalisation std, e.g. 0.229,0.224,0.225 (MNIST: 0.3081)")
    g.add_argument("--resize", type=int, metavar="PX", help="resize the image's shorter side to PX before the crop "
                   "(--crop-mode center); the crop is the model's input size")
    g.add_argument("--crop-mode", choices=CROP_MODES, help="center: resize keeping the aspect ratio, then crop the "
                   "middle; squash: resize the whole image to the input size (no crop); squash_crop: squash to "
                   "--resize, then crop the middle")
    g.add_argument("--interpolation", choices=INTERPOLATIONS,
                   help="resampling filter for the resize")
    g.add_argument("--act", choices=ACTIVATIONS,
                   help="MLP activation (nn.TransformerEncoderLayer: relu unless built with activation='gelu')")
    g.add_argument("--block-norm", choices=BLOCK_NORMS, help="where each block's LayerNorms sit: pre (ViT: x + "
                   "f(norm(x))), post (norm(x + f(x)): nn.TransformerEncoderLayer with norm_first=False) or res_post "
                   "(x + norm(f(x)): Swin v2, timm *_rpn_*)")
    g.add_argument("--pooling", choices=ONE_VECTOR_POOLINGS, help="what the head sees: token 0 (the class "
                   "token, or the first patch without one), the mean of the patches, or of every token")
    g.add_argument("--attn-scale", type=float, metavar="S", help="factor on q·k (default head_dim**-0.5; e.g. "
                   "1 for none, or dim**-0.5 as the first vit-pytorch versions)")
    g.add_argument("--patch-order", choices=PATCH_ORDERS, help="pixel order of a Linear patch embedding: "
                   "einops '(p1 p2 c)' or unfold '(c p1 p2)'")
    g.add_argument("--pos-interp", choices=POS_RECIPES, help="how the position table is resampled at another "
                   "input size: timm (bicubic, antialias), deit / dino (bicubic, no antialias), torchvision, hf, ...")
    g.add_argument("--head-act", choices=ACTIVATIONS,
                   help="activation between the two Linears of a two-layer head")
    g.add_argument("--rope", choices=ROPE_PRESET_NAMES,
                   help="the rotary position embedding of a RoPE ViT no config names (DINOv3, EVA-02, Perception "
                        "Encoder, Naver RoPE-ViT, timm vit_*_rope_reg*_gap), or none")
    g.add_argument("--nest-key", help="which state dict of a training checkpoint (state_dict, state_dict_ema, teacher...)")
    g.add_argument("--verbose", action="store_true", help="also show the messages and progress bars of the "
                   "libraries vitviz uses (huggingface_hub) while a named model is fetched")
    g.add_argument("--window", type=_window, metavar="N", help="windowed models (Swin v2, SAM without relative "
                   "positions), whose files hold no window size: N, or one per stage (8,8,8,8)")
    g.add_argument("--global-blocks", type=_indices, metavar="I,J", help="SAM / ViTDet: the blocks with global "
                   "attention, when neither the file nor its config says (SAM ViT-B: 2,5,8,11)")
    add_code_argument(g)


class LazyText(UserString):
    """Text made when it is first read: argparse reads a help text only to show it, so a help built from modules
    that import torch (the family modules) costs nothing until `--help`."""

    def __init__(self, make: Callable[[], str] | str) -> None:   # noqa: D107 - UserString keeps no data of its own
        self._make = make

    @property
    def data(self) -> str:  # type: ignore[override]
        if callable(self._make):
            self._make = self._make()
        return self._make

    def __mod__(self, args: Any) -> str:  # argparse's '%(default)s' expansion: a str for its text wrapping
        return self.data % args


def _family_help() -> str:
    from vitviz.core.families import family_help

    return "checkpoint family, when the detected one is wrong: " + family_help()


CODE_HELP = ("run your own model class: FILE.py:FACTORY is a function or class in FILE.py that returns the model "
             "(called without arguments); the weights file is loaded into it (read with weights_only=True, never "
             "executed) and its attention is captured as its code computes it. This runs FILE.py's code: only "
             "with this flag")


def add_code_argument(parser: Any) -> None:
    """`--code FILE.py:FACTORY` (the live-module path; running the user's code is asked for explicitly) and what
    only that path takes: --grid, --num-prefix, --in-chans (when the module and its token count do not say)."""
    parser.add_argument("--code", metavar="FILE.py:FACTORY", help=CODE_HELP)
    parser.add_argument("--grid", type=_size, metavar="RxC", help="with --code: the patch grid (rows x columns) at "
                        "the input size, when the module has no patch embedding and its token count fits several")
    parser.add_argument("--num-prefix", type=int, metavar="N", help="with --code: how many tokens come before (or "
                        "after) the patches (class token, registers), when the token count leaves it open")
    parser.add_argument("--in-chans", type=int, metavar="C", help="with --code: the input channels (e.g. 1 for an "
                        "MNIST model), when neither its first layer nor its statistics say")


def override_names() -> tuple[str, ...]:
    """The `vitviz.load` keywords the command line sets: every option `add_override_arguments` adds but
    --verbose (the windowed models' --window / --global-blocks, and --code with what only it takes, included),
    read off the parser itself, so that a new option cannot be left out of `overrides_from`."""
    parser = argparse.ArgumentParser(add_help=False)
    add_override_arguments(parser)
    return tuple(a.dest for a in parser._actions if a.dest != "verbose")   # noqa: SLF001 - argparse's own list


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The overrides given on the command line (None: not given), as `vitviz.load` keywords."""
    install_guess_reporter()
    if getattr(args, "verbose", False):
        os.environ["VITVIZ_VERBOSE"] = "1"      # read by vitviz.catalog.hub (huggingface_hub's own messages)
    return {k: getattr(args, k) for k in override_names() if getattr(args, k, None) is not None}


def _size(text: str) -> tuple[int, int]:
    from vitviz.core.spec import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _window(text: str) -> int | tuple[int, ...]:
    """'8' -> 8; '8,8,16,8' -> one window per stage."""
    values = _indices(text)
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive window size, or one per stage (8,8,8,8)")
    return values[0] if len(values) == 1 else values


def _indices(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated whole numbers") from None


def with_remembered(checkpoint: Any, overrides: dict[str, Any], quiet: bool = False) -> dict[str, Any]:
    """`overrides` plus what the user told the window about this model file ("remember for this file": heads,
    norm order, activation, attention scale; `vitviz.catalog.answers`) for each one not given here, said on
    stderr -- one store of answers for the window and every command."""
    if checkpoint is None:
        return overrides
    from vitviz.catalog import answers

    remembered = {k: v for k, v in answers.answers_for(str(checkpoint)).items() if overrides.get(k) is None}
    if remembered and not quiet:
        flags = " / ".join(f"--{k.replace('_', '-')}" for k in remembered)
        print(f"vitviz: using what you told the window for {checkpoint}: {answers.describe(remembered)} "
              f"({flags} to change)", file=sys.stderr)
    return {**overrides, **remembered}


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None


def cli_wording(message: str) -> str:
    """A library message as the command line says it: 'pass heads=N (CLI --heads N)' -> 'pass --heads N'."""
    return re.sub(r"pass ([^;]*?) \(CLI ([^)]*)\)", r"pass \2", message)


def install_guess_reporter(stream: TextIO | None = None) -> None:
    """Show each of vitviz's own warnings -- a `GuessWarning` (a value nothing in the file gave, e.g. num_heads),
    or any warning raised from vitviz's code -- as one clean line on stderr, `vitviz: warning: ...`, with the
    command-line options instead of Python arguments, not Python's file:line format with a source line; other
    packages' warnings are shown as before."""
    from vitviz.core.spec import GuessWarning

    previous = warnings.showwarning
    if getattr(previous, "_vitviz_guesses", False):
        return
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        ours = issubclass(category, GuessWarning) or os.path.abspath(filename).startswith(package + os.sep)
        if ours:
            print(f"vitviz: warning: {cli_wording(str(message))}", file=stream or sys.stderr)
        else:
            previous(message, category, filename, lineno, file, line)

    show._vitviz_guesses = True  # type: ignore[attr-defined]
    warnings.showwarning = show
    warnings.filterwarnings("always", category=GuessWarning)  # every file's guesses, not only the first file's


def guess_lines(spec: Any) -> list[str]:
    """One line per guessed value of `spec` (num_heads first): what was assumed and the option that sets it."""
    from vitviz.core.hyperparams import describe_guess

    return [f"GUESSED {describe_guess(spec, name, cli=True)}"
            for name, _ in sorted(spec.guesses, key=lambda g: g[0] != "num_heads")]


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse `type=` from a parser that raises ValueError (SelectionError is one): its message becomes the
    usage error ('argument --maps: ...', exit 2) instead of argparse's generic 'invalid value'."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert
