"""Error dialogs keep the window working; exports read back with the map really in the pixels."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _gui import HEADS, wait_idle
from PIL import Image

from vitviz.core import files
from vitviz.core.drawing import render
from vitviz.gui.state import current_map


def test_bad_checkpoint_shows_dialog_and_keeps_model(qtbot, loaded, images, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    spec_before = w.session.model.spec
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"this is not a checkpoint at all")
    w.load_model(str(bad))
    qtbot.waitUntil(lambda: w.reporter.box is not None and w.reporter.box.isVisible())
    assert w.reporter.box.windowTitle() == "Could not load model"
    assert "broken.pth" in w.reporter.box.text()
    assert "Traceback" in w.reporter.box.detailedText()
    assert w.session.model.spec is spec_before                       # the old model is intact ...
    assert w.session.result(str(images[0])) is not None        # ... and so are the results
    w.reporter.box.close()
    w.images.step(1)
    assert w.panel.values is not None and w.panel.values.shape == (4, 4)
    new = images[0].parent / "later.png"
    Image.new("RGB", (40, 40), "red").save(new)
    w.session.add_images([str(new)])                                    # the worker still runs images
    wait_idle(qtbot, w)
    assert w.session.result(str(new)) is not None


def test_bad_image_shows_dialog_and_others_still_work(qtbot, loaded, images, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    bad = tmp_path / "bad.png"
    bad.write_text("not a png")
    w.session.add_images([str(bad)])
    qtbot.waitUntil(lambda: w.reporter.box is not None and w.reporter.box.isVisible())
    assert w.reporter.box.windowTitle() == "Could not run image"
    assert "bad.png" in w.reporter.box.text()
    entry = w.images.top_text(str(bad))
    assert entry.startswith("bad.png\nfailed: not a recognised image format")   # the path not repeated
    assert str(tmp_path) not in entry and entry.endswith("…") and " PN…" not in entry   # cut between words
    w.images.select(str(bad))
    assert w.panel.title.text.startswith("bad.png: not a recognised image format") and w.panel.values is None
    assert w.panel.title.text.count("bad.png") == 1
    w.images.select(str(images[2]))
    assert w.panel.values is not None


def test_second_error_joins_open_dialog(qtbot, loaded, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    for name in ("a.png", "b.png"):
        (tmp_path / name).write_text("nope")
    w.session.add_images([str(tmp_path / "a.png"), str(tmp_path / "b.png")])
    wait_idle(qtbot, w)
    assert len(w.reporter.errors) == 2
    assert w.reporter.box.text().startswith("2 errors")


def _expected_overlay(w, maps) -> np.ndarray:  # noqa: ANN001
    values, stack = current_map(maps, w.state)
    lo, hi = 0.0, stack.scale_max(stack.column(w.state.head))
    base = render.native_view(maps.result)
    heat = render.heatmap_image(values, base.shape[:2], w.state.colormap, w.state.smooth, lo, hi)
    return render.overlay(base, heat, w.state.opacity)


def test_export_png_overlay_and_heatmap(loaded, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    maps = w.session.result(w.session.image_list.current)
    path = w.file_actions.export_png_to(tmp_path / "view.png", heatmap_only=False, colorbar=False)
    out = np.asarray(Image.open(path))
    h, w_ = render.native_view(maps.result).shape[:2]           # the original image's resolution,
    assert out.shape == (h, w_, 3) and h > 32                   # not the model input's (32) nor the screen's
    np.testing.assert_array_equal(out, _expected_overlay(w, maps))
    heat = np.asarray(Image.open(w.file_actions.export_png_to(tmp_path / "heat.png", heatmap_only=True, colorbar=True)))
    k = render.enlargement((h, w_))                             # with a colorbar a 44-px image is drawn ×5
    assert k == 5 and heat.shape[0] == k * h and heat.shape[1] > k * w_     # colorbar appended on the right
    h, w_ = k * h, k * w_
    values, stack = current_map(maps, w.state)
    top = np.unravel_index(np.argmax(values), values.shape)     # the hottest patch is the brightest colour
    py, px = ((np.array(top) + 0.5) * np.array([h, w_]) / np.array(values.shape)).astype(int)
    hi = stack.scale_max(stack.column("mean"))
    assert np.array_equal(heat[py, px], render.heatmap_image(values, (h, w_), "viridis", True, 0, hi)[py, px])


def test_export_never_overwrites_silently(loaded, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    target = tmp_path / "view.png"
    target.write_bytes(b"keep me")
    assert w.file_actions.export_png_to(target) is None
    assert target.read_bytes() == b"keep me"
    assert w.reporter.box is not None and "exists" in w.reporter.box.text()


def test_export_all_maps(loaded, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    w = loaded
    w.state.update(head=0, layer=0)
    written = w.file_actions.export_all_to(tmp_path, heatmap_only=True, colorbar=False)
    assert len(written) == 2 * (HEADS + 2)
    names = sorted(p.name for p in written)
    assert "img0_cls_L0_H0.png" in names and "img0_cls_L1_Hmean.png" in names and "img0_cls_L1_Hmax.png" in names
    maps = w.session.result(w.session.image_list.current)
    stack = maps.stack("cls")
    got = np.asarray(Image.open(tmp_path / "img0_cls_L1_H1.png"))
    size = render.native_view(maps.result).shape[:2]
    want = render.heatmap_image(stack.select(1, 1), size, "viridis", True, 0.0, stack.scale_max(1))
    np.testing.assert_array_equal(got, want)
    asked: list = []
    monkeypatch.setattr("vitviz.gui.dialogs.confirm_overwrite", lambda _w, paths: asked.append(paths) or False)
    assert w.file_actions.export_all_to(tmp_path) == []                      # existing files: the user said no
    assert len(asked[0]) == len(written)


def test_export_npz(loaded, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    path = w.file_actions.export_npz_to(tmp_path / "arrays")
    assert path.suffix == ".npz"
    data = files.read_npz(path)
    result = w.session.result(w.session.image_list.current).result
    np.testing.assert_array_equal(data["attentions"], result.attentions)
    assert data["spec"]["num_heads"] == HEADS and data["attentions"].shape == (2, HEADS, 17, 17)


def test_export_without_result_explains(window, tmp_path) -> None:  # noqa: ANN001
    assert window.file_actions.export_png_to(tmp_path / "x.png") is None
    assert window.reporter.box.windowTitle() == "Nothing to export"


@pytest.mark.parametrize("case", ["good", "missing_model", "bad_image"])
def test_screenshot_cli(tiny_ckpt, images, tmp_path, case) -> None:  # noqa: ANN001
    """Exit status 0 with the PNG written (an input size that is not whole patches is noted, not an error); 2 for
    a model that cannot be loaded, as `vitviz info` and `vitviz export`; 1 for other errors."""
    import os
    import subprocess
    import sys

    shot = tmp_path / "shot.png"
    model = str(tmp_path / "missing.pth") if case == "missing_model" else str(tiny_ckpt)
    paths = [*map(str, images)]
    if case == "bad_image":
        (tmp_path / "broken.png").write_bytes(b"not a png")
        paths = [str(tmp_path / "broken.png")]
    code = ("import argparse, sys; from vitviz.cli.window import add_window_arguments, run_window; "
            "p = argparse.ArgumentParser(); add_window_arguments(p); sys.exit(run_window(p.parse_args()))")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    proc = subprocess.run([sys.executable, "-c", code, *paths, "--model", model, "--heads", "2",
                           "--layer", "0", "--head", "1", "--map", "cls", "--size", "36x40", "--screenshot", str(shot)],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                          timeout=120)
    if case == "good":
        assert proc.returncode == 0, proc.stderr
        assert Image.open(shot).size[0] >= 800
        assert "note: Input size 36×40 is not a multiple of the 8 px patch; using 32×40" in proc.stderr
        assert "propagateSizeHints" not in proc.stderr     # the offscreen plugin's note says nothing to the user
        return
    assert not shot.exists()
    if case == "missing_model":
        assert proc.returncode == 2 and "missing.pth" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 1 and "broken.png" in proc.stderr, proc.stderr


@pytest.mark.parametrize("flags,needle", [(["--layer", "9"], "--layer 9 is out of range: the model has 2 layers"),
                                          (["--head", "5"], "--head 5 is out of range: the model has 2 heads"),
                                          (["--map", "token:999"], "--map token:999 is out of range")])
def test_command_line_selection_out_of_range(qtbot, window, tiny_ckpt, images, flags, needle) -> None:  # noqa: ANN001
    import argparse

    from vitviz.cli.window import add_window_arguments
    from vitviz.gui.app import apply_args

    p = argparse.ArgumentParser()
    add_window_arguments(p)
    args = p.parse_args([str(images[0]), "--model", str(tiny_ckpt), "--heads", "2", *flags])
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        apply_args(window, args)
    assert any(needle in summary for _, summary in window.reporter.errors), window.reporter.errors
    wait_idle(qtbot, window)
    assert window.session.result(str(images[0])) is not None          # the window still works


def test_nan_maps_are_an_error_box_not_a_picture(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A normalisation that overflows (its load check disabled here) gives NaN attention: the window says so,
    naming the setting, and keeps running."""
    from _gui import HEADS, wait_idle

    from vitviz.core.reading import validate
    monkeypatch.setattr(validate, "normalized_reach", lambda _m, _s: 0.0)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS, std=(1e-30,))
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: bool(window.reporter.errors), timeout=20000)
    text = " ".join(summary for _title, summary in window.reporter.errors)
    assert "NaN or infinite attention" in text and "std (1e-30,)" in text
    window.reporter.box.close()
    window.load_model(str(tiny_ckpt), heads=HEADS)        # the window still works
    wait_idle(qtbot, window)


