"""Command-line options of the window, for `vitviz.cli` (no Qt or torch imported here).

    parser = argparse.ArgumentParser(prog="vitviz")
    add_window_arguments(parser)
    args = parser.parse_args()
    sys.exit(run_window(args))
"""
from __future__ import annotations

import argparse
import os
import sys

from vitviz.cli.options import MODEL_HELP, add_override_arguments, argument_type, checked_argument, overrides_from
from vitviz.core.spec import parse_size
from vitviz.gui.state import MAP_CHOICES, parse_head_arg, parse_layer_arg, parse_map_arg



def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `[IMAGES...] --model --device --layer --head --map --size --screenshot` and the model overrides."""
    parser.add_argument("images", nargs="*", metavar="IMAGES",
                        help="image files or folders to open (a checkpoint here is loaded as the model)")
    parser.add_argument("--model", metavar="CHECKPOINT", help=MODEL_HELP)
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda",
                        help="where the model runs (default: auto = CUDA when available). A device that is not "
                             "available here is reported (with --screenshot: exit 2) and the model runs on the CPU")
    parser.add_argument("--layer", type=argument_type(parse_layer_arg), default=None, metavar="L|mean",
                        help="layer to show, 0-based; negative counts from the end (default: the last)")
    parser.add_argument("--head", type=argument_type(parse_head_arg), default=None, metavar="H|mean|max",
                        help="head to show, 0-based, or mean/max over heads (default: mean)")
    parser.add_argument("--map", type=checked_argument(parse_map_arg), default=None, metavar="MAP",
                        help="which map to show (the same names and meanings as `vitviz export --maps`): "
                             + "; ".join(f"{name} = {what}" for name, what in MAP_CHOICES.items())
                             + ". --head picks the head (or the mean/max over heads) of any of these but rollout "
                             "(default: cls)")
    parser.add_argument("--size", type=argument_type(parse_size), default=None, metavar="N|HxW",
                        help="run the model at another input size (position embedding interpolated); rounded "
                             "down to whole patches, with a note saying so")
    parser.add_argument("--screenshot", metavar="FILE",
                        help="do all of the above, wait until idle, save the window as PNG and exit. Exit "
                             "status 0 when FILE is saved; after an error nothing is saved and the status is 2 "
                             "when the model could not be loaded or --device is not available (as for info and "
                             "export), else 1 (an image "
                             "that cannot be read, --layer/--head/--map out of range, FILE not writable)")
    add_override_arguments(parser)  # --heads, --block-norm, --act, ... and --code (the window asks before running it)


def window_overrides(args: argparse.Namespace) -> dict:
    """The model overrides given on the window's command line (--heads, --block-norm, --act, ...), as for info and
    export; --code is passed on its own (the window asks before running it)."""
    return {k: v for k, v in overrides_from(args).items() if k != "code"}


def quiet_idle_threads() -> bool:
    """Let torch's idle CPU threads sleep instead of spinning (`OMP_WAIT_POLICY=PASSIVE`, unless the user set a
    policy), before torch is imported (libgomp reads it once, when loaded); False when torch already was.

    After each parallel region of a forward, OpenMP's threads spin for a while waiting for the next: on a machine
    with few cores they take the core the window's thread needs to draw the answer. `bench/omp_wait.py` on this
    2-core machine (torch's default 2 threads, the demo model, 3 alternating rounds): an ablate click's p95 34.0 ms
    with libgomp's default wait, 13.9 ms passive; the process's CPU per click 24.7 -> 11.4 ms. The price: a small
    model's forward waits for its threads to wake (ViT-Ti/16 1.32x the time); a ViT-B/16's is unchanged (1.01x;
    0.92-1.35x in three runs against a spinning wait)."""
    if "torch" in sys.modules:
        return False
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return True


def run_window(args: argparse.Namespace) -> int:
    """Open the window with the parsed arguments; returns the exit status."""
    quiet_idle_threads()          # first: before the window imports torch
    from vitviz.gui.app import run_app

    args.overrides = window_overrides(args)
    return run_app(args)
