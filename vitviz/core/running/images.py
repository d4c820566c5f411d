"""Reading images and turning them into a model's input tensor.

Conventions:

- Transparency (RGBA, LA, PA, premultiplied modes, palette or greyscale with a `transparency` entry) is
  composited over an opaque background, white by default (`background=` picks another), because that is what
  image viewers show for cut-outs and logos. The model never sees the alpha channel.
- Decoding is strict: files larger than `MAX_PIXELS` pixels (200 MP, `max_pixels=` overrides) are refused
  before any pixel is decoded, and truncated files fail even if some other code has set Pillow's
  `ImageFile.LOAD_TRUNCATED_IMAGES`. Pillow's limit and that flag are module globals, so they are swapped in
  for the duration of one decode under a lock; two vitviz decodes never overlap.
- 16-bit greyscale ('I;16*', 'I') is scaled to 8 bits (v * 255 / 65535), not clipped; float images ('F' mode
  or float arrays) must lie in [0, 1].
- A greyscale source stays greyscale: it is replicated to RGB only for a 3-channel model.

torch is imported only inside the functions that build tensors, so the GUI thread can scan and load cheaply.
"""
from __future__ import annotations

import fnmatch
import io
import os
import re
import struct
import threading
import warnings
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np
from PIL import Image, ImageFile, ImageOps

from vitviz.core.spec import Preprocess
from vitviz.core.files import check_path
from vitviz.core.options import INTERPOLATIONS
from vitviz.errors import ImageError

if TYPE_CHECKING:
    import torch

ImageSource = Union[str, os.PathLike, bytes, bytearray, memoryview, io.IOBase, Image.Image, np.ndarray]

MAX_PIXELS = 200_000_000
WHITE = (255, 255, 255)
BLACK = (0, 0, 0)
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
PIL_FILTERS = {name: Image.Resampling[name.upper()] for name in INTERPOLATIONS}   # each resampling filter's

_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
_DECODE_ERRORS = (
    OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error, zlib.error,
    Image.DecompressionBombError, Image.DecompressionBombWarning,
)
_PIL_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------------- loading


def load_image(
    source: ImageSource,
    channels: int = 3,
    *,
    background: tuple[int, int, int] = WHITE,
    max_pixels: int = MAX_PIXELS,
) -> Image.Image:
    """Read an image from almost anything and return it upright, as 'RGB' (or 'L' for `channels=1`).

    Args:
        source: a path, bytes, a binary file object, a PIL image, or a NumPy array (H, W), (H, W, 1|2|3|4) of
            uint8, uint16 or float in [0, 1]. Animated images give their first frame.
        channels: 3 for an 'RGB' result, 1 for 'L'.
        background: RGB colour that transparent pixels are composited over.
        max_pixels: decompression-bomb limit for encoded inputs (width * height).

    Raises:
        ImageError: naming the input, what was found and what was expected.
    """
    _check_channels(channels)
    name = _describe(source)
    if isinstance(source, np.ndarray):
        img = _from_array(source, name)
    else:
        img = _decode(source, name, max_pixels)
    return _to_channels(_flatten(img, background, name), channels)


def _describe(source: Any) -> str:
    """A short human name for an input, used in error messages."""
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{len(source)} bytes>"
    if isinstance(source, np.ndarray):
        return f"<array {source.shape} {source.dtype}>"
    if isinstance(source, Image.Image):
        return getattr(source, "filename", "") or f"<PIL image {source.mode} {source.size}>"
    return str(getattr(source, "name", "") or f"<{type(source).__name__}>")


def _decode(source: Any, name: str, max_pixels: int) -> Image.Image:
    """Open, fully decode and EXIF-rotate one encoded image (or an unloaded PIL image)."""
    source = _openable(source, name)
    try:
        with _strict_pil(max_pixels), _opened(source) as img:
            _check_pixels(img.size, name, max_pixels)
            img.load()  # inside the try: truncated and corrupt data fail here, not later
            return ImageOps.exif_transpose(img)  # a new image, independent of the file
    except ImageError:
        raise
    except Image.UnidentifiedImageError as exc:
        expected = "expected a PNG, JPEG, BMP, GIF, TIFF, WebP or PPM/PGM image"
        raise ImageError(f"{name}: not a recognised image format; {expected}") from exc
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        found = re.search(r"\((\d+ pixels)\)", str(exc))
        raise _too_big(name, found.group(1) if found else str(exc), max_pixels) from exc
    except _DECODE_ERRORS as exc:
        raise ImageError(
            f"{name}: corrupt or truncated image data ({type(exc).__name__}: {exc}); expected a complete image"
        ) from exc


