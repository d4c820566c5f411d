"""The window's class relevance source and Features dock show the library's output, computed in the worker.

- The worker answers RELEVANCE, FEATURES, PCA, SIMILARITY and SHARE with their frozen dataclasses, holding what
  `vitviz.core.analyses.relevance` / `vitviz.core.analyses.features` give.
- The 'Class relevance' map source draws `class_relevance(...)` of the chosen class (the top class by default, a
  click in the Model info's top-5, any label from the picker) through the image panel and its colorbar.
- The Features dock's PCA (this image, and all open images fitted together), patch similarity (this image and a
  second one) and token norms with the attention share equal the library's.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from _gui import HEADS, show_dock, wait_idle

from vitviz.gui.protocol import (Compared, Explained, Featured, Features, Load, Pca, PcaFitted, Relevance, Request,
                                 Share, Shared, Similarity)
from vitviz.gui.worker import InferenceWorker


@pytest.fixture(scope="module")
def model(tiny_ckpt: Path):  # noqa: ANN201
    import vitviz

    return vitviz.load(tiny_ckpt, heads=HEADS, device="cpu")


def _frozen(answer: object) -> bool:
    return dataclasses.is_dataclass(answer) and type(answer).__dataclass_params__.frozen


def test_the_worker_answers_the_new_kinds_with_their_dataclasses(qtbot, tiny_ckpt, images, model) -> None:  # noqa: ANN001
    from vitviz.core.analyses.features import (PatchSimilarity, attention_share, capture_features, feature_pca,
                                      high_norm_mask, norm_histogram, token_norms)
    from vitviz.core.analyses.relevance import class_relevance

    worker = InferenceWorker()
    answers: list[object] = []
    worker.finished.connect(lambda _id, answer: answers.append(answer))
    worker.failed.connect(lambda _id, summary, _details: answers.append(summary))

    def ask(kind: type[Request], **args: object) -> object:
        request = kind.make(**args)
        request.id = len(answers) + 1
        worker.handle(request)
        answer = answers.pop()
        assert isinstance(answer, kind.answer) and _frozen(answer), answer
        return answer

    ask(Load, path=str(tiny_ckpt), device=None, heads=HEADS)
    a, b = str(images[0]), str(images[1])
    explained = ask(Relevance, image=a, image_size=None, target=3)
    assert isinstance(explained, Explained) and explained.target == 3 and explained.relevance.target == 3
    np.testing.assert_array_equal(explained.relevance.chefer, class_relevance(model, a, 3).chefer)
    top = ask(Relevance, image=a, image_size=None, target=None)
    assert top.target is None and top.relevance.target == int(np.argmax(model.run(a).logits))
    fa, fb = (ask(Features, image=p, image_size=None) for p in (a, b))
    assert isinstance(fa, Featured) and fa.features.raw.shape[0] == 2
    np.testing.assert_array_equal(fa.norms, token_norms(capture_features(model, a)))
    counts, edges = norm_histogram(fa.norms, bins=len(fa.counts[0]))
    np.testing.assert_array_equal(fa.counts, counts)
    np.testing.assert_array_equal(fa.edges, edges)
    fitted = ask(Pca, features=[fa.features, fb.features], sources=(a, b), layer=1)
    assert isinstance(fitted, PcaFitted) and fitted.sources == (a, b) and fitted.layer == 1
    library = feature_pca([capture_features(model, a), capture_features(model, b)], 1)
    for ours, theirs in zip(fitted.pca.colors, library.colors):
        np.testing.assert_array_equal(ours, theirs)
    compared = ask(Similarity, a=fa.features, b=fb.features, sources=(a, b), layer=0)
    assert isinstance(compared, Compared) and compared.sources == (a, b)
    expect = PatchSimilarity.from_stacks(fa.features, fb.features, 0).maps(1, 2)
    for ours, theirs in zip(compared.similarity.maps(1, 2), expect):
        np.testing.assert_array_equal(ours, theirs)
    result = model.run(a)
    shared = ask(Share, image=a, result=result, norms=fa.norms, layer=1, threshold=float(fa.norms[1].mean()))
    assert isinstance(shared, Shared)
    mask = high_norm_mask(fa.norms[1], float(fa.norms[1].mean()))
    np.testing.assert_array_equal(shared.mask, mask)
    np.testing.assert_array_equal(shared.share, attention_share(result, mask))


# ---------------------------------------------------------------------------------------------- relevance


def test_the_relevance_source_shows_the_librarys_map_for_the_chosen_class(qtbot, loaded, images, model) -> None:  # noqa: ANN001
    from vitviz.core.analyses.relevance import class_relevance

    win, path = loaded, str(images[0])
    session, panel = win.session, win.panel
    with qtbot.waitSignal(session.relevance_pass.ready, timeout=20000):
        win.controls.source_combo.setCurrentIndex(win.controls.source_combo.findData("relevance"))
        win.controls.source_combo.activated.emit(win.controls.source_combo.currentIndex())
    top = class_relevance(model, path)
    assert win.state.relevance_class is None
    np.testing.assert_array_equal(panel.values, top.chefer)
    label = model.spec.labels[top.target] if model.spec.labels else f"class {top.target}"
    assert "class relevance (Chefer)" in panel.title.text and f"class {top.target}" in panel.title.text, label
    assert panel.colorbar.isVisible() and panel.overlay_item.isVisible()
    assert not win.controls.layer_spin.isEnabled() and not win.controls.head_spin.isEnabled()

    picker = win.controls.relevance_picker
    with qtbot.waitSignal(session.relevance_pass.ready, timeout=20000):
        picker.class_combo.setCurrentIndex(picker.class_combo.findData(3))
        picker.class_combo.activated.emit(picker.class_combo.currentIndex())
    rel3 = class_relevance(model, path, 3)
    assert win.state.relevance_class == 3
    np.testing.assert_array_equal(panel.values, rel3.chefer)
    win.state.update(relevance_method="gradrollout")            # cached with the class: no new pass
    np.testing.assert_array_equal(panel.values, rel3.grad_rollout)
    win.state.update(relevance_method="attngrad", layer=0, head=1)
    np.testing.assert_array_equal(panel.values, rel3.attn_grad[0, 1])
    lo, hi = panel._levels
    assert lo == -hi < 0                                     # a signed map on a scale symmetric about 0
    assert win.controls.layer_spin.isEnabled() and win.controls.head_spin.isEnabled()

    info = show_dock(qtbot, win, "infoDock")                 # a click in the top-5 of Model info picks the class
    text = info.text()
    assert "Click a class" in text
    with qtbot.waitSignal(session.relevance_pass.ready, timeout=20000):
        info.browser.anchorClicked.emit(__import__("PySide6.QtCore", fromlist=["QUrl"]).QUrl("class:1"))
    assert win.state.source == "relevance" and win.state.relevance_class == 1
    np.testing.assert_array_equal(panel.values, class_relevance(model, path, 1).attn_grad[0, 1])

    with qtbot.waitSignal(session.relevance_pass.ready, timeout=20000):   # another image: its own pass
        session.set_current(str(images[1]))
    np.testing.assert_array_equal(panel.values, class_relevance(model, str(images[1]), 1).attn_grad[0, 1])


def test_a_model_without_classifier_goes_back_to_the_previous_map(qtbot, window, tmp_path, images) -> None:  # noqa: ANN001
    from _tiny import write_tiny_checkpoint

    headless = write_tiny_checkpoint(tmp_path / "headless.pth", num_classes=0)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(headless), heads=HEADS)
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    window.state.update(source="mean")
    assert not window.controls.relevance_picker.isEnabled()
    with qtbot.waitSignal(window.session.relevance_pass.failed, timeout=20000) as blocker:
        window.state.update(source="relevance")
    assert "no classifier" in blocker.args[2]
    qtbot.waitUntil(lambda: window.state.source == "mean", timeout=5000)
    assert window.reporter.errors[-1][0] == "Could not compute the class relevance"
    assert "no classifier" in window.reporter.errors[-1][1]


def test_window_export_of_a_pending_relevance_is_refused(loaded, tmp_path) -> None:  # noqa: ANN001
    """Until its pass has answered, a class's relevance is a placeholder: never written into a file."""
    from vitviz.core.analyses.maps import SelectionError
    from vitviz.gui import exporting

    loaded.session.client.cancel(lambda r: True)
    maps = loaded.session.image_list.current_maps
    loaded.state.update(source="relevance", relevance_class=4)
    with pytest.raises(SelectionError, match="still being computed"):
        exporting.export_png(maps, loaded.state, tmp_path / "x.png")


