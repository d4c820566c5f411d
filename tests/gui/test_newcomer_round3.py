"""The window as a newcomer meets it (issue 25): what gets lost or left empty."""
from __future__ import annotations

import os
from pathlib import Path

from _gui import wait_idle

from vitviz.gui import bundled
from vitviz.gui import settings as st
from vitviz.gui.numbers import number


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
    assert number(panel.values[row, col]) in after and after != before


def test_what_the_window_was_told_is_used_by_the_command_line(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                              capsys) -> None:  # noqa: ANN001
    """One store of answers: a head count and norm order remembered in the window ("remember for this file") are
    what `vitviz info` and `vitviz export` use for that file, said on stderr; a flag still wins."""
    import json

    from vitviz.catalog import answers
    from vitviz.cli import main

    st.remember_settings(window.settings, str(tiny_ckpt), {"heads": 4, "block_norm": "post"})
    assert answers.answers_for(str(tiny_ckpt)) == {"heads": 4, "block_norm": "post"}
    assert st.remembered_settings(window.settings, str(tiny_ckpt)) == {"heads": 4, "block_norm": "post"}
    assert main(["info", str(tiny_ckpt), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["num_heads"] == 4 and data["block_norm"] == "post"
    assert "using what you told the window" in captured.err and "heads 4" in captured.err
    assert main(["info", str(tiny_ckpt), "--json", "--heads", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["num_heads"] == 2
    with qtbot.waitSignal(window.session.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt))                  # the window reads the same store
    assert window.session.spec.num_heads == 4 and window.session.spec.block_norm == "post"


def test_old_remembered_answers_move_into_the_shared_store(settings, tiny_ckpt) -> None:  # noqa: ANN001
    """What earlier versions kept in the window's own settings is still read, and moves to the store (where the
    command line finds it) on the next answer."""
    import json

    from vitviz.catalog import answers

    settings.setValue(st.LEGACY_HEADS_KEY, json.dumps({str(tiny_ckpt): 2}))
    assert st.remembered_settings(settings, str(tiny_ckpt)) == {"heads": 2}
    st.remember_settings(settings, str(tiny_ckpt), {"act": "relu"})
    assert answers.answers_for(str(tiny_ckpt)) == {"heads": 2, "act": "relu"}
    assert settings.value(st.LEGACY_HEADS_KEY) is None


def test_a_windowed_model_opens_after_a_plain_vit_and_back(qtbot, loaded, tiny_ckpt, tmp_path: Path) -> None:  # noqa: ANN001
    """A Swin file opens in the window after a plain ViT (it used to be refused): no error, the view moves to the
    windowed maps (CLS attention has no meaning there) and back to CLS when a plain ViT opens again."""
    import warnings

    import timm
    import torch
    from timm.models import save_for_hf

    window = loaded
    assert window.state.source == "cls"
    kw = dict(img_size=64, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, num_classes=5)
    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kw)
    folder = tmp_path / "swin"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(model, str(folder), safe_serialization=True, model_args=kw)
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.load_model(str(folder))
    wait_idle(qtbot, window)
    assert window.reporter.box is None or not window.reporter.box.isVisible()
    assert window.session.spec.family == "timm-swin" and window.state.source == "received"
    # the ViT was shown at its last layer (1): the Swin opens at its last block (stage 1's second, block 3)
    assert window.state.layer == 3 and "stage 1 · block 1 (block 3" in window.panel.title.text
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.load_model(str(tiny_ckpt), heads=2)
    wait_idle(qtbot, window)
    assert window.state.source == "cls" and window.controls.layer_label.text() == "Layer"
    assert window.reporter.box is None or not window.reporter.box.isVisible()


def test_after_a_bad_first_model_the_demo_runs_on_its_own_images(qtbot, window, tmp_path: Path) -> None:  # noqa: ANN001
    """Round five: `vitviz --model broken.pth` added the sample photographs at once; the load failed, the demo
    opened instead and ran on them ('92.5 % circle' for the astronaut). The bundled images now wait for a model
    that loaded, so the demo gets its shapes."""
    from vitviz.demo import demo_images

    if bundled.demo_model() is None:
        import pytest

        pytest.skip("this install has no demo model")
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"not a checkpoint at all")
    window.demo_fallback = True
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.load_model(str(bad))
        window.add_bundled_images_after_load()          # what `vitviz --model broken.pth` does (gui/app.py)
    wait_idle(qtbot, window)
    assert bundled.is_demo(window.session.model_path)
    assert sorted(window.session.images) == sorted(str(p) for p in demo_images())


def test_a_one_channel_model_gets_no_photographs(qtbot, window, tmp_path: Path) -> None:  # noqa: ANN001
    """A 1-channel (MNIST-like) model opened without images got the RGB sample photographs; it gets none now, and
    the status bar asks for its own images."""
    from _gui import HEADS
    from _tiny import write_tiny_checkpoint

    mnist = write_tiny_checkpoint(tmp_path / "mnist_vit.pth", in_chans=1)
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.load_model(str(mnist), heads=HEADS)
        window.add_bundled_images_after_load()
    wait_idle(qtbot, window)
    assert window.session.images == [] or list(window.session.images) == []
    assert any("1-channel images" in n and "Open images" in n for n in window.notes)
    photo = tmp_path / "three.pth"
    write_tiny_checkpoint(photo)
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.choose_model(str(photo))                 # a 3-channel model from the menu: the photographs
    qtbot.waitUntil(lambda: len(window.session.images) > 0, timeout=10000)
    assert all(not Path(p).name.startswith("shapes_") for p in window.session.images)
