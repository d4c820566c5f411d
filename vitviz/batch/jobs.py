"""The file side of `vitviz export`: finding inputs, one job per image with its outputs, unique stems, hashing,
the manifest's entries.

No torch here.
"""
from __future__ import annotations

import hashlib
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from vitviz.core.running.images import find_images
from vitviz.core.files import check_path
from vitviz.errors import VitvizError

MANIFEST = "manifest.json"


def is_uri(text: str) -> bool:
    """Whether an input or output names a pyarrow.fs URI ('s3://...', 'file:///...'; the Ray engine reads and
    writes them) rather than a local path."""
    return bool(re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text))


class InputError(VitvizError):
    """An input path given on the command line that does not exist, or inputs that hold no image."""


@dataclass
class Job:
    """One input image and the files it should produce.

    Attributes:
        index: position in the run (input order).
        path: the image file (the Ray engine: the URI of an image on a pyarrow.fs filesystem).
        outputs: every file to write (PNGs, then the .npz if asked), in the output folder.
    """

    index: int
    path: Path | str
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


def collect_inputs(inputs: list[str], out: Path | None, pattern: str | None) -> list[tuple[Path, Path]]:
    """Image files named on the command line or found in folders (recursively, optionally matching `pattern`).

    Returns:
        (image, output subfolder relative to `out`) pairs in order, without duplicates; files found in a folder
        keep their subfolder, so 'a/cat.jpg' and 'b/cat.jpg' do not collide. Files under `out` are left out,
        so an output folder inside an input folder is never read back (None: an output that is not a local
        folder, a URI).

    Raises:
        InputError: an input does not exist, or nothing was found.
    """
    found: list[tuple[Path, Path]] = []
    seen: set[Path] = set()
    out_real = out.resolve() if out is not None else None
    for text in inputs:
        path = Path(text)
        st = check_path(path, "an image file or a folder of images", missing=InputError, bad=InputError,
                        folder_ok=True)  # a FIFO or device is refused here, never opened
        if stat.S_ISDIR(st.st_mode):
            pairs = [(p, p.parent.relative_to(path)) for p in find_images(path, pattern=pattern)]
        else:
            pairs = [(path, Path("."))]
        for image, sub in pairs:
            real = image.resolve()
            if real in seen or (out_real is not None and out_real in real.parents):
                continue
            seen.add(real)
            found.append((image, sub))
    if not found:
        where = ", ".join(inputs)
        raise InputError(f"no images in {where}" + (f" matching {pattern!r}" if pattern else "")
                         + "; expected PNG, JPEG, BMP, GIF, TIFF, WebP or PPM/PGM files")
    return found


def inside(sub: Path | PurePosixPath) -> Path:
    """An output subfolder that stays inside the output folder whatever the input's name: '..', '.' and a root
    are dropped ('x/../../../outside/deep' -> 'x/outside/deep', '/abs/p' -> 'abs/p'), so `out / inside(sub)` is
    always under `out` (a glob or list line whose matches lie above its folder cannot write outside --out)."""
    if str(sub) == ".":   # the common case, kept cheap: a list of millions makes one per line
        return sub if isinstance(sub, Path) else Path(".")
    parts = [p for p in PurePosixPath(Path(sub).as_posix()).parts if p not in ("..", ".", "/")]
    return Path(*parts) if parts else Path(".")


def unique_stems(pairs: list[tuple[Path, Path]], stem_of: Callable[[Path], str]) -> list[str]:
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