def check_image_path(path: str | os.PathLike[str]) -> None:
    """Refuse, before anything opens it, a path that is not a regular file: a missing file, a broken link or a
    link loop, a folder, and a FIFO, device or socket (reading one could block for good).

    Raises:
        ImageError: naming the path and what it is.
    """
    check_path(path, "an image file", missing=ImageError, bad=ImageError)


def _openable(source: Any, name: str) -> Any:
    """Check a path exists and is a file, wrap bytes in a stream, refuse anything Pillow cannot open."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        check_image_path(path)
        return path
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(source))
    if isinstance(source, Image.Image) or hasattr(source, "read"):
        return source
    raise ImageError(
        f"{name}: unsupported input type {type(source).__name__}; expected a path, bytes, a binary file, "
        "a PIL image or a NumPy array"
    )


@contextmanager
def _opened(source: Any) -> Iterator[Image.Image]:
    """A PIL image for `source`; one opened here is closed on exit (a caller's image or stream is not)."""
    if isinstance(source, Image.Image):
        yield source
        return
    img = Image.open(source)
    try:
        yield img
    finally:
        img.close()


@contextmanager
def _strict_pil(max_pixels: int) -> Iterator[None]:
    """Make Pillow refuse images over `max_pixels` (warning included) and truncated data, for one decode."""
    with _PIL_LOCK, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        saved = Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES
        Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = max_pixels, False
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = saved


def _check_pixels(size: tuple[int, int], name: str, max_pixels: int) -> None:
    """Refuse an image whose header declares more than `max_pixels` pixels (w, h), before decoding it."""
    if size[0] * size[1] > max_pixels:
        raise _too_big(name, f"{size[0]}x{size[1]} = {size[0] * size[1]} pixels", max_pixels)


def _too_big(name: str, found: str, max_pixels: int) -> ImageError:
    return ImageError(f"{name}: {found}; expected at most {max_pixels} pixels (decompression-bomb limit, max_pixels=)")


def _from_array(arr: np.ndarray, name: str) -> Image.Image:
    """(H, W) or (H, W, C) uint8/uint16/bool/float-in-[0, 1] array -> 'L', 'LA', 'RGB' or 'RGBA' image."""
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (2, 3, 4)):
        hint = " (channels first? expected channels last)" if arr.ndim == 3 and arr.shape[0] in (1, 3, 4) else ""
        raise ImageError(f"{name}: array of shape {arr.shape}{hint}; expected (H, W) or (H, W, 1|2|3|4)")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ImageError(f"{name}: empty array of shape {arr.shape}; expected at least 1x1 pixels")
    arr = _array_to_uint8(arr, name)
    return Image.fromarray(np.ascontiguousarray(arr))


def _array_to_uint8(arr: np.ndarray, name: str) -> np.ndarray:
    """Scale a uint8/uint16/bool/float array to uint8 (uint16 by 255/65535, float in [0, 1] by 255)."""
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if arr.dtype == np.uint16:
        return _sixteen_to_eight(arr)
    if np.issubdtype(arr.dtype, np.floating):
        return _float_to_eight(arr, name)
    raise ImageError(f"{name}: array dtype {arr.dtype}; expected uint8, uint16, bool or float in [0, 1]")


