"""One-line summaries of models and results, for `repr` in a terminal or notebook: what the object is, never
its arrays (a ViT-L result holds hundreds of megabytes; printing it must not).

    VitModel(vit_b_16-c867db91.pth: torchvision, 86.6M params, 12 blocks × 12 heads, 224×224 px / 16, cpu, verified)
    AttentionResult(cat.jpg: attentions (12, 12, 197, 197) float32, grid 14×14, top 'tabby' 0.62)
    AttentionResult(cat.jpg: ..., top 'tabby' 0.31, intervened: ablate L3.H1 (zero))

Duck-typed on the fields the model and result classes share, so it imports nothing of vitviz.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np


def _name(source: Any) -> str:
    text = str(source or "")
    base = os.path.basename(text.rstrip("/\\")) or text
    if os.path.basename(os.path.dirname(text.rstrip("/\\"))) == "snapshots":   # an HF cache snapshot: the repo
        parts = text.replace("\\", "/").split("/")
        repo = next((p for p in parts if p.startswith("models--")), "")
        base = repo[len("models--"):].replace("--", "/") if repo else base
    return base if len(base) <= 60 else base[:57] + "..."


def _params(n: int) -> str:
    if n <= 0:
        return ""
    return f"{n / 1e9:.2f}B params" if n >= 1e9 else f"{n / 1e6:.1f}M params" if n >= 1e5 else f"{n} params"


def _verdict(model: Any) -> str:
    """The verdict of the model's last `vitviz.verify` ('verified', 'differs', 'unverified'), else 'verified'
    when a verification confirmed the spec's settings (the commands apply it), else '' (not known)."""
    check = getattr(model, "verification", None)
    if getattr(check, "verdict", ""):
        return str(check.verdict)
    provenance = dict(getattr(model.spec, "provenance", ()) or ())
    return "verified" if any(str(v).startswith("verified") for v in provenance.values()) else ""


def model_summary(model: Any) -> str:
    """`Class(name: family, size, depth × heads, input size / patch, device[, verified][, N assumed])`."""
    spec = model.spec
    heads = spec.heads if hasattr(spec, "heads") else spec.num_heads
    if isinstance(heads, tuple):   # a windowed model: heads per stage
        shape = f"{spec.depth} blocks, heads {'/'.join(map(str, heads))}"
    else:
        shape = f"{spec.depth} blocks × {heads} heads"
    h, w = spec.image_size
    family = spec.family
    if "(by its code: " in str(dict(getattr(spec, "provenance", ()) or ()).get("path", "")):
        family = "live, by its code (transformers)"   # a tower run by transformers' own code (reading.towers)
    parts = [family, _params(int(getattr(spec, "num_params", 0) or 0)), shape,
             f"{h}×{w} px / {spec.patch_size}", str(model.device), _verdict(model)]
    assumed = len(getattr(spec, "assumptions", ()) or ())
    if assumed:
        parts.append(f"{assumed} assumed setting{'s' if assumed > 1 else ''}")
    return f"{type(model).__name__}({_name(spec.source)}: {', '.join(p for p in parts if p)})"


def _array(name: str, a: Any) -> str:
    return f"{name} {tuple(a.shape)} {a.dtype}" if isinstance(a, np.ndarray) else ""


def _top(result: Any) -> str:
    top = result.top_k(1)
    if not top:
        return "no classifier" if getattr(result, "features", None) is not None else ""
    _, label, p = top[0]
    return f"top {label!r} {p:.2f}"


def result_summary(result: Any) -> str:
    """`Class(image: attention shape(s), grid, top class)`."""
    if hasattr(result, "blocks"):   # a windowed result: one array per block
        shapes = {tuple(b.shape[1:]) for b in result.blocks}
        what = f"{len(result.blocks)} blocks ({len(shapes)} window shape{'s' if len(shapes) > 1 else ''})"
    else:
        what = _array("attentions", result.attentions)
    gh, gw = result.grid
    parts = [what, f"grid {gh}×{gw}", _top(result)]
    parts += [f"intervened: {d}" for d in getattr(result, "interventions", ())]
    return f"{type(result).__name__}({_name(result.source) or 'image'}: {', '.join(p for p in parts if p)})"
