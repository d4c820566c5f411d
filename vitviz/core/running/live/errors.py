"""The live path's errors, and `user_call`: the one wrapper through which vitviz runs the user's code.

Low in the package (torch, vitviz.errors and one hint from runtime): the recorder, the describer, the model and
the user-code loader all raise these, so none of them imports another for its errors.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

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


def user_call(fn: Callable[[], Any], source: str, doing: str, on: str = "") -> Any:
    """`fn()`, which runs the user's code: whatever it raises -- `SystemExit`, `KeyboardInterrupt` and any other
    `BaseException` included -- comes back as a `UserCodeError` saying what was being done, its cause attached
    (running out of memory is a `DeviceError`; vitviz's own errors pass as they are)."""
    try:
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