# ---------------------------------------------------------------------------------------------- features


def _features_panel(qtbot, win):  # noqa: ANN001, ANN202
    return show_dock(qtbot, win, "featuresDock")


def test_the_features_pca_equals_the_librarys(qtbot, loaded, images, model) -> None:  # noqa: ANN001
    from vitviz.core.analyses.features import capture_features, feature_pca

    panel = loaded.features
    with qtbot.waitSignal(panel.shown, timeout=30000, check_params_cb=lambda view: view == "pca"):
        _features_panel(qtbot, loaded)
    path = str(images[0])
    stack = capture_features(model, path)
    np.testing.assert_array_equal(panel.pca_colors, feature_pca(stack, 1).colors[0])
    assert "fitted on this image" in panel.pca_view.title.text
    with qtbot.waitSignal(panel.shown, timeout=30000, check_params_cb=lambda view: view == "pca"):
        panel.layer_spin.setValue(0)
    np.testing.assert_array_equal(panel.pca_colors, feature_pca(stack, 0).colors[0])
    with qtbot.waitSignal(panel.shown, timeout=60000, check_params_cb=lambda view: view == "pca"):
        panel.set_scope("all")                                # all three open images fitted together
    joint = feature_pca([capture_features(model, str(p)) for p in images], 0)
    np.testing.assert_array_equal(panel.pca_colors, joint.colors[0])
    assert "fitted on 3 images together" in panel.pca_view.title.text
    with qtbot.waitSignal(panel.shown, timeout=30000, check_params_cb=lambda view: view == "pca"):
        loaded.session.set_current(str(images[2]))           # the same fit colours the other images
    np.testing.assert_array_equal(panel.pca_colors, joint.colors[2])


