"""Command line: `vitviz` (the window), `vitviz info CHECKPOINT`, `vitviz export ...`, `vitviz models`,
`vitviz verify MODEL`.

CHECKPOINT (and `--model`) is a path or a named model `torchvision:ARCH[:WEIGHTS]`, resolved everywhere by
`vitviz.catalog.named.resolve_model_arg`.

The window's module is imported only inside the function that opens it, and torch only by the commands that
load a model, so `vitviz --help` is instant.
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import Sequence

from vitviz.errors import VitvizError

SUBCOMMANDS = ("info", "export", "models", "verify")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitviz", description="See what a Vision Transformer attends to.")
    sub = parser.add_subparsers(dest="command")
    from vitviz.cli.info import build_info_parser

    build_info_parser(sub)
    from vitviz.cli.export import add_export_parser
    from vitviz.cli.models import add_models_parser
    from vitviz.cli.verify import add_verify_parser

    add_export_parser(sub)
    add_models_parser(sub)
    add_verify_parser(sub)
    return parser


def window_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitviz", description="See what a Vision Transformer attends to: the "
                                     "window's options. Commands: " f"{', '.join(SUBCOMMANDS)} (vitviz --help: "
                                     "each with an example; vitviz COMMAND --help: its options).")
    from vitviz import __version__
    from vitviz.cli.window import add_window_arguments

    parser.add_argument("--version", action="version", version=f"vitviz {__version__}")
    parser.add_argument("--info", action="store_true", help="print versions, devices and the files vitviz uses "
                        "(for bug reports), then exit")
    parser.add_argument("--help-all", action="help", help="this list of every option of the window")
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
    """Run one command; returns its exit status. Called as the process's own entry (`argv` None: the command line),
    it ends the process itself when threads started by a model's own code (`--code`) or an inference thread that
    was given up on are still running: Python would wait for them at exit, forever if they never end."""
    status = _main(argv)
    if argv is None:
        _leave_if_threads_remain(status)
        _leave_after_the_window(status)
    return status


def _leave_if_threads_remain(status: int) -> None:
    """Exit now, output flushed, when a thread that is not ours would keep the process alive after the command."""
    import threading

    stray = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    client = sys.modules.get("vitviz.gui.client")
    abandoned = client is not None and client.parking.abandoned_running()
    if stray or abandoned:
        _exit_now(status, run_atexit=False)


def _leave_after_the_window(status: int) -> None:
    """Once the window has closed (settings synced, the worker's thread finished), end the process without the
    interpreter's teardown: freeing every object of torch, Qt and the model took 1.8-3.4 s of Ctrl+Q's 2-4 s
    (bench/quit.py). The atexit handlers still run (parked threads, temporary folders, Ray's shutdown)."""
    app = sys.modules.get("vitviz.gui.app")
    if app is not None and app.QUICK_EXIT and app.window_closed:
        _exit_now(status, run_atexit=True)


def _exit_now(status: int, run_atexit: bool) -> None:
    import atexit
    import os

    if run_atexit:
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _main(argv: Sequence[str] | None = None) -> int:
    argv = _attach_negative_picks(list(sys.argv[1:] if argv is None else argv))
    try:
        if argv and argv[0] in ("-h", "--help"):
            from vitviz.cli.about import top_help

            print(top_help())
            return 0
        if argv and argv[0] == "--help-all":
            window_parser().print_help()
            return 0
        if "--info" in argv and not (argv and argv[0] in SUBCOMMANDS):
            from vitviz.cli.about import info_lines

            print("\n".join(info_lines()))
            return 0
        if argv and argv[0] in SUBCOMMANDS:
            args = build_parser().parse_args(argv)
            if args.command == "info":
                from vitviz.cli.info import run_info
                return run_info(args)
            if args.command == "models":
                from vitviz.cli.models import run_models_command
                return run_models_command(args)
            if args.command == "verify":
                from vitviz.cli.verify import run_verify
                return run_verify(args)
            from vitviz.cli.export import run_export_command
            return run_export_command(args)
        args = window_parser().parse_args(argv)
        from vitviz.cli.window import run_window
        return run_window(args)
    except VitvizError as e:
        print(f"vitviz: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `vitviz info ... | head`
        sys.stderr.close()
        return 0
