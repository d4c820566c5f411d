"""The window's interventions (`vitviz.gui.interventions`, `vitviz.gui.importance_view`): a head ablated from the
overview tile's menu or the Head selector, or patched from another image of the list, runs in the worker; then every
panel shows the intervened run -- the library's numbers and attention, downstream layers included -- marked as such,
the image list's top-5 beside the clean one, and Undo / Back to clean restores the clean run; the importance grid in
the Overview dock is the library's and a click on a cell ablates that head; a model without the hook points has the
entries greyed out, saying why."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QMouseEvent

from _gui import HEADS, wait_idle


def _probability(result, index: int) -> float:
    z = result.logits.astype(np.float64)
    p = np.exp(z - z.max())
    return float(p[index] / p.sum())


def _action(menu, text: str):  # noqa: ANN001, ANN202
    return next(a for a in menu.actions() if a.text().startswith(text))


def _answered(qtbot, window) -> None:  # noqa: ANN001
    """Wait until the current image's intervened run is what the panels show."""
    from vitviz.gui.interventions import IntervenedMaps
    from vitviz.gui.panels.base import redraws_pending

    iv = window.interventions
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: iv.current() is not None and window.session.image_list.current_maps is iv.current().maps
                    and not redraws_pending(), timeout=20000)   # and the redraws of the turn (once each) have run
    qtbot.waitUntil(window.intervention_banner.isVisible, timeout=5000)   # the toolbar has laid its banner out
    assert isinstance(window.session.image_list.current_maps, IntervenedMaps)


def test_ablate_from_the_overview_menu_every_panel_and_undo(qtbot, loaded, tiny_ckpt, images) -> None:  # noqa: ANN001
    import vitviz
    from vitviz.core.analyses.analysis import mean_attention_distance
    from vitviz.core.analyses.features import capture_features
    from vitviz.core.analyses.maps import MapKind
    from vitviz.core.analyses.relevance import class_relevance
    from vitviz.core.running.interventions import Ablate

    window = loaded
    iv, s = window.interventions, window.session
    dock = window.dock("interventionsDock")
    clean = s.image_list.current_maps
    assert not dock.isVisible() and iv.available and not window.intervention_banner.isVisible()
    menu = iv.menu(window, 0, 1)
    assert menu is not None and menu.actions()[0].text() == "Ablate layer 0, head 1"
    menu.actions()[0].trigger()
    menu.close()
    _answered(qtbot, window)
    assert dock.isVisible() and iv.heads == [(0, 1)]
    assert len(window.overview.marked()) == 1
    model = vitviz.load(tiny_ckpt, heads=HEADS)
    want = model.run(s.image_list.current, intervene=Ablate([(0, 1)]))
    shown = s.image_list.current_maps
    assert shown.result.interventions == ("ablate L0.H1 (zero)",)
    # every panel draws from the intervened forward: layer 1 (after the ablated head) differs from the clean run
    np.testing.assert_allclose(shown.result.attentions, want.attentions, atol=1e-6)
    assert not np.allclose(shown.result.attentions[1], clean.result.attentions[1], atol=1e-4)
    assert window.overview._maps is shown and window.panel._maps is shown
    assert window.overview.title.text.startswith("ablated L0.H1 · ")
    assert window.rollout_panel._maps is shown and window.matrix._maps is shown
    assert window.intervention_banner.isVisible()
    assert "every panel shows this run" in window.intervention_banner.label.toolTip()
    np.testing.assert_allclose(window.headstats.statistics()[0], mean_attention_distance(want), atol=1e-4)
    assert not np.allclose(window.headstats.statistics()[0], s.head_stats[s.image_list.current][0], atol=1e-4)
    # the passes of their own run under the same intervention, kept in the intervened run (the clean one untouched)
    assert shown.why_not("features") is None and shown.unshown(MapKind("relevance")) is None
    window.features.redraw()
    qtbot.waitUntil(lambda: shown.features is not None, timeout=20000)
    assert clean.features is None or clean.features is not shown.features
    s.relevance_pass.request(s.image_list.current)
    qtbot.waitUntil(lambda: shown.relevance() is not None, timeout=20000)
    with model.intervening(Ablate([(0, 1)])):
        feats = capture_features(model, s.image_list.current)
        rel = class_relevance(model, s.image_list.current)
    np.testing.assert_allclose(shown.features.raw, feats.raw, atol=1e-5)
    np.testing.assert_allclose(shown.relevance().chefer, rel.chefer, atol=1e-5)
    np.testing.assert_allclose(shown.relevance().attn_grad, rel.attn_grad, atol=1e-5)
    plain = class_relevance(model, s.image_list.current)      # and the intervention changed them
    assert not np.allclose(shown.relevance().attn_grad, plain.attn_grad, atol=1e-4)
    assert not np.allclose(shown.features.raw[-1], capture_features(model, s.image_list.current).raw[-1], atol=1e-4)
    assert clean.relevance() is None or not np.allclose(clean.relevance().attn_grad, rel.attn_grad, atol=1e-4)
    table = dock.widget().table
    assert table.rowCount() == 5
    for row in range(table.rowCount()):
        index = next(i for i, name, _p in want.top_k(5) if name == table.item(row, 0).text())
        assert abs(float(table.item(row, 2).text()) - _probability(want, index)) < 6e-4
        assert abs(float(table.item(row, 3).text()) - (_probability(want, index) - _probability(clean.result, index))) \
            < 1.1e-3
    assert "Intervened: ablated L0.H1 (zero)" in dock.widget().heads_label.text()
    # the list: the other images run intervened too, after the current one; each line clean -> intervened (Δ)
    qtbot.waitUntil(lambda: all(iv.probabilities(str(p)) is not None for p in images), timeout=20000)
    for path in images:
        other = model.run(str(path), intervene=Ablate([(0, 1)]))
        text = window.images.top_text(str(path))
        index, label, p = s.cached(str(path)).result.top_k(1)[0]
        after = _probability(other, index)
        assert f"{p * 100:4.1f}→{after * 100:4.1f}% ({(after - p) * 100:+.1f})  {label}" in text
    # undo: back to the clean run everywhere
    window.intervention_banner.undo_action.trigger()
    assert iv.steps == [] and window.overview.marked() == []
    assert s.image_list.current_maps is clean and window.overview._maps is clean and window.panel._maps is clean
    qtbot.waitUntil(lambda: not window.intervention_banner.isVisible(), timeout=5000)   # the toolbar lays out
    assert "→" not in window.images.top_text(s.image_list.current)
    assert table.item(0, 2).text() == ""