def _sixteen_to_eight(arr: np.ndarray) -> np.ndarray:
    """Values in [0, 65535] (clipped) -> uint8, rounding v * 255 / 65535."""
    wide = np.clip(arr.astype(np.int64), 0, 65535)
    return ((wide * 255 + 32767) // 65535).astype(np.uint8)


def _float_to_eight(arr: np.ndarray, name: str) -> np.ndarray:
    """Finite values in [0, 1] -> uint8, rounding v * 255."""
    if not np.all(np.isfinite(arr)):
        raise ImageError(f"{name}: float data with NaN or infinity; expected finite values in [0, 1]")
    lo, hi = float(arr.min()), float(arr.max())
    if lo < -1e-6 or hi > 1 + 1e-6:
        raise ImageError(f"{name}: float values in [{lo:g}, {hi:g}]; expected values in [0, 1]")
    return np.round(np.clip(arr.astype(np.float64), 0.0, 1.0) * 255.0).astype(np.uint8)


def _flatten(img: Image.Image, background: tuple[int, int, int], name: str) -> Image.Image:
    """Any PIL mode -> 'L' for greyscale sources, 'RGB' otherwise, with alpha composited over `background`."""
    try:
        if img.mode in _SIXTEEN_BIT_MODES:
            return Image.fromarray(_sixteen_to_eight(np.asarray(img)))
        if img.mode == "F":
            return Image.fromarray(_float_to_eight(np.asarray(img), name))
        if img.mode in _ALPHA_MODES or "transparency" in img.info:
            base = Image.new("RGBA", img.size, (*background, 255))
            flat = Image.alpha_composite(base, img.convert("RGBA")).convert("RGB")
            return flat.convert("L") if img.mode in ("LA", "La", "L") else flat
        if img.mode in ("L", "1"):
            return img.convert("L")
        return img.convert("RGB")
    except (ValueError, OSError) as exc:
        found = f"cannot convert mode {img.mode!r} ({exc})"
        raise ImageError(f"{name}: {found}; expected a mode Pillow converts to RGB") from exc


def _to_channels(img: Image.Image, channels: int) -> Image.Image:
    """'L' or 'RGB' image -> the mode a `channels`-channel model wants."""
    target = "L" if channels == 1 else "RGB"
    return img if img.mode == target else img.convert(target)


def _check_channels(channels: int) -> None:
    if channels not in (1, 3):
        raise ImageError(f"input channels {channels}; expected 1 (greyscale) or 3 (RGB)")


# ---------------------------------------------------------------------------------------------- preprocessing


def preprocess(img: Image.Image, pp: Preprocess, channels: int = 3) -> tuple["torch.Tensor", np.ndarray]:
    """Resize, crop and normalise an image the way the model was trained.

    Matches torchvision's `ImageClassification` preset exactly for its recipe (PIL resize, which always
    antialiases; the same size rounding and center-crop offsets; `/255` then `(x - mean) / std` in float32).

    Args:
        img: any PIL image; non-'RGB'/'L' modes are flattened as in `load_image` (alpha over white).
        pp: the recipe. For `channels=1`, a 3-value mean/std is averaged to one value; a 1-value mean/std is
            repeated for 3 channels.
        channels: the model's input channels, 1 or 3.

    Returns:
        (1, C, H, W) float32 input tensor with (H, W) = `pp.crop`, and the (H, W, 3) uint8 RGB image after
        resize and crop but before normalising (greyscale replicated to 3 channels).
    """
    import torch

    _check_channels(channels)
    mean, std = _channel_stats(pp.mean, channels, "mean"), _channel_stats(pp.std, channels, "std")
    img = _to_channels(_flatten(img, WHITE, _describe(img)), channels)
    img = _resize_and_crop(img, pp)
    arr = np.asarray(img, dtype=np.uint8).reshape(img.height, img.width, channels)  # (H, W, C)
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1).to(torch.float32).div(255)  # (H, W, C) -> (C, H, W)
    x = x.sub(torch.tensor(mean).view(-1, 1, 1)).div(torch.tensor(std).view(-1, 1, 1))
    display = np.repeat(arr, 3, axis=2) if channels == 1 else arr
    return x.unsqueeze(0), np.ascontiguousarray(display)  # (1, C, H, W), (H, W, 3)


