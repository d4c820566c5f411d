"""Application entry point: QApplication, the main window, command-line arguments and `--screenshot`.

Nothing imported here imports torch; the worker thread imports it on its first request, after the window is up.
"""
from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSettings, QTimer, qInstallMessageHandler
from PySide6.QtWidgets import QApplication

from vitviz.core.analyses.mapkinds import KINDS
from vitviz.core.analyses.maps import MapKind
from vitviz.gui import bundled
from vitviz.gui.dropping import classify
from vitviz.gui.session import DEVICE_FAILED, LOAD_FAILED
from vitviz.gui.settings import open_settings
from vitviz.gui.state import parse_map_arg
from vitviz.gui.window import DEFAULT_SIZE, MainWindow

IDLE_TICKS = 3          # consecutive idle polls before the screenshot is taken
POLL_MS = 50
EXIT_2_TITLES = (LOAD_FAILED, DEVICE_FAILED)   # as `vitviz info` / `vitviz export` exit for these
NO_DISPLAY_STATUS = 2
FREEZE_AT_EXIT = True   # see `_freeze_at_exit`; bench/gui.py turns it off to measure what it saves
QUICK_EXIT = True       # `vitviz` ends without the interpreter's teardown once the window closed (vitviz.cli.main);
                        # bench/quit.py turns it off to measure what it saves
window_closed = False   # run_app's window has closed (its settings synced, its worker stopped)


def ensure_app() -> QApplication:
    """The running QApplication, created if needed.

    No application display name is set: X11 and Windows append it to every window title ("vitviz — demo —
    vitviz"); the window's own title already starts with "vitviz".
    """
    app = QApplication.instance()
    if app is None:
        app = QApplication(sys.argv[:1])
        app.setApplicationName("vitviz")
        app.setOrganizationName("vitviz")
    return app


def display_problem(environ: dict[str, str] | None = None, platform: str = sys.platform) -> str:
    """Why the window cannot open here ('' when it can, as far as can be told without Qt).

    Qt aborts the process (SIGABRT, a core dump and a page of plugin advice) when its platform plugin finds no
    display, so the window checks first: on Linux and the BSDs, the xcb plugin needs DISPLAY and the wayland
    plugin WAYLAND_DISPLAY (a local X display's socket must exist). Other platforms, and plugins that need no
    display (offscreen, minimal, vnc, ...), are not checked.
    """
    env = os.environ if environ is None else environ
    if not platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        return ""
    plugin = env.get("QT_QPA_PLATFORM", "").split(":")[0].strip().lower()
    candidates = [p.strip() for p in plugin.split(";") if p.strip()] or ["xcb", "wayland"]
    if not {"xcb", "wayland"} & set(candidates) or set(candidates) - {"xcb", "wayland"}:
        return ""                       # offscreen, eglfs, vnc, ... or a fallback list with one of those
    if "wayland" in candidates and env.get("WAYLAND_DISPLAY"):
        return ""
    display = env.get("DISPLAY", "")
    if "xcb" in candidates and display:
        return _x_display_problem(display)
    wanted = " or ".join(name for name, plug in (("DISPLAY", "xcb"), ("WAYLAND_DISPLAY", "wayland"))
                         if plug in candidates)
    return f"no display: {wanted} is not set"


def _x_display_problem(display: str) -> str:
    """'' unless `display` names a local X display (':N') whose socket does not exist."""
    host, _sep, rest = display.rpartition(":")
    number = rest.split(".")[0]
    if host not in ("", "unix") or not number.isdigit():
        return ""                       # remote or unusual displays: let Qt try
    path = f"/tmp/.X11-unix/X{number}"
    if Path(path).exists() or _abstract_socket_listens(path):
        return ""
    return f"no X server on DISPLAY={display} (nothing listens on {path})"


