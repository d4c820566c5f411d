"""The head-importance grid (`vitviz.core.analyses.importance.HeadImportance`) as a picture: layers down, heads
across, each cell coloured by its drop on a diverging colormap centred on 0 (red: the model loses when the head is
ablated; blue: it gains), with the value written in the cell when it fits, a title and a colorbar. With attribution
patching's estimate, the estimate is drawn beside the exact grid on the same scale, with Pearson's r.

Pure NumPy + Pillow, as `render`; `vitviz export --importance` writes this picture and `vitviz.show(importance)`
returns it.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vitviz.core.analyses.importance import HeadImportance
from vitviz.core.drawing.colormaps import DIVERGING, apply_colormap
from vitviz.core.drawing.render import add_colorbar

MIN_CELL, MAX_CELL = 14, 48   # cell side in pixels: a grid of 12 x 12 gets 36 px cells, 40 x 16 the smallest
FONT_PX = 12
LEFT, TOP = 30, 34            # a panel's grid starts this far right (layer labels) and down (caption, head labels)
LINE_PX = 16                  # the title's lines


def _cell(shape: tuple[int, int]) -> int:
    return int(np.clip(440 // max(shape), MIN_CELL, MAX_CELL))


def _panel(values: np.ndarray, cell: int, bound: float, cmap: str, font: ImageFont.ImageFont,
           caption: str, marks: set[tuple[int, int]]) -> Image.Image:
    """One grid with its head numbers above, layer numbers on the left, the caption over them; `marks` are
    outlined (the heads the caption's top list names)."""
    layers, heads = values.shape
    colours = apply_colormap(np.repeat(np.repeat(values.astype(np.float32), cell, 0), cell, 1), cmap, -bound, bound)
    left, top = LEFT, TOP
    image = Image.new("RGB", (left + heads * cell + 4, top + layers * cell + 4), "white")
    image.paste(Image.fromarray(colours), (left, top))
    draw = ImageDraw.Draw(image)
    draw.text((4, 2), caption, fill="black", font=font)
    for h in range(heads):
        if heads <= 16 or h % 2 == 0:
            draw.text((left + h * cell + cell // 2 - 7, top - 15), f"H{h}" if cell >= 24 else str(h), fill="black",
                      font=font)
    for layer in range(layers):
        if layers <= 24 or layer % 2 == 0:
            draw.text((2, top + layer * cell + cell // 2 - 5), f"L{layer}", fill="black", font=font)
    if cell >= 32:   # the value in each cell, in black or white by the cell's lightness
        for (layer, h), v in np.ndenumerate(values):
            text = f"{v:+.2f}" if abs(v) >= 0.01 else f"{v:+.3f}"
            rgb = colours[layer * cell + cell // 2, h * cell + cell // 2].astype(int)
            ink = "black" if rgb @ np.array([299, 587, 114]) > 128_000 else "white"
            width = draw.textlength(text, font=font)
            draw.text((left + h * cell + (cell - width) / 2, top + layer * cell + cell // 2 - 5), text, fill=ink,
                      font=font)
    for layer, h in marks:
        x, y = left + h * cell, top + layer * cell
        draw.rectangle((x, y, x + cell - 1, y + cell - 1), outline="black", width=2)
    return image


def draw_importance(imp: HeadImportance, cmap: str = DIVERGING, top: int = 3, legend: bool = True) -> np.ndarray:
    """The grid (and the attribution estimate beside it) as an (H, W, 3) uint8 picture; the `top` heads with the
    largest drops are outlined and named in the caption. Without `legend` no title lines and no colorbar: the
    window says them in a label of its own (`legend_lines`), where they wrap, so the grid itself can be drawn
    large in a narrow dock."""
    font = ImageFont.load_default(size=FONT_PX)
    cell = _cell(imp.drop.shape)
    grids = [imp.drop] + ([imp.estimate] if imp.estimate is not None else [])
    bound = float(max(np.abs(g).max() for g in grids)) or 1.0
    best = imp.top(top)
    marks = {(layer, h) for layer, h, _ in best}
    panels = [_panel(imp.drop, cell, bound, cmap, font, "exact (one forward per head)", marks)]
    if imp.estimate is not None:
        r = "" if imp.correlation is None else f", r = {imp.correlation:.2f}"
        panels.append(_panel(imp.estimate, cell, bound, cmap, font, f"attribution estimate{r}", marks))
    lines = legend_lines(imp, top)[:2] if legend else []
    title_h = _title_height(len(lines)) if lines else 0
    width = sum(p.width for p in panels) + 16 * (len(panels) - 1)
    width = max([width] + [int(font.getlength(t)) + 8 for t in lines])
    canvas = Image.new("RGB", (width, title_h + max(p.height for p in panels)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, text in enumerate(lines):
        draw.text((4, 3 + LINE_PX * i), text, fill="black", font=font)
    x = 0
    for p in panels:
        canvas.paste(p, (x, title_h))
        x += p.width + 16
    return add_colorbar(np.asarray(canvas), cmap, -bound, bound, label=legend_lines(imp, top)[2]) if legend \
        else np.asarray(canvas)


def legend_lines(imp: HeadImportance, top: int = 3) -> list[str]:
    """The picture's title, its 'largest drops: ...' line and its colorbar's label."""
    names = ", ".join(f"L{layer}.H{h} {d:+.3g}" for layer, h, d in imp.top(top))
    label = {"probability": "drop of the class probability", "logit": "drop of the class logit",
             "cosine": "1 - cosine to the clean features"}[imp.metric]
    return [imp.title, f"largest drops: {names}", label]


def _title_height(lines: int) -> int:
    return LINE_PX * lines + 4


def cell_at(imp: HeadImportance, x: int, y: int, legend: bool = True) -> tuple[int, int] | None:
    """The (layer, head) of the exact grid's cell at pixel (x, y) of `draw_importance(imp, legend=legend)`, or
    None (the window's Importance view: click a cell to ablate that head)."""
    cell, title = _cell(imp.drop.shape), _title_height(2) if legend else 0
    col, row = (x - LEFT) // cell, (y - title - TOP) // cell
    if x < LEFT or y < title + TOP or not (0 <= row < imp.drop.shape[0] and 0 <= col < imp.drop.shape[1]):
        return None
    return int(row), int(col)


def cell_rect(imp: HeadImportance, layer: int, head: int, legend: bool = True) -> tuple[int, int, int]:
    """(x, y, size) in pixels of the exact grid's cell of (layer, head) in `draw_importance(imp, legend=legend)`:
    where the window outlines an ablated head (the inverse of `cell_at`)."""
    cell = _cell(imp.drop.shape)
    return LEFT + head * cell, (_title_height(2) if legend else 0) + TOP + layer * cell, cell
