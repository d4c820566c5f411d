"""Maps into pictures: upsampling, heatmaps, overlays, colorbars, the part of the original image the model saw, and
`draw_map`, the one renderer of an exported map (with a colorbar, small images are drawn enlarged: `enlarge`).

Pure NumPy + Pillow; the window, the overview and `vitviz export` all draw through here, so a PNG the window exports
is byte for byte the PNG `vitviz export` writes for the same choices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vitviz.core.drawing.colormaps import apply_colormap, colormap
from vitviz.core.analyses.maps import HeadSel, LayerSel, MapStack, SelectionError
from vitviz.core.files import check_rgb as _check_rgb
from vitviz.core.spec import AttentionResult


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


def bar_labels(lo: float, hi: float) -> tuple[str, str]:
    """The labels of a colorbar's two ends in one format: plain decimals with the same number of places for
    everyday magnitudes ('0.00012' and '0.00454', never '1.2e-05' beside '0.00454'), else one exponent for both
    ('4.54e-5', '0.12e-5'); zero is '0'. Three significant digits at the larger end."""
    big = max(abs(lo), abs(hi))
    if not np.isfinite(big) or big == 0:
        return _zero(hi, f"{hi:.3g}"), _zero(lo, f"{lo:.3g}")
    exp = int(np.floor(np.log10(big)))
    if 1e-3 <= big < 1e4:
        places = max(0, 2 - exp)
        return _zero(hi, f"{hi:.{places}f}"), _zero(lo, f"{lo:.{places}f}")
    return _zero(hi, f"{hi / 10.0 ** exp:.2f}e{exp}"), _zero(lo, f"{lo / 10.0 ** exp:.2f}e{exp}")


def _zero(value: float, text: str) -> str:
    return "0" if value == 0 else text


LABEL_BREAK = " · "         # where a colorbar's label may go onto another line


def _space(font: Any) -> float:
    """The room between two words of a label: Pillow's default font has 2-px spaces, which made 'CLS attention'
    read 'CLSattention'."""
    return max(float(font.getlength(" ")), 0.35 * float(getattr(font, "size", 10)))


def _words_width(text: str, font: Any) -> int:
    words = text.split(" ")
    return int(np.ceil(sum(font.getlength(w) for w in words) + _space(font) * (len(words) - 1)))


def _draw_words(draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, font: Any) -> None:
    """`text` in black from `xy`, its words `_space` apart."""
    x, y = xy
    for word in text.split(" "):
        draw.text((x, y), word, fill="black", font=font)
        x += font.getlength(word) + _space(font)


def _label_lines(text: str, font: Any, height: int) -> list[str]:
    """`text` in lines of at most `height` pixels, broken between its phrases (' · '); a phrase longer than that
    alone is cut with '…'."""
    def width(line: str) -> int:
        return _words_width(line, font)

    lines: list[str] = []
    for phrase in text.split(LABEL_BREAK):
        joined = f"{lines[-1]}{LABEL_BREAK}{phrase}" if lines else phrase
        if lines and width(joined) <= height:
            lines[-1] = joined
            continue
        while phrase and width(phrase) > height:
            phrase = phrase[:-2] + "…" if len(phrase) > 2 else ""
        lines.append(phrase)
    return lines


def _vertical_text(text: str, font: Any, height: int) -> Image.Image:
    """`text` in black on white, turned to read bottom to top, in as many lines (side by side, the first on the
    left) as it needs to fit `height` pixels (`_label_lines`)."""
    lines = _label_lines(text, font, height) or [""]
    line_h = int(np.ceil(font.getbbox("Ag")[3])) + 2
    strip = Image.new("RGB", (max(1, max(_words_width(line, font) for line in lines)), line_h * len(lines)), "white")
    draw = ImageDraw.Draw(strip)
    for i, line in enumerate(lines):
        _draw_words(draw, (0, i * line_h), line, font)
    return strip.rotate(90, expand=True)


def add_colorbar(img: np.ndarray, cmap: str, vmin: float, vmax: float, bar_width: int = 16,
                 pad: int = 6, label: str = "") -> np.ndarray:
    """Append a vertical colorbar (vmax at the top, vmin at the bottom) with its two end labels (`bar_labels`) to
    the right of `img`, and `label` (what the values are, e.g. 'CLS attention · scale shared by all layers') beside
    it, reading bottom to top, on more lines when it is longer than the picture is high.

    Args:
        img: (H, W, 3) uint8.

    Returns:
        (H, W + extra, 3) uint8 on a white margin; the bar spans the image height.
    """
    image = _check_rgb(img, "img")
    h, w = image.shape[:2]
    font = ImageFont.load_default()
    labels = bar_labels(vmin, vmax)
    text_w = max(int(np.ceil(font.getbbox(s)[2])) for s in labels)
    strip = _vertical_text(label, font, h) if label else None
    extra = strip.width + pad if strip is not None else 0
    canvas = Image.new("RGB", (w + pad + bar_width + pad + text_w + pad + extra, h), "white")
    canvas.paste(Image.fromarray(image), (0, 0))
    ramp = colormap(cmap)[np.linspace(255, 0, h).round().astype(np.int64)]  # (h, 3), top = vmax
    bar = np.repeat(ramp[:, None, :], bar_width, axis=1)  # (h, bar_width, 3)
    canvas.paste(Image.fromarray(np.ascontiguousarray(bar)), (w + pad, 0))
    draw = ImageDraw.Draw(canvas)
    x = w + pad + bar_width + pad
    draw.text((x, 0), labels[0], fill="black", font=font)
    draw.text((x, h - int(np.ceil(font.getbbox(labels[1])[3]))), labels[1], fill="black", font=font)
    if strip is not None:
        canvas.paste(strip, (x + text_w + pad, (h - strip.height) // 2))
    return np.asarray(canvas, dtype=np.uint8)


MIN_PICTURE_PX = 200    # a picture with a colorbar is at least this high and wide: smaller images are drawn enlarged


def enlargement(size_hw: tuple[int, int]) -> int:
    """The whole factor a picture over an image of `size_hw` pixels is drawn at: 1, or for an image whose shorter
    side is under `MIN_PICTURE_PX` (the demo's 64 px, CIFAR's 32) the smallest that brings it there."""
    short = min(int(size_hw[0]), int(size_hw[1]))
    return 1 if short >= MIN_PICTURE_PX or short <= 0 else -(-MIN_PICTURE_PX // short)


def enlarge(image: np.ndarray) -> np.ndarray:
    """`image` (H, W, 3) with every pixel drawn as a k × k block (`enlargement`); unchanged when k is 1."""
    k = enlargement(image.shape[:2])
    return image if k == 1 else np.repeat(np.repeat(image, k, axis=0), k, axis=1)


def native_view(result: AttentionResult, image: Any = None) -> np.ndarray:
    """The part of the original image the model saw, at the original image's resolution: (h, w, 3) uint8.

    Args:
        result: a run whose `source_box` is known (runs from a path, PIL image or array).
        image: the original image (path / PIL / array); default: reload `result.source`.

    Falls back to the model-input image (`result.image`) for tensor inputs, where no original exists.
    """
    from vitviz.core.running.images import load_image, seen_region

    if result.source_box is None:
        return result.image
    img = load_image(image if image is not None else result.source, channels=3)
    return seen_region(img, result.spec.preprocess)


PCA_LEGEND = (((255, 0, 0), "PC1"), ((0, 255, 0), "PC2"), ((0, 0, 255), "PC3"), ((0, 0, 0), "background"))


def add_legend(img: np.ndarray, entries: tuple[tuple[tuple[int, int, int], str], ...] = PCA_LEGEND,
               pad: int = 6, swatch: int = 10) -> np.ndarray:
    """Append a legend to the right of `img`: a colour swatch and its text per line, from the top.

    Args:
        img: (H, W, 3) uint8.
        entries: (RGB, text) per line.

    Returns:
        (H, W + extra, 3) uint8 on a white margin.
    """
    image = _check_rgb(img, "img")
    h, w = image.shape[:2]
    font = ImageFont.load_default()
    text_w = max(int(np.ceil(font.getbbox(text)[2])) for _c, text in entries)
    line = max(swatch, max(int(np.ceil(font.getbbox(text)[3])) for _c, text in entries)) + 4
    canvas = Image.new("RGB", (w + pad + swatch + 4 + text_w + pad, max(h, line * len(entries))), "white")
    canvas.paste(Image.fromarray(image), (0, 0))
    draw = ImageDraw.Draw(canvas)
    for i, (color, text) in enumerate(entries):
        y = i * line
        draw.rectangle((w + pad, y, w + pad + swatch - 1, y + swatch - 1), fill=tuple(color), outline=(128, 128, 128))
        draw.text((w + pad + swatch + 4, y), text, fill="black", font=font)
    return np.asarray(canvas, dtype=np.uint8)


def color_pixels(colors: np.ndarray, size_hw: tuple[int, int], input_hw: tuple[int, int], patch: int,
                 smooth: bool = True) -> np.ndarray:
    """A (gh, gw, 3) colour map in [0, 1] (feature PCA) stretched over `size_hw` pixels: each channel upsampled
    like a heatmap's values, padded with black (background) to cover an input that is not a whole number of
    patches (`cover`). Returns (H, W, 3) uint8."""
    grid = np.asarray(colors, dtype=np.float32)
    if grid.ndim != 3 or grid.shape[2] != 3:
        raise ValueError(f"expected a (gh, gw, 3) colour map, found shape {grid.shape}")
    gh, gw = grid.shape[:2]
    ph, pw = max(gh, -(-int(input_hw[0]) // patch)), max(gw, -(-int(input_hw[1]) // patch))
    padded = np.zeros((ph, pw, 3), dtype=np.float32)
    padded[:gh, :gw] = grid
    up = np.stack([upsample(padded[..., c], size_hw, smooth) for c in range(3)], axis=-1)  # (H, W, 3)
    return np.clip(np.rint(up * 255.0), 0, 255).astype(np.uint8)


def draw_colors(colors: np.ndarray, image: np.ndarray, input_hw: tuple[int, int], patch: int,
                opts: RenderOptions) -> np.ndarray:
    """A colour map (feature PCA, (gh, gw, 3) in [0, 1]) drawn over (or, style 'heatmap', instead of) `image`,
    with the PCA legend when `opts.colorbar` (the colours have no scale to show); the cmap and scale options do
    not apply.

    Returns:
        (H, W, 3) uint8; with the legend (k·H, k·W + legend, 3), k = `enlargement((H, W))` as for `draw_map`.
    """
    image = enlarge(_check_rgb(image, "image")) if opts.colorbar else image    # room for the legend, as draw_map
    rgb = color_pixels(colors, image.shape[:2], input_hw, patch, opts.smooth)
    if opts.style != "heatmap":
        rgb = overlay(image, rgb, float(opts.opacity))
    return add_legend(rgb) if opts.colorbar else rgb


LARGE_PICTURE_PIXELS = 16_000_000   # a picture drawn over more than this is announced before an export


@dataclass(frozen=True)
class RenderOptions:
    """How a map becomes a picture (the defaults are the window's: viridis, opacity 0.6, smooth, shared scale).

    Attributes:
        style: 'overlay' (the heatmap blended over the image) or 'heatmap' (the bare heatmap).
        cmap: a name of `vitviz.core.drawing.colormaps.available_colormaps()`, optionally with '_r'.
        opacity: the heatmap's weight in the overlay, 0..1.
        smooth: bilinear upsampling instead of one flat colour per patch.
        scale: 'shared' (0..the maximum over all layers of the map's kind of column) or 'own' (its own min..max).
        colorbar: append a colour bar with the range.
        size: what the map is drawn over: 'original' (the region of the original image the model saw, at the
            original's resolution) or 'input' (the model's input image).
        colorbar_label: name the colorbar with what the map is and which scale it uses (`colorbar_label`); off
            by default, which keeps earlier pictures byte for byte.
    """

    style: str = "overlay"
    cmap: str = "viridis"
    opacity: float = 0.6
    smooth: bool = True
    scale: str = "shared"
    colorbar: bool = False
    size: str = "original"
    colorbar_label: bool = False


def scale_label(stack: MapStack, head: HeadSel, scale: str) -> str:
    """Which colour scale a map of `stack` is drawn on: 'own scale: this map' or 'shared scale: all layers' (of
    the same kind of column: single heads, head means or head maxima)."""
    if scale == "own":
        return "own scale: this map"
    group = {"mean": " (head means)", "max": " (head maxima)"}.get(str(head), " (single heads)")
    return "shared scale: all layers" + (group if stack.num_heads > 1 else "")


def colorbar_label(stack: MapStack, head: HeadSel, scale: str, layer: LayerSel | None = None) -> str:
    """What a colorbar shows, e.g. 'CLS attention · layer 11 · head mean · shared scale: all layers (head means)'
    (the layer left out for a stack of one row: a map of the whole model, such as relevance)."""
    which = "heads fused" if stack.num_heads == 1 else f"head {head}"
    at = f" · layer {layer}" if layer is not None and stack.maps.shape[0] > 1 else ""
    return f"{stack.title}{at} · {which} · {scale_label(stack, head, scale)}"


def cover(values: np.ndarray, input_hw: tuple[int, int], patch: int) -> np.ndarray:
    """A (gh, gw) map padded (with its minimum) to cover a model input of `input_hw` pixels that is not a whole
    number of patches; otherwise unchanged."""
    gh, gw = values.shape
    ph, pw = -(-int(input_hw[0]) // patch), -(-int(input_hw[1]) // patch)
    if gh >= ph and gw >= pw:
        return values
    out = np.full((ph, pw), float(values.min()), dtype=np.float32)
    out[:gh, :gw] = values
    return out


def draw_map(stack: MapStack, layer: LayerSel, head: HeadSel, image: np.ndarray, input_hw: tuple[int, int],
             patch: int, opts: RenderOptions) -> np.ndarray:
    """One layer's and head's map of a stack drawn over (or beside) `image`.

    Colours span `MapStack.levels`; the map is stretched to cover the whole of `image` (see `cover` for an input
    that is not a whole number of patches). With a colorbar, an image smaller than `MIN_PICTURE_PX` on its
    shorter side is drawn enlarged by a whole factor (`enlarge`), so the picture, its bar and the bar's label can
    be read (the demo's 64-px images made 140 × 64 pictures with the label cut); without one the picture is the
    image's size pixel for pixel, to be laid over it.

    Args:
        image: (H, W, 3) uint8, what the map is drawn over (the region the model saw, or the model input).
        input_hw: the model input's size in pixels; patch: its patch size.

    Returns:
        (H, W, 3) uint8; with a colorbar (k·H, k·W + colorbar, 3), k = `enlargement((H, W))`.
    """
    if stack.pending:
        raise SelectionError(f"{stack.title}: the map is still being computed; export it once it is shown")
    values = stack.select(layer, head)
    lo, hi = stack.levels(values, head, own=opts.scale == "own")
    image = enlarge(_check_rgb(image, "image")) if opts.colorbar else image
    heat = heatmap_image(cover(values, input_hw, patch), image.shape[:2], opts.cmap, opts.smooth, lo, hi)
    rgb = heat if opts.style == "heatmap" else overlay(image, heat, float(opts.opacity))
    if not opts.colorbar:
        return rgb
    label = colorbar_label(stack, head, opts.scale, layer) if opts.colorbar_label else ""
    return add_colorbar(rgb, opts.cmap, lo, hi, label=label)
