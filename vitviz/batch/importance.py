"""`vitviz export --importance`: the head-importance grid of the export's images as PNG + CSV + npz.

    importance.png   the grid as `vitviz.show(importance)` draws it (exact scan; the attribution estimate beside it)
    importance.csv   layer,head,drop[,estimate] -- one row per head
    importance.npz   drop (L, H), per_image (N, L, H), clean (N,), estimate (L, H) when asked, and as text: metric,
                     mode, sources, targets, labels, title, interventions (what else was done to the model)

Every file is written atomically; the manifest's "importance" entry (`record`) names them with the top heads, the
scan's time and its number of forward passes.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np

from vitviz.core import files
from vitviz.core.analyses.importance import HeadImportance
from vitviz.core.drawing.importance import draw_importance

NAMES = ("importance.png", "importance.csv", "importance.npz")


def csv_text(imp: HeadImportance) -> str:
    """The grid as CSV: layer,head,drop[,estimate], one row per head, layers then heads in order."""
    rows = imp.rows()
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_importance(imp: HeadImportance, out: Path, overwrite: bool) -> list[Path]:
    """Write the three files into `out`; returns their paths (OutputExistsError for one that exists without
    `overwrite`)."""
    png, table, arrays = (out / name for name in NAMES)
    files.write_png_atomic(png, draw_importance(imp), overwrite)
    files.write_text_atomic(table, csv_text(imp), overwrite)
    data: dict[str, np.ndarray] = {
        "drop": imp.drop, "per_image": imp.per_image, "clean": imp.clean,
        "metric": np.array(imp.metric), "mode": np.array(imp.mode), "title": np.array(imp.title),
        "sources": np.array(list(imp.sources)), "labels": np.array(list(imp.labels)),
        "targets": np.array([-1 if t is None else t for t in imp.targets]),
        "interventions": np.array(list(imp.interventions), dtype=str),
    }
    if imp.estimate is not None:
        data["estimate"] = imp.estimate
        data["correlation"] = np.array(np.nan if imp.correlation is None else imp.correlation)
    files.write_arrays_atomic(arrays, data, overwrite)
    return [png, table, arrays]


def record(imp: HeadImportance, paths: list[Path], root: Path) -> dict[str, Any]:
    """The manifest's "importance" entry."""
    return {"files": [str(p.relative_to(root)) for p in paths], "title": imp.title, "metric": imp.metric,
            "mode": imp.mode, "images": len(imp.sources),
            "top": [{"layer": layer, "head": head, "drop": round(d, 6)} for layer, head, d in imp.top(5)],
            "correlation": imp.correlation, "seconds": round(imp.seconds, 3), "forwards": imp.forwards,
            "interventions": list(imp.interventions)}
