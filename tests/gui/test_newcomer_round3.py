"""The window as a newcomer meets it (issue 25): what gets lost or left empty."""
from __future__ import annotations

import os
from pathlib import Path

from _gui import wait_idle

from vitviz.gui import bundled
from vitviz.gui import settings as st


def test_recent_models_are_absolute_paths_and_names_stay_names(settings, tmp_path: Path,  # noqa: ANN001
                                                                monkeypatch) -> None:  # noqa: ANN001
    """Chosen from the recent list after starting vitviz from another folder, a model still opens: files are
    remembered by their absolute path, named models by their name."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "vit.pth").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    st.add_recent_model(settings, "runs/vit.pth")
    st.add_recent_model(settings, "hf:google/vit-base-patch16-224")
    recent = st.recent_models(settings)
    assert recent == ["hf:google/vit-base-patch16-224", str(tmp_path / "runs" / "vit.pth")]
    monkeypatch.chdir(os.sep)
    assert Path(recent[1]).is_file()
    st.add_recent_model(settings, str(tmp_path / "runs" / "vit.pth"))   # the same file: once, first
    assert st.recent_models(settings) == [str(tmp_path / "runs" / "vit.pth"), "hf:google/vit-base-patch16-224"]


def test_a_bad_first_model_opens_the_demo_instead_and_says_so(qtbot, window, tmp_path: Path) -> None:  # noqa: ANN001
    """A bad --model at start-up leaves no empty window behind a box saying 'everything already loaded is still
    available': the demo model opens instead, and the box says that."""
    if bundled.demo_model() is None:
        import pytest

        pytest.skip("this install has no demo model")
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"not a checkpoint at all")
    window.demo_fallback = True            # as run_app sets it (not under --screenshot)
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.load_model(str(bad))
    wait_idle(qtbot, window)
    assert bundled.is_demo(window.session.model_path)
    box = window.reporter.box
    assert box is not None and "broken.pth" in box.text()
    assert "demo model is open instead" in box.informativeText()
    assert "still available" not in box.informativeText()


def test_a_bad_model_after_a_good_one_keeps_it(qtbot, loaded, tmp_path: Path) -> None:  # noqa: ANN001
    """With a model open, a failed load changes nothing: the box says so, no demo replaces the model."""
    window = loaded
    window.demo_fallback = True
    before = window.session.model_path
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"nope")
    window.load_model(str(bad))
    qtbot.waitUntil(lambda: window.reporter.box is not None and window.reporter.box.isVisible(), timeout=20000)
    wait_idle(qtbot, window)
    assert window.session.model_path == before
    assert "still available" in window.reporter.box.informativeText()


def test_method_and_class_are_off_where_the_map_does_not_use_them(loaded) -> None:  # noqa: ANN001
    """Method and Class do nothing for CLS attention or rollout: they are off there, saying how to use them, and on
    for a class-relevance map."""
    window = loaded
    picker = window.controls.relevance_picker
    for source in ("cls", "rollout"):
        window.state.update(source=source)
        assert not picker.method_combo.isEnabled() and not picker.class_combo.isEnabled()
        assert "Class relevance" in picker.method_combo.toolTip()
    window.state.update(source="relevance")
    assert picker.method_combo.isEnabled() and picker.class_combo.isEnabled()
    window.state.update(source="cls")
    assert not picker.class_combo.isEnabled()


def test_the_hover_readout_follows_the_map_under_a_still_mouse(loaded) -> None:  # noqa: ANN001
    """Clicking a patch (a query map) or going back to CLS attention redraws the map under a mouse that did not
    move: the readout shows the new map's value, not the previous one's."""
    window = loaded
    panel = window.panel
    panel._on_mouse_moved(panel.image_item.mapToScene(panel.image_item.boundingRect().center()))
    row, col = panel.hovered_patch
    assert row >= 0
    before = window.hover_label.text()
    window.state.update(source="token", query=window.session.spec.num_prefix)   # another map, the mouse still
    after = window.hover_label.text()
    assert f"{panel.values[row, col]:.4g}" in after and after != before
