"""The model-info dock: what was detected and where each value came from (and of which kind: read, derived, named,
given or assumed), whether the model was verified against its original (and what is assumed), parameters per part,
tokens, preprocessing, device, memory of the cached attention and the current image's top-5 predictions.

Plain data in, HTML out (`info_html` is Qt-free and tested on its own); the panel is a read-only text browser that
gathers its `ModelInfo` from the session (`gather`) whenever the session says something it shows has changed.
"""
from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QUrl, Signal
from PySide6.QtWidgets import QTextBrowser, QVBoxLayout, QWidget

from vitviz.core.spec import ModelSpec
from vitviz.gui.assumptions import LEVEL_STYLES, VerdictLine, asked, reason, runs_own_code, value_text
from vitviz.gui.panels.base import LazyPanel, display_name
from vitviz.gui.session import Session

SKIP_FIELDS = {"provenance", "labels", "preprocess"}


@dataclass
class ModelInfo:
    """Everything the panel shows, gathered from the session (`gather`)."""

    spec: ModelSpec | None = None
    device: str = ""
    path: str = ""
    param_counts: dict[str, int] = field(default_factory=dict)
    cache_bytes: int = 0
    cached_images: int = 0
    image: str = ""
    top5: list[tuple[int, str, float]] = field(default_factory=list)
    image_size: tuple[int, int] | None = None
    loading: str = ""           # the model being loaded while none is (its path or name)
    code: str = ""              # FILE.py:FACTORY of a model built by the user's code
    layers: tuple[tuple[str, str], ...] = ()                      # a live model's (layer, mechanism that found it)
    skipped: tuple[tuple[str, str, tuple[int, ...]], ...] = ()    # its attention calls left out
    verdict: VerdictLine | None = None      # verified / not verified / differs (`assumptions.verdict_line`)
    stages: list[tuple[str, str]] = field(default_factory=list)   # a windowed model's stages and blocks
                                                                  # (`vitviz.core.analyses.winview.info_rows`)


def gather(session: Session) -> ModelInfo:
    """What the session knows now about the model, the cache and the current image."""
    maps = session.image_list.current_maps
    stages: list[tuple[str, str]] = []
    if session.model.traits.blocks:    # its stages' blocks: at the current image's run, else at the input size
        from vitviz.core.analyses.winview import info_rows

        spec = session.model.spec
        from vitviz.gui.panels.controls import geometry_at

        stages = (maps.info_rows() if maps is not None else []) or info_rows(
            spec, geometry_at(spec, session.model.image_size))  # type: ignore[arg-type]
    return ModelInfo(spec=session.model.spec, device=session.model.device, path=session.model.model_path, stages=stages,
                     param_counts=dict(session.model.param_counts), cache_bytes=session.cache_nbytes,
                     cached_images=len(session.cached_paths()),
                     image=Path(session.image_list.current).name if session.image_list.current else "",
                     top5=maps.result.top_k(5) if maps is not None else [], image_size=session.model.image_size,
                     loading=session.model.loading, code=session.model.model_code, layers=session.model.live_layers,
                     skipped=session.model.live_skipped,
                     verdict=session.verdict_line())