def test_head_selector_marks_and_right_click(qtbot, loaded, monkeypatch) -> None:  # noqa: ANN001
    window = loaded
    iv, state, spin = window.interventions, window.state, window.controls.head_spin
    state.update(layer=1, head=0)
    assert "dashed" not in spin.styleSheet()
    asked = []
    monkeypatch.setattr(iv, "popup", lambda parent, layer, head, where: asked.append((layer, head)))
    spin.lineEdit().customContextMenuRequested.emit(QPoint(2, 2))
    window.controls.head_slider.customContextMenuRequested.emit(QPoint(2, 2))
    assert asked == [(1, 0), (1, 0)]
    iv.toggle(1, 0)
    assert "dashed" in spin.styleSheet() and "is ablated" in spin.toolTip()
    state.update(head=1)
    assert "dashed" not in spin.styleSheet()
    state.update(head=0)
    iv.undo()
    assert "dashed" not in spin.styleSheet()
    wait_idle(qtbot, window)


@pytest.mark.parametrize("kind", ["attention", "residual"])
def test_patch_from_another_image_of_the_list(qtbot, loaded, tiny_ckpt, images, kind: str) -> None:  # noqa: ANN001
    import vitviz
    from vitviz.core.running.interventions import PatchAttention, PatchResidual

    window = loaded
    iv, s = window.interventions, window.session
    assert s.image_list.current == str(images[0])
    menu = iv.menu(window, 1, 1)
    sub = _action(menu, "Patch L1.H1's attention from" if kind == "attention" else "Patch block 1's output from")
    names = [a.text() for a in sub.menu().actions()]
    assert names == [images[1].name, images[2].name]       # the other images of the list
    sub.menu().actions()[1].trigger()
    menu.close()
    _answered(qtbot, window)
    item = PatchAttention(1, 1, str(images[2])) if kind == "attention" else PatchResidual(1, str(images[2]))
    want = vitviz.load(tiny_ckpt, heads=HEADS).run(s.image_list.current, intervene=item)
    shown = s.image_list.current_maps
    np.testing.assert_allclose(shown.result.logits, want.logits, atol=1e-5)
    np.testing.assert_allclose(shown.result.attentions, want.attentions, atol=1e-6)
    assert shown.result.interventions == (item.describe(),)
    assert iv.heads == [] and window.intervention_banner.isVisible()
    assert f"from {images[2].name}" in window.intervention_banner.label.toolTip()
    iv.undo()
    assert s.image_list.current_maps is s.cached(s.image_list.current)


