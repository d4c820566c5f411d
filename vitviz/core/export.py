"""Turning maps into pictures and files: heatmaps, overlays, colorbars, atomic PNG and npz writes.

Files are written to a temporary file in the destination folder and moved into place with `os.replace` (or
`os.link` when overwriting is not allowed), so a crash never leaves a half-written file under the final name.
A temporary file's name carries the writer's process id; one left behind by a killed writer (SIGKILL, power
loss) is removed by `remove_stale_temps` on the next run.
"""
from __future__ import annotations

import json
import os
import re
import socket
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vitviz.core.colormaps import apply_colormap, colormap
from vitviz.core.spec import AttentionResult
from vitviz.errors import VitvizError


class OutputExistsError(VitvizError, FileExistsError):
    """The output file exists and overwriting was not asked for."""


def _check_rgb(rgb: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(rgb)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"{what} must be an (H, W, 3) uint8 array, found shape {arr.shape} dtype {arr.dtype}")
    return arr


def upsample(map2d: np.ndarray, size_hw: tuple[int, int], smooth: bool = True) -> np.ndarray:
    """Stretch a (gh, gw) patch-grid map to (H, W) pixels: bilinear (pixel-centre aligned) or nearest (blocky).

    Returns:
        (H, W) float32.
    """
    grid = np.asarray(map2d, dtype=np.float32)
    if grid.ndim != 2:
        raise ValueError(f"expected a 2-D (gh, gw) map, found shape {grid.shape}")
    h, w = int(size_hw[0]), int(size_hw[1])
    resample = Image.Resampling.BILINEAR if smooth else Image.Resampling.NEAREST
    image = Image.fromarray(grid).resize((w, h), resample=resample)  # float32 -> mode "F"; PIL takes (w, h)
    return np.asarray(image, dtype=np.float32)  # (H, W)


def heatmap_image(map2d: np.ndarray, size_hw: tuple[int, int], cmap: str = "viridis", smooth: bool = True,
                  vmin: float | None = None, vmax: float | None = None) -> np.ndarray:
    """A patch-grid map as a coloured picture of `size_hw` pixels.

    The values are interpolated before colouring (not the colours), and vmin/vmax default to the range of the
    grid map itself.

    Args:
        map2d: (gh, gw) values.

    Returns:
        (H, W, 3) uint8 RGB.
    """
    grid = np.asarray(map2d, dtype=np.float32)
    finite = grid[np.isfinite(grid)]
    if vmin is None:
        vmin = float(finite.min()) if finite.size else 0.0
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    return apply_colormap(upsample(grid, size_hw, smooth), cmap, vmin, vmax)