def test_the_patch_similarity_equals_the_librarys_on_both_images(qtbot, loaded, images, model) -> None:  # noqa: ANN001
    from _gui import hover, viewport_pos

    from vitviz.core.analyses.features import PatchSimilarity, capture_features

    panel = _features_panel(qtbot, loaded)
    panel.show_tab("similarity")
    assert panel.other_combo.currentData() == str(images[1])     # a second image is chosen beside it
    with qtbot.waitSignal(panel.shown, timeout=30000, check_params_cb=lambda view: view == "similarity"):
        panel.set_other(str(images[2]))
    sim = PatchSimilarity.from_stacks(capture_features(model, str(images[0])), capture_features(model, str(images[2])),
                                      layer=1)
    panel.query_patch("a", 1, 2)
    here, there = panel.similarity
    expect_here, expect_there = sim.maps(1, 2, "a")
    np.testing.assert_array_equal(here, expect_here)
    np.testing.assert_array_equal(there, expect_there)
    panel.query_patch("b", 3, 0)                                   # a patch of the second image
    for ours, theirs in zip(panel.similarity, sim.maps(3, 0, "b")):
        np.testing.assert_array_equal(ours, theirs)
    assert panel.sim_b.colorbar is not None and panel.sim_b.colorbar.isVisible()

    viewport = panel.sim_widget.viewport()                         # the mouse: hover patch (2, 1) of this image
    with qtbot.waitSignal(panel.shown, timeout=5000, check_params_cb=lambda view: view == "similarity"):
        hover(viewport, viewport_pos(panel.sim_widget, panel.sim_a.view, 1.5 * 8, 2.5 * 8))
    for ours, theirs in zip(panel.similarity, sim.maps(2, 1, "a")):
        np.testing.assert_array_equal(ours, theirs)