def test_the_same_run_error_is_shown_once(qtbot, window) -> None:  # noqa: ANN001
    for i, free in enumerate(("21.4", "21.0", "20.9")):
        window.reporter.show_run_error(f"/x/img{i}.png", f"the attention maps of input (1, 3, 4000, 4000) need 2794.0 GiB "
                              f"(float32) but only {free} GiB of memory is available", "")
    window.reporter.show_run_error("/x/bad.png", "/x/bad.png: not a recognised image format", "")
    assert len(window.reporter.errors) == 2, window.reporter.errors
    assert window.reporter.errors[0][1].startswith("/x/img0.png: the attention maps")
    assert window.reporter.errors[0][1].endswith("(and the same for 2 more images)")
    assert window.reporter.errors[1][1] == "/x/bad.png: not a recognised image format"      # its path once


def test_a_repeated_run_error_leaves_an_unrelated_error_box_alone(qtbot, window) -> None:  # noqa: ANN001
    """A failure like one whose box was closed is a new error, not a rewrite of the box open now."""
    reason = "the attention maps need 2794.0 GiB (float32) but only 21.4 GiB of memory is available"
    window.reporter.show_run_error("/x/a.png", reason, "")
    qtbot.waitUntil(lambda: window.reporter.box is not None and window.reporter.box.isVisible())
    window.reporter.box.close()
    qtbot.waitUntil(lambda: window.reporter.box is None or not window.reporter.box.isVisible())
    window.reporter.show("Could not load model", "/x/broken.pth: not a checkpoint", "Traceback")
    box = window.reporter.box
    qtbot.waitUntil(lambda: box.isVisible())
    window.reporter.show_run_error("/x/b.png", reason, "")
    assert box.text() != "/x/a.png: " + reason + " (and the same for 1 more image)"
    assert box.text() == "2 errors; the latest: /x/b.png: " + reason
    assert box.detailedText().startswith("Traceback") and "the same for /x/b.png" not in box.detailedText()
    assert window.reporter.errors == [("Could not run image", "/x/a.png: " + reason),
                             ("Could not load model", "/x/broken.pth: not a checkpoint"),
                             ("Could not run image", "/x/b.png: " + reason)]
    window.reporter.show_run_error("/x/c.png", reason, "")                # joins the error of b.png, which the box holds
    assert window.reporter.errors[2][1] == "/x/b.png: " + reason + " (and the same for 1 more image)"
    assert box.text() == "2 errors; the latest: /x/b.png: " + reason and box.detailedText().endswith(
        "=== the same for /x/c.png")