def overlay(image_rgb: np.ndarray, heat_rgb: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Blend a heatmap over an image: (1 - alpha) * image + alpha * heat, both (H, W, 3) uint8."""
    image = _check_rgb(image_rgb, "image_rgb")
    heat = _check_rgb(heat_rgb, "heat_rgb")
    if image.shape != heat.shape:
        raise ValueError(f"image {image.shape} and heatmap {heat.shape} must have the same shape")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], found {alpha}")
    blend = (1.0 - alpha) * image.astype(np.float32) + alpha * heat.astype(np.float32)
    return np.clip(np.rint(blend), 0, 255).astype(np.uint8)


def _label(value: float) -> str:
    return f"{value:.3g}"


def add_colorbar(img: np.ndarray, cmap: str, vmin: float, vmax: float, bar_width: int = 16,
                 pad: int = 6) -> np.ndarray:
    """Append a vertical colorbar (vmax at the top, vmin at the bottom) with tick labels to the right of `img`.

    Args:
        img: (H, W, 3) uint8.

    Returns:
        (H, W + extra, 3) uint8 on a white margin; the bar spans the image height.
    """
    image = _check_rgb(img, "img")
    h, w = image.shape[:2]
    font = ImageFont.load_default()
    labels = (_label(vmax), _label(vmin))
    text_w = max(int(np.ceil(font.getbbox(s)[2])) for s in labels)
    canvas = Image.new("RGB", (w + pad + bar_width + pad + text_w + pad, h), "white")
    canvas.paste(Image.fromarray(image), (0, 0))
    ramp = colormap(cmap)[np.linspace(255, 0, h).round().astype(np.int64)]  # (h, 3), top = vmax
    bar = np.repeat(ramp[:, None, :], bar_width, axis=1)  # (h, bar_width, 3)
    canvas.paste(Image.fromarray(np.ascontiguousarray(bar)), (w + pad, 0))
    draw = ImageDraw.Draw(canvas)
    x = w + pad + bar_width + pad
    draw.text((x, 0), labels[0], fill="black", font=font)
    draw.text((x, h - int(np.ceil(font.getbbox(labels[1])[3]))), labels[1], fill="black", font=font)
    return np.asarray(canvas, dtype=np.uint8)


_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)@(?P<host>[A-Za-z0-9_.-]*)-[a-z0-9_]{8}\.tmp$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]


def temp_prefix(target: Path) -> str:
    """Prefix of the temporary file `target` is written through: '.{name}.{pid}@{host}-' (mkstemp adds
    'xxxxxxxx.tmp'). The host tells writers on other machines (a shared folder) apart: their files are never
    taken for a dead local writer's."""
    return f".{target.name}.{os.getpid()}@{_host()}-"


def _process_alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # on Windows os.kill(pid, 0) would terminate the process
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


def remove_stale_temps(targets: Iterable[Path]) -> list[Path]:
    """Delete the temporary files that writers no longer running left for any of `targets`; return them.

    Only files named like this module's temporaries *for one of the given targets*, written on this host, are
    considered, and only when the process id in the name is gone, so a concurrent writer's file is left alone
    (a writer in another PID namespace with the same host name is the exception). On Windows nothing is removed.
    """
    wanted: dict[Path, set[str]] = defaultdict(set)
    for target in targets:
        wanted[Path(target).parent].add(Path(target).name)
    removed: list[Path] = []
    for folder, names in wanted.items():
        try:
            entries = [e for e in os.scandir(folder) if e.name.endswith(".tmp")]
        except OSError:  # no such folder yet: nothing was left there
            continue
        for entry in entries:
            m = _TEMP_NAME.match(entry.name)
            if m and m["name"] in names and m["host"] == _host() and not _process_alive(int(m["pid"])):
                try:
                    os.unlink(entry.path)
                except OSError:
                    continue
                removed.append(Path(entry.path))
    return removed


def _atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None], overwrite: bool) -> Path:
    """Write through `write` into a temporary file next to `path`, then move it into place."""
    target = Path(path)
    if not overwrite and target.exists():
        raise OutputExistsError(f"{target} exists; pass overwrite=True to replace it")
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp makes it private; an exported file should be readable like any other
        if overwrite:
            os.replace(tmp_name, target)
        else:
            _link_exclusive(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


def _link_exclusive(tmp_name: str, target: Path) -> None:
    """Move into place only if the target still does not exist (hard link when the filesystem allows)."""
    try:
        os.link(tmp_name, target)
    except FileExistsError as exc:
        raise OutputExistsError(f"{target} appeared while writing; pass overwrite=True to replace it") from exc
    except OSError:  # no hard links here (some network or FAT filesystems): checked above, replace
        os.replace(tmp_name, target)


def write_png_atomic(path: str | os.PathLike[str], rgb: np.ndarray, overwrite: bool = False) -> Path:
    """Write an (H, W, 3) uint8 image as PNG, atomically.

    Raises:
        OutputExistsError: `path` exists and `overwrite` is False.
    """
    image = Image.fromarray(_check_rgb(rgb, "rgb"))
    return _atomic_write(path, lambda handle: image.save(handle, format="PNG"), overwrite)


def write_npz_atomic(path: str | os.PathLike[str], result: AttentionResult, overwrite: bool = False) -> Path:
    """Write a result's arrays and spec to an uncompressed .npz, atomically.

    Keys: 'attentions' (L, H, T, T), 'logits' (C,), 'input' (C, H, W), 'image' (H, W, 3), 'spec' (the spec as
    JSON text), 'source', and 'features' when the result has them. Nothing is pickled.

    Raises:
        OutputExistsError: `path` exists and `overwrite` is False.
    """
    arrays: dict[str, np.ndarray] = {
        "attentions": np.asarray(result.attentions),
        "logits": np.asarray(result.logits),
        "input": np.asarray(result.input),
        "image": np.asarray(result.image),
        "spec": np.array(result.spec.to_json()),
        "source": np.array(result.source),
    }
    if result.features is not None:
        arrays["features"] = np.asarray(result.features)
    return _atomic_write(path, lambda handle: np.savez(handle, **arrays), overwrite)


def read_npz(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file written by `write_npz_atomic`: arrays by key, 'spec' parsed to a dict, 'source' as str."""
    with np.load(path, allow_pickle=False) as data:
        out: dict[str, Any] = {key: data[key] for key in data.files}
    if "spec" in out:
        out["spec"] = json.loads(str(out["spec"]))
    if "source" in out:
        out["source"] = str(out["source"])
    return out


def native_view(result: AttentionResult, image: Any = None) -> np.ndarray:
    """The part of the original image the model saw, at the original image's resolution: (h, w, 3) uint8.

    Args:
        result: a run whose `source_box` is known (runs from a path, PIL image or array).
        image: the original image (path / PIL / array); default: reload `result.source`.

    Falls back to the model-input image (`result.image`) for tensor inputs, where no original exists.
    """
    from vitviz.core.images import load_image, seen_region

    if result.source_box is None:
        return result.image
    img = load_image(image if image is not None else result.source, channels=3)
    return seen_region(img, result.spec.preprocess)
