"""The argparse pieces every command that loads a model shares: the overrides of `vitviz.load` and their types,
and how guessed values are said (`vitviz: warning: ...` on stderr, once per value)."""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections import UserString
from typing import Any, Callable, TextIO, TypeVar

# the overrides are vitviz.core.options' records (stdlib only: parsing the command line imports no torch)
from vitviz.core.options import LIVE, OPTIONS, Option, cli_wording, overrides_for

T = TypeVar("T")

# What a model argument may be, in every command's help: the names `vitviz.load` takes too.
MODEL_HELP = ("a weights file, a model folder, or a model name: hf:ORG/NAME[@REVISION] (Hugging Face Hub, e.g. "
              "hf:facebook/dinov2-small), timm:NAME[.TAG] (timm's weights on the hub, e.g. "
              "timm:vit_small_patch16_224.augreg_in21k) or torchvision:ARCH[:WEIGHTS] (e.g. torchvision:vit_b_16); "
              "a name is downloaded into its cache unless it is there (HF_HUB_OFFLINE=1: the cache only)")


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """The overrides of `vitviz.load`, shared by every command that loads a model: one argument per `Option` with a
    flag, its type, choices, metavar and help from the record (and --verbose)."""
    g = parser.add_argument_group("model overrides (anything vitviz infers can be overridden)")
    for option in OPTIONS:
        if option.cli_flag:
            g.add_argument(option.cli_flag, dest=option.name, **_argument(option))
        if option.name == "nest_key":
            add_verbosity_arguments(g, quiet=not _has_option(parser, "--quiet"))


def _has_option(parser: argparse.ArgumentParser, flag: str) -> bool:
    return flag in parser._option_string_actions   # noqa: SLF001 -- argparse has no public lookup


def add_verbosity_arguments(parser: Any, quiet: bool = True) -> None:
    """`-v/--verbose` (the libraries' own messages too) and, unless the command has its own, `-q/--quiet` (no
    progress, no notes; errors and warnings still said): the same two flags on every command."""
    parser.add_argument("-v", "--verbose", action="store_true", help="also show the messages and progress bars of "
                        "the libraries vitviz uses (huggingface_hub) while a named model is fetched")
    if quiet:
        parser.add_argument("-q", "--quiet", action="store_true", help="no download progress and no notes on "
                            "stderr; errors and warnings are still said")


def _argument(option: Option) -> dict[str, Any]:
    """argparse's keywords for one option."""
    if option.value == "choice":
        return dict(choices=option.offered, help=option.help)
    parse: Callable[[str], Any] = _CLI_TYPES[option.value]
    help_text: Any = LazyText(lambda: f"{option.help}: {_family_help()}") if option.value == "family" else option.help
    return dict(type=parse, metavar=option.metavar or None, help=help_text)


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
    from vitviz.core.reading.families import family_help

    return family_help()


def override_names() -> tuple[str, ...]:
    """The `vitviz.load` keywords the command line sets: every `Option` with a flag (the windowed models' --window /
    --global-blocks, and --code with what only it takes, included)."""
    return tuple(o.name for o in OPTIONS if o.cli_flag)


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


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers") from None


# How the command line reads each kind of value (`Option.value`; vitviz.core.reading.validate checks it again at load).
_CLI_TYPES: dict[str, Callable[[str], Any]] = {
    "heads": int, "family": str, "size": _size, "number": float, "stats": _floats, "positive_stats": _floats,
    "text": str, "resize": int, "count": int, "channels": int, "window": _window, "blocks": _indices,
}


def with_remembered(checkpoint: Any, overrides: dict[str, Any], quiet: bool = False) -> dict[str, Any]:
    """`overrides` plus what the user told the window about this model file ("remember for this file": heads,
    norm order, activation, attention scale; `vitviz.catalog.answers`) for each one not given here, said on
    stderr -- one store of answers for the window and every command. Their names go to `vitviz.load` as
    `_remembered`, so that their provenance says 'remembered' (in info, the manifest), not a plain override."""
    if checkpoint is None:
        return overrides
    from vitviz.catalog import answers

    remembered = {k: v for k, v in answers.answers_for(str(checkpoint)).items() if overrides.get(k) is None}
    if overrides.get("code"):     # its own code runs: what was told about the reference ViT's blocks does not apply
        remembered = {k: v for k, v in remembered.items() if k in overrides_for(LIVE)}
    if remembered and not quiet:
        flags = " / ".join(f"--{k.replace('_', '-')}" for k in remembered)
        print(f"vitviz: using what you told the window for {checkpoint}: {answers.describe(remembered)} "
              f"({flags} to change, vitviz info {checkpoint} --forget to forget)", file=sys.stderr)
    return {**overrides, **remembered, "_remembered": frozenset(remembered)} if remembered else overrides


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
    from vitviz.core.reading.hyperparams import describe_guess

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


def checked_argument(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse `type=` that keeps the text as given once `check` (raising ValueError) accepts it: a map kind or
    colormap name stays the name, refused with `check`'s message as `argument_type` does."""
    def keep(text: str) -> str:
        check(text)
        return text
    return argument_type(keep)