def _abstract_socket_listens(path: str) -> bool:
    """Whether an X server listens on Linux's abstract socket of that name (servers in containers may have no
    socket file)."""
    import socket

    if not sys.platform.startswith("linux"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect("\0" + path)
        return True
    except OSError:
        return False


def no_display_message(problem: str) -> str:
    """What `vitviz` prints instead of opening the window when there is no display."""
    return (f"vitviz: cannot open the window: {problem}.\n"
            "  On a machine without a screen use `vitviz info CHECKPOINT` and `vitviz export`, run the window under "
            "a virtual display (xvfb-run -a vitviz ...), or set QT_QPA_PLATFORM=offscreen with --screenshot FILE.\n")


def _freeze_at_exit() -> None:
    """Make the process end promptly after the window closes.

    Once the window has closed, saved its settings and stopped the worker, what remains is the interpreter's own
    shutdown, whose final garbage collection walks every object torch, torchvision and the model left behind:
    1-2 s for a ViT-B (most of Ctrl+Q's 2-4 s). `gc.freeze()` at exit moves them out of the collector's way;
    nothing of vitviz's is left to finalise by then (files are written atomically, settings synced, the worker
    thread finished). Registered once; it runs before the atexit handlers registered earlier."""
    if FREEZE_AT_EXIT and not getattr(_freeze_at_exit, "registered", False):
        _freeze_at_exit.registered = True   # type: ignore[attr-defined]
        atexit.register(gc.freeze)


def apply_args(window: MainWindow, args: argparse.Namespace) -> None:
    """Do what the command line asks: view selection first, then the model load and the images. Without a model
    (no --model, no --code and no checkpoint among the paths), the bundled demo model -- on its own images when no
    images were named; a model without images gets the bundled sample photos. `--code FILE.py:FACTORY` builds the
    model with that file's code once the user agrees (with --model as its weights)."""
    values: dict[str, Any] = {}
    if getattr(args, "map", None):
        values.update(parse_map_arg(args.map))
    if getattr(args, "layer", None) is not None:
        values["layer"] = args.layer
    head = getattr(args, "head", None)
    if head is not None:
        values["head"] = head
    window.requested_view = {k: values[k] for k in ("layer", "head", "query") if k in values}
    if getattr(args, "map", None):
        window.requested_view["map"] = args.map
    window.state.update(**values)
    ignored = head_ignored_note(args.map, head) if getattr(args, "map", None) else ""
    if ignored:
        window.note(ignored)
    device = getattr(args, "device", None)
    window.session.model.device_preference = None if device in (None, "", "auto") else str(device)
    # the model overrides of the command line (--heads, --block-norm, --act, ...), parsed by vitviz.cli.window
    overrides = dict(getattr(args, "overrides", None) or ({"heads": args.heads} if getattr(args, "heads", None)
                                                           else {}))
    model = getattr(args, "model", None)
    code = getattr(args, "code", None)
    if code:
        window.load_code(code, model, **overrides)    # asks before running the file's code (--screenshot: the flag)
        model = model or code
    elif model:
        window.load_model(model, **overrides)
    if getattr(args, "size", None):
        window.session.set_image_size_after_load(tuple(args.size))
    paths = [str(p) for p in getattr(args, "images", None) or []]
    named = classify(paths)
    if paths:
        window.open_classified(named, strict=True)
    model = named.models[-1] if named.models else model
    if model and not named.images:
        window.add_bundled_images_after_load()   # the sample photos (the demo's shapes) once the model has loaded
    elif not model and not paths:
        window.load_demo()                               # first run: something real to look at at once
    elif not model:
        window.load_demo(images=False, instead_of_model=True)   # images without a model: run them on the demo


def head_ignored_note(name: str, head: Any) -> str:
    """The note for a --head the `--map NAME` does not use ('' when it does; the table of map kinds says which
    have heads): rollout fuses the heads itself; a class's relevance, gradient rollout and a text prompt's map
    have none."""
    kind = MapKind.parse(name)
    if kind.per_head or head is None:
        return ""
    if kind.source == "attention" or kind.kind == "poolrollout":
        return (f"--head {head} is ignored: the rollout map fuses the heads (by mean unless the Rollout panel's head "
                "fusion says otherwise); --head applies to the cls, mean, max and token:N maps")
    return (f"--head {head} is ignored: the {KINDS[kind.kind].title} is one map of the whole model, without heads; "
            "--head applies to the cls, mean, max, token:N, attngrad and pool maps")


class Screenshot(QObject):
    """Waits until the window is idle, saves it as PNG and ends the event loop with 0; after errors nothing is
    saved and the status is 2 when the model could not be loaded or the requested device is not available (as
    `vitviz info` and `vitviz export`), else 1.
    Notes (such as an input size rounded to whole patches) go to stderr and leave the status at 0."""

    def __init__(self, window: MainWindow, path: Path) -> None:
        super().__init__(window)
        self.window, self.path = window, path
        self.status: int | None = None
        self._idle = 0
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self._poll)
        self._timer.start()

    def _poll(self) -> None:
        self._idle = self._idle + 1 if self.window.is_idle() else 0
        if self._idle < IDLE_TICKS:
            return
        self._timer.stop()
        for text in self.window.notes:
            sys.stderr.write(f"vitviz: note: {text}\n")
        errors = self.window.reporter.errors
        if errors:
            for title, summary in errors:
                sys.stderr.write(f"vitviz: {title}: {summary}\n")
            self.status = 2 if any(title in EXIT_2_TITLES for title, _ in errors) else 1
        elif not self.window.grab().save(str(self.path)):
            sys.stderr.write(f"vitviz: could not write {self.path}\n")
            self.status = 1
        else:
            self.status = 0
        QApplication.instance().exit(self.status)