def test_the_norms_view_outlines_high_norm_tokens_and_their_attention_share(qtbot, loaded, images,  # noqa: ANN001
                                                                           model) -> None:
    from vitviz.core.analyses.features import attention_share, capture_features, high_norm_mask, token_norms

    panel = _features_panel(qtbot, loaded)
    with qtbot.waitSignal(panel.shown, timeout=30000, check_params_cb=lambda view: view == "norms"):
        panel.show_tab("norms")
    norms = token_norms(capture_features(model, str(images[0])))
    result = model.run(str(images[0]))
    threshold = float(np.quantile(norms[1], 0.7))
    with qtbot.waitSignal(panel.shown, timeout=30000, check_params_cb=lambda view: view == "norms"):
        panel.threshold_spin.setValue(threshold)
    used = float(panel.threshold_spin.value())
    mask = high_norm_mask(norms[1], used)
    np.testing.assert_array_equal(panel.share.mask, mask)
    np.testing.assert_array_equal(panel.share.share, attention_share(result, mask))
    np.testing.assert_allclose(panel.threshold_line.value(), used)
    assert not panel.norm_view.marks.path().isEmpty()
    shown = panel.norm_view.overlay.image
    assert shown is not None and panel.norm_view.colorbar.isVisible()
    np.testing.assert_array_equal(loaded.session.image_list.current_maps.norms, norms)


def test_the_features_dock_is_bound_to_the_view_state(qtbot, loaded, images, model) -> None:  # noqa: ANN001
    """The dock's view, layer, scope, second image and threshold are `ViewState` fields: set there, the dock shows
    and draws them; set in the dock, the state holds them (nothing of it lives only in widgets)."""
    from vitviz.core.analyses.features import attention_share, capture_features, high_norm_mask, token_norms

    panel, state = _features_panel(qtbot, loaded), loaded.state
    norms = token_norms(capture_features(model, str(images[0])))
    threshold = float(np.quantile(norms[0], 0.6))
    with qtbot.waitSignal(panel.shown, timeout=30000, check_params_cb=lambda view: view == "norms"):
        state.update(features_view="norms", features_layer=0, norm_threshold=threshold)
    assert panel.tabs.currentIndex() == 2 and panel.layer_spin.value() == 0
    assert abs(panel.threshold_spin.value() - round(threshold, 3)) < 1e-9
    mask = high_norm_mask(norms[0], threshold)
    np.testing.assert_array_equal(panel.share.mask, mask)
    np.testing.assert_array_equal(panel.share.share, attention_share(model.run(str(images[0])), mask))
    panel.layer_spin.setValue(1)
    assert state.features_layer == 1 and panel.layer == 1
    state.update(features_layer=-2)                               # counted from the end, as everywhere
    assert panel.layer == 0 and panel.layer_spin.value() == 0
    panel.tabs.setCurrentIndex(1)
    assert state.features_view == "similarity"
    panel.set_other(str(images[2]))
    assert state.features_other == str(images[2]) and panel.other_combo.currentData() == str(images[2])
    panel.set_scope("all")
    assert state.features_scope == "all" and panel.scope_combo.currentData() == "all"
    with pytest.raises(ValueError):
        state.update(features_view="histogram")


def test_feature_maps_are_asked_for_only_while_the_dock_is_shown(qtbot, loaded, images) -> None:  # noqa: ANN001
    """No feature pass runs for a user who never looks at the Features dock."""
    session = loaded.session
    assert all(session.result(str(p)).features is None for p in images)
    assert not session.client.pending(Features)


def test_the_features_layer_reads_no_layer_before_a_model(qtbot, window, tiny_ckpt) -> None:  # noqa: ANN001
    """Round five: before any model the Features dock read 'Layer 99' (QSpinBox's default range, and the last
    layer asked for): it shows '–', disabled, until a model gives it layers."""
    panel = show_dock(qtbot, window, "featuresDock")
    assert panel.layer_spin.text() == "–" and not panel.layer_spin.isEnabled()
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    assert panel.layer_spin.isEnabled() and panel.layer_spin.maximum() == 1 and panel.layer_spin.text() == "1"