def _count(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else (f"{n / 1e3:.1f} k" if n >= 1e3 else str(n))


def _bytes(n: int) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...] = ()) -> str:
    head = "".join(f"<th align='left'>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table cellspacing='0' cellpadding='2'>{'<tr>' + head + '</tr>' if head else ''}{body}</table>"


def _section(title: str, body: str) -> str:
    return f"<h4 style='margin-bottom:2px'>{html.escape(title)}</h4>{body}"


def spec_rows(spec: ModelSpec) -> list[tuple[str, str, str, str]]:
    """(field, value, kind, where it came from) for every spec field except the long ones shown elsewhere; the
    kind ('read', 'derived', 'named', 'given', 'assumed') only for fields that change the computation now."""
    kinds = spec.kinds()
    rows = []
    for f in dataclasses.fields(spec):
        if f.name in SKIP_FIELDS:
            continue
        value = getattr(spec, f.name)
        text = "×".join(map(str, value)) if isinstance(value, tuple) else str(value)
        rows.append((f.name, text, kinds.get(f.name, ""), spec.source_of(f.name)))
    rows.append(("labels", f"{len(spec.labels)} class names" if spec.labels else "none", "",
                 spec.source_of("labels")))
    return rows


def _exactness_section(info: ModelInfo) -> str:
    """The verdict (red when the model differs from its original), every assumption with its reason, the quiet
    notes, and a link to the dialog when there is something to answer."""
    spec, line = info.spec, info.verdict
    if spec is None or line is None or not line.text:
        return ""
    style = LEVEL_STYLES.get(line.level, "")
    body = f"<p style='{style}'>{html.escape(line.text)}</p>"
    first = line.tooltip.splitlines()[0] if line.tooltip else ""
    if first and not first.startswith((line.text, "Assumed", "Nothing")):
        body += f"<p>{html.escape(first)}</p>"              # the check's own summary, or why it could not run
    if spec.assumptions:
        rows = [(name, value_text(spec, name), reason(source)) for name, source in spec.assumptions]
        body += "<p>Assumed (the file does not say; each changes the computation):</p>" + _table(
            rows, ("setting", "value", "why"))
    if asked(spec):
        body += "<p><a href='review:'>Review assumptions…</a></p>"
    if spec.notes:
        body += "<p><small>Also assumed, without changing the computation: " + html.escape("; ".join(
            f"{name}: {reason(source)}" for name, source in spec.notes)) + "</small></p>"
    return _section("Exactness", body)


def parameter_rows(counts: dict[str, int]) -> list[tuple[str, str, str]]:
    total = sum(counts.values()) or 1
    rows = [(part, _count(n), f"{100 * n / total:.1f} %") for part, n in counts.items()]
    return rows + [("total", _count(sum(counts.values())), "")]


def info_html(info: ModelInfo) -> str:
    """The whole panel as HTML."""
    spec = info.spec
    if spec is None and info.loading:
        return f"<p>Loading model {html.escape(display_name(info.loading))}…</p>"
    if spec is None:
        return "<p>No model loaded. Open a checkpoint (File › Open model) or drop one on the window.</p>"
    if info.stages:                  # a windowed model's stages and blocks
        return windowed_html(info)
    grid = spec.grid if info.image_size is None else (info.image_size[0] // spec.patch_size,
                                                      info.image_size[1] // spec.patch_size)
    n_tokens = spec.num_prefix + grid[0] * grid[1]
    prefix = ", ".join(spec.prefix_names) or "none"
    parts = [
        f"<h3 style='margin-bottom:2px'>{html.escape(spec.family)}</h3>"
        f"<p>{html.escape(info.path or spec.source)}<br>device: <b>{html.escape(info.device or '?')}</b></p>",
        _exactness_section(info),
        _live_section(info),
        _section("Tokens", _table([
            ("prefix tokens", f"{spec.num_prefix} ({prefix})"),
            ("position embedding", _pos_text(spec)),
            ("grid at the current input size", f"{grid[0]}×{grid[1]} patches of {spec.patch_size} px"),
            ("tokens T", str(n_tokens))])),
        *_model_sections(info, links=True),
    ]
    return "".join(parts)


def _model_sections(info: ModelInfo, links: bool) -> list[str]:
    """The sections every model's panel ends with: parameters per part, preprocessing, memory, top-5 (`links`: its
    classes are links), and every spec field with its provenance."""
    spec = info.spec
    assert spec is not None
    pp = spec.preprocess
    return [
        _section("Parameters per part", _table(parameter_rows(info.param_counts), ("part", "parameters", "share"))
                 if info.param_counts else f"<p>{_count(spec.num_params)} in total</p>"),
        _section("Preprocessing", _table([
            ("mode", pp.mode), ("resize", str(pp.resize)), ("crop", "×".join(map(str, pp.crop))),
            ("interpolation", pp.interpolation), ("mean", ", ".join(f"{m:.3f}" for m in pp.mean)),
            ("std", ", ".join(f"{s:.3f}" for s in pp.std)), ("from", spec.source_of("preprocess"))])),
        _section("Memory", f"<p>cached results: {info.cached_images} image(s), {_bytes(info.cache_bytes)} "
                           "(attention and the maps derived from it)</p>"),
        _section("Top-5 for the current image", _top5(info, links=links)),
        _section("Every spec field and where it came from", _table(spec_rows(spec),
                                                                  ("field", "value", "kind", "source"))),
    ]


def windowed_html(info: ModelInfo) -> str:
    """`info_html` of a windowed model (Swin, SAM / ViTDet): its stages (depth, heads, width, window, grid) and
    every block's attention ('windowed (7×7, shift 3)' / 'global (8×8)'), then what a plain ViT's panel shows."""
    spec = info.spec
    assert spec is not None
    stage_rows = [(label, value) for label, value in info.stages if not label.startswith("stage ") or
                  " block " not in label]
    block_rows = [(label, value) for label, value in info.stages if (label, value) not in stage_rows]
    parts = [
        f"<h3 style='margin-bottom:2px'>{html.escape(spec.family)}</h3>"
        f"<p>{html.escape(info.path or spec.source)}<br>device: <b>{html.escape(info.device or '?')}</b></p>",
        _exactness_section(info),
        _section("Stages", _table(stage_rows, ("", "windowed attention"))),
        _section("Blocks", _table(block_rows, ("block", "attention"))),
        _section("Tokens", "<p>no prefix tokens (no CLS token: the head averages the last stage's tokens); a "
                           "block's attention is per window: windows × heads × window tokens × window tokens</p>"),
        *_model_sections(info, links=False),
    ]
    return "".join(parts)


def _pos_text(spec: ModelSpec) -> str:
    parts = []
    if spec.pos_embed and spec.pos_kind == "sincos2d":
        parts.append("2-D sin-cos, computed (not stored)")
    elif spec.pos_embed and spec.pos_kind == "sincos1d":
        parts.append("1-D sin-cos over the token sequence, computed (not stored)")
    elif spec.pos_embed:
        rows = f"{spec.pos_prefix} prefix row(s)" if spec.pos_prefix else "no prefix rows (no_embed_class)"
        parts.append(f"learned, trained at {spec.pos_grid[0]}×{spec.pos_grid[1]}, {rows}, resampled with "
                     f"{spec.pos_interp}")
    if spec.rope:
        parts.append(f"rotary (RoPE, {spec.rope}, θ {spec.rope_theta:g}) on the patch tokens' q and k")
    if spec.rel_pos and spec.rel_pos_mlp:
        parts.append(f"relative position bias computed by a small MLP from log-spaced offsets ({spec.rel_pos}, "
                     f"hidden {spec.rel_pos_mlp}; timm relpos), for any grid")
    elif spec.rel_pos:
        parts.append(f"relative position bias, a learned table ({spec.rel_pos})")
    if not spec.pos_embed:
        parts.append("no learned absolute position embedding")
    return "; ".join(parts) if spec.pos_embed or spec.rope or spec.rel_pos else \
        "none (no learned absolute position embedding)"


def _live_section(info: ModelInfo) -> str:
    """For a model run from its own code: which mechanism found which attention layer, and what was left out."""
    if not info.layers and not info.code and not runs_own_code(info.spec):
        return ""
    rows = [(name or "(module not found)", mechanism) for name, mechanism in info.layers]
    body = (f"<p>Built by your code: {html.escape(info.code)}</p>" if info.code else "") + (
        "<p>Attention captured where your model's code computes it, layer by layer:</p>"
        + _table(rows, ("layer", "found by")) if rows else "<p>No attention layer was found.</p>")
    if info.skipped:
        left = [(name, mechanism, "×".join(map(str, shape))) for name, mechanism, shape in info.skipped]
        body += ("<p>Attention calls left out (not self-attention over all image tokens):</p>"
                 + _table(left, ("where", "mechanism", "shape")))
    return _section("Attention capture (the model's own code)", body)


def _top5(info: ModelInfo, links: bool = True) -> str:
    """The current image's top-5 classes; `links`: each a link to its class relevance (not for a windowed model,
    which has none)."""
    if not info.image:
        return "<p>No image yet.</p>"
    if not info.top5:
        return f"<p>{html.escape(info.image)}: no classifier head (or not run yet).</p>"
    if not links:
        return f"<p>{html.escape(info.image)}</p>" + _table([(label, f"{100 * p:.1f} %", str(i))
                                                            for i, label, p in info.top5],
                                                           ("class", "probability", "index"))
    head = "".join(f"<th align='left'>{h}</th>" for h in ("class", "probability", "index"))
    body = "".join(f"<tr><td><a href='class:{i}'>{html.escape(label)}</a></td><td>{100 * p:.1f} %</td><td>{i}</td>"
                   "</tr>" for i, label, p in info.top5)   # a click shows the class relevance of that class
    return (f"<p>{html.escape(info.image)}</p><table cellspacing='0' cellpadding='2'><tr>{head}</tr>{body}</table>"
            "<p><small>Click a class to see its class relevance on the image.</small></p>")


class InfoPanel(LazyPanel):
    """A read-only text view of `info_html` of the session (re-rendered only while on screen).

    Signals:
        class_clicked(index): a class of the top-5 was clicked (the window shows its class relevance).
        review_requested(): "Review assumptions…" was clicked (the window opens the dialog).
    """

    class_clicked = Signal(int)
    review_requested = Signal()     # "Review assumptions…" was clicked

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("infoPanel")
        self.session = session
        self.browser = QTextBrowser()
        self.browser.setOpenLinks(False)
        self.browser.anchorClicked.connect(self._on_link)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.browser)
        self.info = ModelInfo()
        model, images = session.model, session.image_list
        for signal in (model.model_loaded, model.device_changed, model.loading_changed, model.verification_changed,
                       images.current_changed, images.result_ready):
            signal.connect(self._on_session_changed)
        self.show_info(gather(session))

    def _on_link(self, url: QUrl) -> None:
        text = url.toString()
        if text.startswith("class:") and text[6:].isdigit():
            self.class_clicked.emit(int(text[6:]))
        elif text.startswith("review:"):
            self.review_requested.emit()

    def _on_session_changed(self, *_args: object) -> None:
        """Gathered when drawn: behind the Images tab (where it starts) a new image costs nothing here."""
        self._gathered = False
        self.request_redraw()

    def show_info(self, info: ModelInfo) -> None:
        self.info = info
        self._gathered = True
        self.request_redraw()

    def redraw(self) -> None:
        if not self._gathered:
            self.info, self._gathered = gather(self.session), True
        info = self.info
        bar = self.browser.verticalScrollBar()
        where = bar.value()
        self.browser.setHtml(info_html(info))
        bar.setValue(where)

    def text(self) -> str:
        """The panel's text as shown (rendered now if it was waiting behind a tab)."""
        if self._dirty:
            self._dirty = False
            self.redraw()
        return self.browser.toPlainText()