def test_importance_view_in_the_overview_dock(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    import vitviz
    from vitviz.core.analyses.importance import head_importance
    from vitviz.core.drawing.importance import cell_rect

    window = loaded
    iv, view = window.interventions, window.importance_view
    assert window.overview.isAncestorOf(view) and not view.isVisible()
    assert window.overview.isAncestorOf(window.overview.widget)     # the tiles stay in the panel, beside the grid
    iv.scan()
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: iv.current_importance() is not None, timeout=20000)
    imp = iv.current_importance()
    want = head_importance(vitviz.load(tiny_ckpt, heads=HEADS), window.session.image_list.current)
    np.testing.assert_allclose(imp.drop, want.drop, atol=1e-6)
    assert view.isVisible() and not view.grid.pixmap.isNull()
    scale, x0, y0 = view.grid.placement()
    x, y, size = cell_rect(imp, 0, 1, legend=False)           # layer 0, head 1 (the view draws no legend)
    pos = QPointF(x0 + scale * (x + size / 2), y0 + scale * (y + size / 2))
    click = QMouseEvent(QMouseEvent.Type.MouseButtonPress, pos, view.grid.mapToGlobal(pos), Qt.MouseButton.LeftButton,
                        Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    view.grid.mousePressEvent(click)
    assert iv.heads == [(0, 1)]
    _answered(qtbot, window)
    assert view.grid.cell_at(QPointF(x0 + scale * (x - 2), pos.y())) != (0, 1)
    view.close_grid()
    assert not view.isVisible()
    iv.clear_heads()
    assert iv.steps == []


def test_a_model_without_the_hook_points_greys_the_entries_out(qtbot, loaded) -> None:  # noqa: ANN001
    from vitviz.core.protocol import WINDOWS
    from vitviz.core.protocol import WINDOWED_REFUSAL

    window = loaded
    iv = window.interventions
    window.session.model.capabilities = frozenset({WINDOWS})
    assert not iv.available and iv.why_not == WINDOWED_REFUSAL
    menu = iv.menu(window, 0, 0)
    for text in ("Ablate layer 0", "Patch L0.H0", "Patch block 0", "Importance"):
        action = _action(menu, text)
        assert not action.isEnabled() and WINDOWED_REFUSAL in action.toolTip()
    dock = window.dock("interventionsDock")
    dock.show()                           # a hidden panel is filled when shown (it redraws what is on show only)
    panel = dock.widget()
    qtbot.waitUntil(panel.isVisible)
    assert WINDOWED_REFUSAL in panel.heads_label.text() and not panel.scan_button.isEnabled()
    iv.toggle(0, 0)                       # what a stray call does: nothing runs
    wait_idle(qtbot, window)
    assert iv.current() is None and window.session.intervened == {}
    iv.clear_heads()


def test_probabilities_of_a_headless_model_are_none() -> None:
    from vitviz.gui.interventions import probabilities

    assert probabilities(np.zeros(0, np.float32)) is None
    np.testing.assert_allclose(probabilities(np.array([0.0, np.log(3.0)])), [0.25, 0.75])


def test_export_writes_the_intervened_run(qtbot, loaded, tiny_ckpt, tmp_path) -> None:  # noqa: ANN001
    """File › Export while a head is ablated writes the run on show: the .npz holds the intervened attention and
    logits with 'interventions' naming what was done (as `vitviz export --ablate`), the labelled PNG's colorbar
    title starts with it; after Back to clean the same exports are the clean run's."""
    import vitviz
    from vitviz.core import files
    from vitviz.core.running.interventions import Ablate
    from vitviz.gui import exporting
    from vitviz.gui.state import map_kind

    window = loaded
    iv, s, actions = window.interventions, window.session, window.file_actions
    window.state.update(layer=1)
    clean_png = exporting.render_view(s.image_list.current_maps, window.state, label=True)
    iv.toggle(0, 1)
    _answered(qtbot, window)
    model = vitviz.load(tiny_ckpt, heads=HEADS)
    want = model.run(s.image_list.current, intervene=Ablate([(0, 1)]))
    saved = files.read_npz(actions.export_npz_to(tmp_path / "run.npz"))
    assert saved["interventions"] == ["ablate L0.H1 (zero)"]
    np.testing.assert_allclose(saved["attentions"], want.attentions, atol=1e-6)
    np.testing.assert_allclose(saved["logits"], want.logits, atol=1e-5)
    png = actions.export_png_to(tmp_path / "view.png", label=True)
    assert png is not None and png.exists()
    stack = s.image_list.current_maps.stack_or_pending(map_kind(window.state))
    assert stack.title.startswith("ablated L0.H1 · ")
    assert not np.array_equal(exporting.render_view(s.image_list.current_maps, window.state, label=True), clean_png)
    iv.clear_heads()
    saved = files.read_npz(actions.export_npz_to(tmp_path / "clean.npz"))
    assert "interventions" not in saved
    np.testing.assert_allclose(saved["attentions"], model.run(s.image_list.current).attentions, atol=1e-6)


def test_mean_and_resample_ablation_from_the_menu(qtbot, loaded, tiny_ckpt, images) -> None:  # noqa: ANN001
    """The tile menu's mean ablation (over the list's images) and resampling (from another image of the list) run
    the library's `Ablate(..., 'mean' / 'resample')`; with one image left the mean is greyed out, saying why."""
    import vitviz
    from vitviz.core.running.interventions import Ablate

    window = loaded
    iv, s = window.interventions, window.session
    model = vitviz.load(tiny_ckpt, heads=HEADS)
    paths = [str(p) for p in images]
    menu = iv.menu(window, 1, 0)
    mean = _action(menu, "Ablate L1.H0 to its mean")
    assert mean.isEnabled() and "3 images" in mean.text()
    mean.trigger()
    menu.close()
    _answered(qtbot, window)
    want = model.run(s.image_list.current, intervene=Ablate([(1, 0)], "mean", reference=paths))
    assert s.image_list.current_maps.result.interventions == ("ablate L1.H0 (mean over 3 images)",)
    np.testing.assert_allclose(s.image_list.current_maps.result.logits, want.logits, atol=1e-5)
    clean = model.run(s.image_list.current)
    assert not np.allclose(want.logits, clean.logits, atol=1e-4)
    assert s.image_list.current_maps.title == "ablated L1.H0 (mean)" and iv.heads == [(1, 0)]
    # resampled from another image of the list: replaces the mean ablation of that head
    other = next(p for p in paths if p != s.image_list.current)
    menu = iv.menu(window, 1, 0)
    assert _action(menu, "Restore layer 1, head 0")
    sub = _action(menu, "Ablate L1.H0 resampled from").menu()
    next(a for a in sub.actions() if a.text() == Path(other).name).trigger()
    menu.close()
    _answered(qtbot, window)
    want = model.run(s.image_list.current, intervene=Ablate([(1, 0)], "resample", reference=other))
    assert s.image_list.current_maps.result.interventions == (f"ablate L1.H0 (resampled from {Path(other).name})",)
    np.testing.assert_allclose(s.image_list.current_maps.result.attentions, want.attentions, atol=1e-6)
    np.testing.assert_allclose(s.image_list.current_maps.result.logits, want.logits, atol=1e-5)
    assert len(iv.steps) == 1
    iv.clear_heads()
    # one image left: no mean, and no image to resample from
    s.remove_images(paths[1:])
    wait_idle(qtbot, window)
    menu = iv.menu(window, 1, 0)
    mean = _action(menu, "Ablate L1.H0 to its mean")
    assert not mean.isEnabled() and "at least 2" in mean.toolTip() and "has 1" in mean.toolTip()
    assert not _action(menu, "Ablate L1.H0 resampled from").isEnabled()
    menu.close()


def test_a_pass_failed_under_an_intervention_is_not_the_clean_runs(qtbot, loaded, monkeypatch) -> None:  # noqa: ANN001
    """A pass that failed for the intervened run is not asked again there, but the clean run (and another
    intervention) still asks for its own."""
    from vitviz.gui.interventions import Under

    window = loaded
    iv, s = window.interventions, window.session
    path, store = s.image_list.current, s.relevance_pass
    clean = s.cached(path)
    assert clean.relevance(2) is None

    def broken(self, ctx):  # noqa: ANN001, ANN202
        raise RuntimeError("broken under the intervention")

    monkeypatch.setattr(Under, "__call__", broken)
    iv.toggle(0, 1)
    _answered(qtbot, window)
    store.request(path, 2)
    qtbot.waitUntil(lambda: store.why(path, 2) is not None, timeout=20000)
    assert "broken under the intervention" in store.why(path, 2)
    assert not store.request(path, 2)             # not asked again for this run
    monkeypatch.undo()
    iv.clear_heads()                              # the clean run: its pass has not failed
    assert s.image_list.current_maps is clean and store.why(path, 2) is None
    assert store.request(path, 2)
    qtbot.waitUntil(lambda: clean.relevance(2) is not None, timeout=20000)
    iv.toggle(1, 0)                               # another intervention: asked again, under it
    _answered(qtbot, window)
    assert store.why(path, 2) is None and store.request(path, 2)
    qtbot.waitUntil(lambda: s.image_list.current_maps.relevance(2) is not None, timeout=20000)


def test_a_late_pca_fit_of_the_clean_run_is_not_shown(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    """The feature PCA fitted on the clean run's features (one still on its way when a head was ablated answers
    after the intervened run is shown) does not colour the intervened run: the panel fits its own features."""
    import vitviz
    from _gui import show_dock

    from vitviz.core.analyses.features import capture_features, feature_pca
    from vitviz.core.running.interventions import Ablate

    window = loaded
    s, panel = window.session, window.features
    with qtbot.waitSignal(panel.shown, timeout=30000, check_params_cb=lambda view: view == "pca"):
        show_dock(qtbot, window, "featuresDock")
    clean_fit, path = panel._pca, s.image_list.current
    model = vitviz.load(tiny_ckpt, heads=HEADS)
    with model.intervening(Ablate([(0, 1)])):
        want = feature_pca(capture_features(model, path), panel.layer).colors[0]
    assert not np.allclose(want, clean_fit.pca.colors[0], atol=1e-3)

    def intervened_fit_shown() -> bool:
        return window.is_idle() and panel._pca is not clean_fit and panel.pca_colors is not None and \
            np.allclose(panel.pca_colors, want, atol=1e-4)

    window.interventions.toggle(0, 1)
    _answered(qtbot, window)
    qtbot.waitUntil(intervened_fit_shown, timeout=20000)
    s.analyses.pca_ready.emit(clean_fit)        # the clean run's fit, late
    qtbot.waitUntil(intervened_fit_shown, timeout=20000)


@pytest.mark.parametrize("tab, held, signal", [("similarity", "_sim", "similarity_ready"),
                                                ("norms", "_share", "share_ready")])
def test_a_late_analysis_of_the_clean_run_is_not_shown(qtbot, loaded, tab: str, held: str,  # noqa: ANN001
                                                        signal: str) -> None:
    """As the PCA: the patch similarity and the high-norm share made of the clean run, answering after a head was
    ablated, are not drawn for the intervened run; the panel asks for the intervened run's own."""
    from _gui import show_dock

    window = loaded
    s, panel = window.session, window.features
    show_dock(qtbot, window, "featuresDock")
    panel.show_tab(tab)
    qtbot.waitUntil(lambda: window.is_idle() and getattr(panel, held) is not None, timeout=20000)
    clean = getattr(panel, held)
    window.interventions.toggle(0, 1)
    _answered(qtbot, window)
    qtbot.waitUntil(lambda: window.is_idle() and getattr(panel, held) not in (None, clean), timeout=20000)
    getattr(s.analyses, signal).emit(clean)       # the clean run's, late
    qtbot.waitUntil(lambda: window.is_idle() and getattr(panel, held) not in (None, clean), timeout=20000)
