"""Settings persist between runs, are versioned, and never leak out of the test's temporary folder."""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings

from vitviz.gui import settings as st
from vitviz.gui.window import MainWindow


def _window(qtbot, settings: QSettings) -> MainWindow:  # noqa: ANN001
    win = MainWindow(settings)
    qtbot.addWidget(win)
    win.show()
    return win


def _close(win: MainWindow) -> None:
    win.close()
    win.session.shutdown()


def test_view_and_layout_persist(qtbot, settings) -> None:  # noqa: ANN001
    first = _window(qtbot, settings)
    first.state.update(colormap="magma", opacity=0.3)
    overview = first.findChild(type(first.docks[0]), "overviewDock")
    overview.close()
    _close(first)
    second = _window(qtbot, settings)
    assert (second.state.colormap, second.state.opacity) == ("magma", 0.3)
    assert not second.findChild(type(second.docks[0]), "overviewDock").isVisible()
    second.reset_layout()
    assert all(d.isVisible() for d in second.docks)
    _close(second)


def test_old_version_is_ignored(qtbot, settings) -> None:  # noqa: ANN001
    first = _window(qtbot, settings)
    first.state.update(colormap="gray")
    first.docks[2].close()
    _close(first)
    settings.setValue("version", st.SETTINGS_VERSION + 100)
    second = _window(qtbot, settings)
    assert second.state.colormap == "viridis"
    assert all(d.isVisible() for d in second.docks)
    _close(second)


def test_corrupt_layout_falls_back_to_default(qtbot, settings) -> None:  # noqa: ANN001
    settings.setValue("version", st.SETTINGS_VERSION)
    settings.setValue("window/geometry", QByteArray(b"garbage"))
    settings.setValue("window/state", QByteArray(b"garbage"))
    win = _window(qtbot, settings)
    assert all(d.isVisible() for d in win.docks)
    _close(win)


def test_recent_models(qtbot, loaded, settings, tiny_ckpt) -> None:  # noqa: ANN001
    assert st.recent_models(settings)[0] == str(tiny_ckpt)
    assert loaded.menus.recent.actions()[0].text().endswith(str(tiny_ckpt))


def test_docks_have_stable_names(window) -> None:  # noqa: ANN001
    assert [d.objectName() for d in window.docks] == ["controlsDock", "imagesDock", "overviewDock", "matrixDock",
                                                      "rolloutDock", "posEmbedDock", "headStatsDock", "featuresDock",
                                                      "infoDock"]
    texts = [a.text() for a in window.menus.view.actions()]
    assert "Controls" in texts and "&Reset layout" in texts
    assert {"Attention matrix", "Rollout", "Position embedding", "Head statistics", "Model info"} <= set(texts)


def test_default_settings_are_isolated(isolated_settings) -> None:  # noqa: ANN001
    path = st.open_settings().fileName()
    assert path.startswith(str(isolated_settings))


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
