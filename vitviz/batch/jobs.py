"""The file side of `vitviz export`: finding inputs, naming outputs, hashing, the manifest, the progress line.

No torch here.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from vitviz.core.images import find_images
from vitviz.errors import VitvizError

MANIFEST = "manifest.json"


class InputError(VitvizError):
    """An input path given on the command line that does not exist, or inputs that hold no image."""


@dataclass
class Job:
    """One input image and the files it should produce.

    Attributes:
        index: position in the run (input order).
        path: the image file.
        outputs: every file to write (PNGs, then the .npz if asked), in the output folder.
    """

    index: int
    path: Path
    outputs: list[Path]
    status: str = "pending"          # 'done' | 'skipped' | 'failed' | 'pending'
    sha256: str = ""
    error: str = ""
    written: list[Path] = field(default_factory=list)

    def _present(self) -> list[Path]:
        """The outputs this image has: all of them once done or skipped, else only those written before it failed
        or the run stopped."""
        return self.outputs if self.status in ("done", "skipped") else self.written

    def record(self, out: Path) -> dict[str, Any]:
        """This image's manifest entry; output paths relative to the output folder."""
        entry: dict[str, Any] = {"path": str(self.path), "sha256": self.sha256, "status": self.status,
                                 "outputs": [str(p.relative_to(out)) for p in self._present()]}
        if self.error:
            entry["error"] = self.error
        return entry


def collect_inputs(inputs: list[str], out: Path, pattern: str | None) -> list[tuple[Path, Path]]:
    """Image files named on the command line or found in folders (recursively, optionally matching `pattern`).

    Returns:
        (image, output subfolder relative to `out`) pairs in order, without duplicates; files found in a folder
        keep their subfolder, so 'a/cat.jpg' and 'b/cat.jpg' do not collide. Files under `out` are left out,
        so an output folder inside an input folder is never read back.

    Raises:
        InputError: an input does not exist, or nothing was found.
    """
    found: list[tuple[Path, Path]] = []
    seen: set[Path] = set()
    out_real = out.resolve()
    for text in inputs:
        path = Path(text)
        if path.is_dir():
            pairs = [(p, p.parent.relative_to(path)) for p in find_images(path, pattern=pattern)]
        elif path.is_file():
            pairs = [(path, Path("."))]
        else:
            raise InputError(f"{path}: not found; expected an image file or a folder of images")
        for image, sub in pairs:
            real = image.resolve()
            if real in seen or out_real in real.parents:
                continue
            seen.add(real)
            found.append((image, sub))
    if not found:
        where = ", ".join(inputs)
        raise InputError(f"no images in {where}" + (f" matching {pattern!r}" if pattern else "")
                         + "; expected PNG, JPEG, BMP, GIF, TIFF, WebP or PPM/PGM files")
    return found


def unique_stems(pairs: list[tuple[Path, Path]], stem_of: Any) -> list[str]:
    """A stem per image, unique within its output subfolder: 'cat', then 'cat_png' / 'cat_2' on a clash."""
    stems: list[str] = []
    taken: set[tuple[Path, str]] = set()
    counts: dict[tuple[Path, str], int] = {}
    for path, sub in pairs:
        base = stem_of(path)
        counts[(sub, base)] = counts.get((sub, base), 0) + 1
    for path, sub in pairs:
        stem = base = stem_of(path)
        if counts[(sub, base)] > 1 and path.suffix:
            stem = f"{base}_{path.suffix.lstrip('.').lower()}"
        n = 2
        while (sub, stem) in taken:
            stem, n = f"{base}_{n}", n + 1
        taken.add((sub, stem))
        stems.append(stem)
    return stems


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_json_atomic(path: Path, data: dict[str, Any]) -> Path:
    """Write JSON to a temporary file next to `path`, then move it into place (replacing any old file)."""
    from vitviz.core.files import temp_prefix

    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, default=list)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


class Progress:
    """A one-line progress bar on a terminal; silent when `stream` is not a TTY or `enabled` is False."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.total, self.count = total, 0
        self.enabled = enabled and bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._last = 0.0

    def advance(self, n: int = 1) -> None:
        """Count `n` more images finished (done, skipped or failed) and redraw at most 10 times a second."""
        self.count += n
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.count >= self.total):
            self._last = now
            self._draw(now - self.start)

    def _draw(self, elapsed: float) -> None:
        frac = self.count / max(1, self.total)
        bar = "#" * int(30 * frac)
        rate = self.count / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.count) / rate if rate > 0 else 0.0
        self.stream.write(f"\r[{bar:<30}] {self.count}/{self.total}  {rate:.1f} img/s  ETA {eta:.0f} s ")
        self.stream.flush()

    def message(self, text: str) -> None:
        """Print a line (an error) without breaking the bar."""
        if self.enabled:
            self.stream.write("\r" + " " * 79 + "\r")
        print(text, file=sys.stderr, flush=True)
        if self.enabled:
            self._draw(time.perf_counter() - self.start)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