def _resize_and_crop(img: Image.Image, pp: Preprocess) -> Image.Image:
    """Apply `pp.mode` ('center', 'squash' or 'squash_crop') to get an image of exactly `pp.crop` (h, w)."""
    if pp.interpolation not in INTERPOLATIONS:
        raise ImageError(f"interpolation {pp.interpolation!r}; expected one of {', '.join(INTERPOLATIONS)}")
    ch, cw = pp.crop
    if ch < 1 or cw < 1 or pp.resize < 1:
        raise ImageError(f"crop {pp.crop} and resize {pp.resize}; expected positive sizes")
    resample = PIL_FILTERS[pp.interpolation]
    if pp.mode == "squash":
        _check_resize_memory((ch, cw), (ch, cw), img)
        return img.resize((cw, ch), resample)
    if pp.mode not in ("center", "squash_crop"):
        raise ImageError(f"preprocess mode {pp.mode!r}; expected 'center', 'squash' or 'squash_crop'")
    if pp.mode == "squash_crop":  # HF DeiT: squash to the resize box, then center crop
        box = cover_size((ch, cw), pp.crop, pp.resize)
        new_h, new_w = box
    else:
        new_h, new_w = cover_size((img.height, img.width), pp.crop, pp.resize)
    _check_resize_memory((new_h, new_w), (ch, cw), img)
    img = img.resize((new_w, new_h), resample)
    top, left = int(round((new_h - ch) / 2.0)), int(round((new_w - cw) / 2.0))
    return img.crop((left, top, left + cw, top + ch))


def _check_resize_memory(resized: tuple[int, int], crop: tuple[int, int], img: Image.Image) -> None:
    """Refuse, before Pillow allocates it, a resize (and the float input tensor of its crop) that would not fit
    in the memory left: an `image_size` of 100000 must fail here, not in the out-of-memory killer."""
    from vitviz.core.running.runtime import check_image_memory

    pixels = resized[0] * resized[1]
    if pixels > MAX_PIXELS:   # the limit a decoded file has applies to what it is resized to as well
        raise ImageError(f"{_describe(img)}: resizing its {img.width}x{img.height} px to {resized[1]}x{resized[0]} "
                         f"px ({pixels / 1e6:,.0f} MP) is refused: more than the {MAX_PIXELS / 1e6:.0f} MP an image "
                         "may have; expected a smaller resize (resize= / --resize) or input size")
    needed = pixels * 4 + crop[0] * crop[1] * (4 * 3 + 4)  # Pillow keeps 4 bytes a pixel; (C, H, W) float32 + copy
    if pixels > 50_000_000 or needed > 1 << 30:  # reading the memory left costs a file read: only for large ones
        check_image_memory(needed, _describe(img), resized)


def source_box(size: tuple[int, int], pp: Preprocess) -> tuple[float, float, float, float]:
    """The region of the original image (h, w) = `size` that the model sees, as (left, top, right, bottom) pixels.

    It inverts `pp.mode`'s resize and center crop, so a map over the model input can be drawn over the original
    photo at its own resolution.
    """
    h, w = size
    ch, cw = pp.crop
    if pp.mode == "squash":
        return (0.0, 0.0, float(w), float(h))
    if pp.mode == "squash_crop":
        nh, nw = cover_size((ch, cw), pp.crop, pp.resize)
    else:
        nh, nw = cover_size((h, w), pp.crop, pp.resize)
    top, left = int(round((nh - ch) / 2.0)), int(round((nw - cw) / 2.0))
    sy, sx = h / nh, w / nw  # resized pixels -> original pixels
    return (left * sx, top * sy, (left + cw) * sx, (top + ch) * sy)


def seen_region(img: Image.Image, pp: Preprocess) -> np.ndarray:
    """The part of the original picture the model saw (its crop), at the original's resolution: (h, w, 3) uint8."""
    box = source_box((img.height, img.width), pp)
    # Round the size once, not each edge: edges rounded apart would make a square crop 263 x 262.
    width = min(img.width, max(1, int(round(box[2] - box[0]))))
    height = min(img.height, max(1, int(round(box[3] - box[1]))))
    left = min(max(0, int(round(box[0]))), img.width - width)
    top = min(max(0, int(round(box[1]))), img.height - height)
    right, bottom = left + width, top + height
    return np.ascontiguousarray(np.asarray(img.convert("RGB").crop((left, top, right, bottom)), dtype=np.uint8))


def cover_size(size: tuple[int, int], crop: tuple[int, int], resize: int) -> tuple[int, int]:
    """The (h, w) to resize an image of `size` (h, w) to before center-cropping `crop` (h, w).

    The target box is `crop * resize / min(crop)` (for a square crop: `resize` x `resize`); the image keeps its
    aspect ratio and is scaled so that it just covers the box. For a square crop this is torchvision's
    "shorter side to `resize`" rule, including its truncating `int(resize * long / short)`.
    """
    h, w = size
    ch, cw = crop
    th = max(ch, int(round(ch * resize / min(ch, cw))))
    tw = max(cw, int(round(cw * resize / min(ch, cw))))
    if th * w >= tw * h:  # the height is the binding side: th / h >= tw / w
        return th, max(tw, int(th * w / h))
    return max(th, int(tw * h / w)), tw


