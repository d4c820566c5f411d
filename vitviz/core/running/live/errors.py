"""The live path's errors, and `user_call`: the one wrapper through which vitviz runs the user's code.

Low in the package (torch, vitviz.errors and one hint from runtime): the recorder, the describer, the model and
the user-code loader all raise these, so none of them imports another for its errors.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from vitviz.core.running.runtime import SMALLER
from vitviz.errors import DeviceError, VitvizError


class LiveModelError(VitvizError):
    """A model object the live path cannot run or describe (its forward fails, its grid cannot be found...)."""


class NoAttentionError(LiveModelError):
    """A forward pass in which no self-attention over the image tokens was seen (or attention that could not be
    told apart by layer). Beside the message: `seen`, what was seen; `step`, what would make the live path see it
    ('' when nothing in the user's hands would); `file_step`, the advice to open the weights file by itself -- so
    that a caller that knows whether the file route reads it (`load_code`) says only the steps that work."""

    def __init__(self, message: str, seen: str = "", step: str = "", file_step: str = "") -> None:
        super().__init__(message)
        self.seen, self.step, self.file_step = seen or message, step, file_step

    @classmethod
    def said(cls, seen: str, step: str, file_step: str) -> "NoAttentionError":
        """The error whose message is what was seen, then 'Next:' and the steps."""
        return cls(f"{seen} Next: {'; or '.join(s for s in (step, file_step) if s)}", seen, step, file_step)


class UserCodeError(LiveModelError):
    """The user's code misbehaved: `code=FILE.py:FACTORY` could not be imported, the factory not found or called,
    the weights file does not fit the model it returned, or the model's own code raised -- anything, SystemExit
    and KeyboardInterrupt included -- while vitviz ran it (`user_call`)."""


class LiveWarning(UserWarning):
    """What the live path shows differs from what the module's code computes, or leaves some of it out: the
    message names the modules (the same words are in the provenance's 'path')."""


class _StopForward(BaseException):
    """Raised inside the user's forward once the last wanted layer is captured (`logits=False`). A BaseException,
    so that a model's own `except Exception` does not swallow it."""


@contextlib.contextmanager
def state_kept() -> Iterator[None]:
    """Put back, after the user's code ran, the process-wide state it may change and vitviz depends on.

    torch: the default dtype (float64 made every later comparison differ) and device ('meta' broke every later
    load), grad mode, the random generator, thread count, deterministic algorithms, anomaly mode, float32 matmul
    precision, the cuDNN / TF32 / attention-kernel switches. Python: the warning filters (silenced, vitviz's
    warnings about its assumptions would be too), the working folder (relative paths), the recursion limit,
    NumPy's error handling, sys.stdout / sys.stderr, the Ctrl-C and SIGTERM handlers (main thread), and the
    environment variables vitviz reads (VITVIZ_*, HF_*, XDG_*, TORCH_HOME)."""
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    switches: list[tuple[Callable[[], Any], Callable[[Any], Any]]] = [
        (torch.get_default_dtype, torch.set_default_dtype),
        (torch.get_default_device, lambda d: torch.set_default_device(None if d.type == "cpu" else d)),
        (torch.is_grad_enabled, torch.set_grad_enabled),
        (torch.get_num_threads, torch.set_num_threads),
        (lambda: (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()),
         lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        (lambda: (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32, cuda.matmul.allow_tf32),
         lambda v: (setattr(cudnn, "enabled", v[0]), setattr(cudnn, "benchmark", v[1]),
                    setattr(cudnn, "deterministic", v[2]), setattr(cudnn, "allow_tf32", v[3]),
                    setattr(cuda.matmul, "allow_tf32", v[4]))),
        (lambda: (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled()),
         lambda v: (cuda.enable_flash_sdp(v[0]), cuda.enable_mem_efficient_sdp(v[1]), cuda.enable_math_sdp(v[2]))),
        (lambda: list(warnings.filters), _set_warning_filters),
        (_cwd, os.chdir),
        (sys.getrecursionlimit, sys.setrecursionlimit),
        (np.geterr, lambda v: np.seterr(**v)),
        (lambda: (sys.stdout, sys.stderr), lambda v: (setattr(sys, "stdout", v[0]), setattr(sys, "stderr", v[1]))),
        (_read_env, _write_env),
    ]
    if threading.current_thread() is threading.main_thread():
        switches.append((lambda: (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)),
                         lambda v: (signal.signal(signal.SIGINT, v[0]), signal.signal(signal.SIGTERM, v[1]))))
    before = [get() for get, _ in switches]
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        for (get, put), value in zip(switches, before):
            if value is not None and get() != value:
                put(value)
        torch.set_rng_state(rng)


def _set_warning_filters(filters: list[Any]) -> None:
    warnings.filters[:] = filters
    warnings._filters_mutated()  # type: ignore[attr-defined]  # what warnings.catch_warnings calls on restoring


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:      # the folder was removed under us: nothing to go back to
        return None


_ENV_READ = ("VITVIZ_", "HF_", "HUGGINGFACE_", "XDG_", "TORCH_HOME")


def _read_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(_ENV_READ)}


def _write_env(saved: dict[str, str]) -> None:
    for key in set(_read_env()) - set(saved):
        del os.environ[key]
    os.environ.update(saved)


def user_call(fn: Callable[[], Any], source: str, doing: str, on: str = "") -> Any:
    """`fn()`, which runs the user's code: whatever it raises -- `SystemExit`, `KeyboardInterrupt` and any other
    `BaseException` included -- comes back as a `UserCodeError` saying what was being done, its cause attached
    (running out of memory is a `DeviceError`; vitviz's own errors pass as they are). The torch state it changes is
    put back (`state_kept`)."""
    try:
        with state_kept():
            return fn()
    except (_StopForward, VitvizError):
        raise
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        raise DeviceError(f"{source}: out of memory while {doing} ({e}); try a smaller image size or "
                          "device='cpu'") from e
    except MemoryError as e:
        raise DeviceError(f"{source}: not enough memory while {doing} ({e or 'MemoryError'}); {SMALLER}") from e
    except BaseException as e:  # noqa: BLE001 - the user's code: every exception it raises is said, none escapes
        raise UserCodeError(f"{source}: {doing} failed{' on ' + on if on else ''} ({_exception_text(e)})") from e


# What a live refusal says to do when it says nothing else: how the live path takes a module.
LIVE_ROUTE = ("Next: vitviz runs a module live by calling it on a (1, C, H, W) image batch; pass the module that "
              "takes one (a transformers model's vision tower, e.g. model.vision_tower or model.vision_model) to "
              "vitviz.load(module), or name a factory that wraps it to take one with --code FILE.py:FACTORY; "
              "image_size=N (--image-size N) probes another size")
_ROUTE_SAID = re.compile(r"vitviz\.load\(|--code|code=|Next:|--[a-z][a-z-]+|\b[a-z_]+=\S")


def with_route(error: VitvizError) -> VitvizError:
    """`error` with `LIVE_ROUTE` added (an error of the same type, its cause kept) when it names no route."""
    text = str(error)
    if _ROUTE_SAID.search(text):
        return error
    try:
        routed = type(error)(f"{text.rstrip('.')}. {LIVE_ROUTE}")
    except TypeError:   # an error type built otherwise: said as it is
        return error
    routed.__cause__ = error.__cause__
    return routed


def _exception_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if isinstance(e, SystemExit):
        return text + " -- the code called sys.exit() (argparse's parse_args() or exit() run on import?)"
    if isinstance(e, KeyboardInterrupt):
        return text + " -- raised by the code or a Ctrl+C while it ran"
    return text


def _forward_error(e: UserCodeError) -> bool:
    """Whether `e` is the user's forward refusing its input (a shape that does not fit: RuntimeError, ValueError,
    TypeError, IndexError, AssertionError, einops' errors), so that a probe at another size or channel count may be
    tried; SystemExit, KeyboardInterrupt, an interruption and the like never are."""
    return isinstance(e.__cause__, (RuntimeError, ValueError, TypeError, IndexError, AssertionError)) \
        and not isinstance(e.__cause__, (VitvizError, NotImplementedError, RecursionError))