PLATFORM_NOTES = ("does not support propagateSizeHints",)   # the offscreen plugin's, printed once per window


def quiet_platform_notes() -> Any:
    """Drop the platform plugin's notes that say nothing to the user (`--screenshot` runs offscreen, whose plugin
    prints 'This plugin does not support propagateSizeHints()'); every other Qt message goes where it went.
    Returns the handler it replaced (give it back to `qInstallMessageHandler` when done)."""
    previous = None

    def handler(mode: Any, context: Any, message: str) -> None:
        if any(note in message for note in PLATFORM_NOTES):
            return
        if previous is not None:
            previous(mode, context, message)
        else:
            sys.stderr.write(message + "\n")

    previous = qInstallMessageHandler(handler)
    return previous


def run_app(args: argparse.Namespace, settings: QSettings | None = None) -> int:
    """Show the window for parsed `vitviz` arguments and run the event loop; returns the exit status.

    With `--screenshot FILE` the user's settings are neither read nor written (a throw-away ini file is used
    unless VITVIZ_SETTINGS names one), so screenshots look the same everywhere; nothing is asked (a guessed head
    count is used and said on stderr; `--code` on the command line is taken as the agreement to run that code).
    """
    global window_closed
    if QApplication.instance() is None:
        problem = display_problem()
        if problem:
            sys.stderr.write(no_display_message(problem))
            return NO_DISPLAY_STATUS
    app = ensure_app()
    _freeze_at_exit()
    shot = getattr(args, "screenshot", None)
    scratch = None
    if settings is None and shot:
        scratch = None if os.environ.get("VITVIZ_SETTINGS") else tempfile.TemporaryDirectory()
        settings = QSettings(str(Path(scratch.name) / "vitviz.ini"), QSettings.Format.IniFormat) if scratch \
            else open_settings()
    window = MainWindow(settings if settings is not None else open_settings())
    previous_handler = quiet_platform_notes() if shot else None
    if shot:
        window.use_size(DEFAULT_SIZE)
        window.session.model.ask_assumptions = False    # nobody to ask: what the file does not say is assumed and said
        window.trust_code = True            # nobody to ask: --code on the command line is the user's choice
    previous_hook = sys.excepthook
    sys.excepthook = lambda kind, exc, tb: _report_unexpected(window, kind, exc, tb)
    try:
        window.persist_settings = not shot
        window.demo_fallback = not shot     # a bad --model leaves no empty window (--screenshot: exit 2 instead)
        window.show()
        app.processEvents()      # the window is on screen before anything imports torch
        apply_args(window, args)
        if shot:
            Screenshot(window, Path(shot))
        status = app.exec()
    finally:
        window.close()           # stops the worker thread, also after an error: one left running aborts the exit
        window_closed = True
        sys.excepthook = previous_hook
        if shot:
            qInstallMessageHandler(previous_handler)
        if scratch is not None:
            scratch.cleanup()
    return int(status)


def _report_unexpected(window: MainWindow, kind: type, exc: BaseException, tb: Any) -> None:
    """A bug escaped a slot: show it like any other error instead of losing it on stderr."""
    import traceback

    details = "".join(traceback.format_exception(kind, exc, tb))
    sys.stderr.write(details)
    window.reporter.show("Unexpected error", f"{kind.__name__}: {exc}", details)