def _channel_stats(values: Sequence[float], channels: int, what: str) -> list[float]:
    """Mean or std for `channels` channels: 3 values average to 1, 1 value repeats to 3."""
    vals = [float(v) for v in values]
    if len(vals) == 3 and channels == 1:
        vals = [sum(vals) / 3.0]
    elif len(vals) == 1 and channels == 3:
        vals = vals * 3
    if len(vals) != channels:
        raise ImageError(f"preprocess {what} has {len(vals)} values; expected {channels} (or 1 or 3)")
    if what == "std" and any(v <= 0 for v in vals):
        raise ImageError(f"preprocess std {tuple(vals)}; expected positive values")
    return vals


def display_from_tensor(x: "torch.Tensor", mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """Undo normalisation of a model input for display.

    Args:
        x: (1, C, H, W) or (C, H, W) normalised input with C = 1 or 3.
        mean: per-channel mean used to normalise (same averaging/repeating rules as `preprocess`).
        std: per-channel std used to normalise.

    Returns:
        (H, W, 3) uint8 RGB, values clipped to [0, 255]; a 1-channel input is replicated to 3 channels.
    """
    import torch

    if x.dim() == 4 and x.shape[0] == 1:
        x = x[0]
    if x.dim() != 3 or x.shape[0] not in (1, 3):
        raise ImageError(f"input tensor of shape {tuple(x.shape)}; expected (1, C, H, W) with C = 1 or 3")
    c = int(x.shape[0])
    m = torch.tensor(_channel_stats(mean, c, "mean")).view(-1, 1, 1)
    s = torch.tensor(_channel_stats(std, c, "std")).view(-1, 1, 1)
    img = (x.detach().to("cpu", torch.float32) * s + m).clamp(0, 1).mul(255).round().to(torch.uint8)
    arr = img.permute(1, 2, 0).numpy()  # (C, H, W) -> (H, W, C)
    return np.ascontiguousarray(np.repeat(arr, 3, axis=2) if c == 1 else arr)


# ---------------------------------------------------------------------------------------------- folder scanning


def is_image_file(path: str | os.PathLike) -> bool:
    """Whether `path` has an image extension vitviz reads (case-insensitive); the file is not opened."""
    name = os.path.basename(os.fspath(path).rstrip("/" + os.sep))   # Path(path).suffix without making a Path
    dot = name.rfind(".")
    return 0 < dot < len(name) - 1 and name[dot:].lower() in IMAGE_EXTENSIONS


def find_images(folder: str | os.PathLike, recursive: bool = True, pattern: str | None = None) -> list[Path]:
    """Image files under `folder`, in natural order ('img2' before 'img10').

    Hidden files and folders (names starting with '.', e.g. macOS '._x.jpg' resource forks) are skipped and
    symlinked folders are not followed.

    Args:
        folder: the folder to scan.
        recursive: also scan subfolders.
        pattern: optional case-insensitive glob on the file name, e.g. '*.png' or 'cat*'.

    Raises:
        ImageError: if `folder` does not exist or is not a folder.
    """
    root = Path(folder)
    if not root.is_dir():
        found = "not found" if not root.exists() else "is not a folder"
        raise ImageError(f"{root}: {found}; expected a folder of images")
    found_files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")] if recursive else []
        for fname in filenames:
            if fname.startswith(".") or not is_image_file(fname):
                continue
            if pattern is None or fnmatch.fnmatchcase(fname.lower(), pattern.lower()):
                found_files.append(Path(dirpath) / fname)
    return sorted(found_files, key=lambda p: _natural_key(p.relative_to(root)))


def _natural_key(rel: Path) -> tuple:
    """Sort key comparing digit runs as numbers, per path component, case-insensitively."""
    parts = tuple(
        tuple(int(t) if i % 2 else t.lower() for i, t in enumerate(re.split(r"(\d+)", part))) for part in rel.parts
    )
    return parts, rel.as_posix()
