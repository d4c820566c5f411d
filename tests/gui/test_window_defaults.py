"""Defaults that used to mislead: a query token's map on a scale that shows it (and a colorbar that says which),
the query kept at its place in the image when the model or the input size changes, "Loading model…" while the
first model loads, "1 head", and a model summary and titles that wrap between phrases only."""
from __future__ import annotations

import html

import numpy as np
from _gui import HEADS, load_model, wait_idle

from vitviz.core.analyses.tokens import TokenLayout
from vitviz.core.spec import ModelSpec
from vitviz.gui.panels.base import unbreakable_phrases
from vitviz.gui.panels.controls import model_summary
from vitviz.gui.state import QUERY_SCALE_NOTE


def test_a_clicked_patch_gets_its_own_scale_and_the_colorbar_says_so(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    assert not w.state.normalize and "shared scale" in w.panel.scale_text
    w.panel.clicked.emit(1, 2)                                             # patch (1, 2): token 7
    assert (w.state.source, w.state.query) == ("token", 7)
    assert w.state.normalize and w.controls.normalize_check.isChecked()
    values = w.panel.values
    assert w.panel.colorbar.levels() == (float(values.min()), float(values.max()))   # not the all-layers scale
    assert w.panel.scale_text == "own scale: this map"
    assert "own scale: this map" in w.panel.colorbar.axis.labelText
    assert "own scale" in w.panel.title.text and w.statusBar().currentMessage() == QUERY_SCALE_NOTE
    w.panel.clicked.emit(1, 2)                                             # again: the query is cleared
    assert w.state.source == "cls" and not w.state.normalize and "shared scale" in w.panel.scale_text


def test_the_users_own_scale_choice_is_kept(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    w.panel.clicked.emit(1, 2)
    w.controls.normalize_check.setChecked(False)                           # the user wants the shared scale
    assert w.state.source == "token" and not w.state.normalize
    w.panel.clicked.emit(1, 2)
    assert not w.state.normalize
    w.controls.normalize_check.setChecked(True)                            # and now normalised CLS maps
    w.panel.clicked.emit(0, 0)
    w.panel.clicked.emit(0, 0)
    assert w.state.source == "cls" and w.state.normalize                   # left as the user set it


def test_token_layout_places() -> None:
    old, new = TokenLayout(("cls",), (4, 4)), TokenLayout(("cls", "reg0", "reg1"), (3, 3))
    assert old.place(0) == "cls" and new.token_at("cls") == 0
    assert old.place(7) == (0.375, 0.625) and new.token_at(old.place(7)) == 3 + 1 * 3 + 1
    assert new.token_at("dist") is None and new.describe(2) == "reg1" and new.describe(7) == "patch (1, 1)"


def test_the_query_keeps_its_place_in_the_image_when_another_model_loads(qtbot, loaded, tiny_ckpt_b,  # noqa: ANN001
                                                                        images) -> None:
    w = loaded
    w.panel.clicked.emit(1, 2)                                              # patch (1, 2) of the 4 × 4 grid
    load_model(qtbot, w, tiny_ckpt_b, images)                               # 3 × 3 grid, cls + 2 registers
    assert w.state.query == 3 + 1 * 3 + 1 and w.state.source == "token"   # patch (1, 1): the same place
    assert any("patch (1, 2) is patch (1, 1) (token 7)" in n and "4×4 → 3×3" in n for n in w.notes), w.notes
    assert w.panel.highlight_item.isVisible()


def test_a_prefix_query_follows_by_name_or_is_cleared(qtbot, window, tiny_ckpt, tiny_ckpt_b,  # noqa: ANN001
                                                     images) -> None:
    w = window
    load_model(qtbot, w, tiny_ckpt_b, images[:1])
    w.select_query(0)                                                        # cls
    load_model(qtbot, w, tiny_ckpt, images[:1])
    assert w.state.query == 0
    load_model(qtbot, w, tiny_ckpt_b, images[:1])
    w.select_query(2)                                                        # reg1
    load_model(qtbot, w, tiny_ckpt, images[:1])                              # no registers here
    assert w.state.query is None and w.state.source == "cls"
    assert any("reg1 does not exist" in n and "query cleared" in n for n in w.notes), w.notes


def test_the_query_follows_a_new_input_size(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    w.panel.clicked.emit(3, 3)                                               # the last patch of 4 × 4: token 16
    w.session.set_image_size((64, 64))                                       # 8 × 8 patches
    wait_idle(qtbot, w)
    assert w.state.query == 1 + 7 * 8 + 7                                    # still the bottom-right patch


def test_while_the_first_model_loads_the_panels_say_so(qtbot, window, tiny_ckpt) -> None:  # noqa: ANN001
    w = window
    assert w.panel.title.text.startswith("Open a model")
    assert not w.controls.height_spin.isEnabled() and w.controls.height_spin.text() == "–"
    with qtbot.waitSignal(w.session.model.model_loaded, timeout=30000):
        w.load_model(str(tiny_ckpt), heads=HEADS)
        # the answer cannot arrive before the event loop runs again: this is the state while loading
        assert w.panel.title.text == "Loading model tiny.pth…"
        assert w.controls.model_label.text() == "Loading model tiny.pth…"
        assert w.controls.height_spin.text() == "–" and w.controls.width_spin.text() == "–"
        assert w.info.text().startswith("Loading model tiny.pth")
        assert w.posembed.message.text() == "Loading model tiny.pth…"
        assert w.overview.title.text == "Loading model tiny.pth…"
    assert w.controls.height_spin.isEnabled() and w.controls.height_spin.value() == 32
    assert "Loading" not in w.controls.model_label.text()


def test_a_failed_first_load_says_no_model_again(qtbot, window, tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"not a checkpoint")
    with qtbot.waitSignal(window.session.model.loading_changed, timeout=30000, check_params_cb=lambda on: not on):
        window.load_model(str(bad))
    assert window.panel.title.text.startswith("Open a model")
    assert window.controls.model_label.text().startswith("No model loaded")
    window.reporter.box.close()


def test_one_head_one_layer() -> None:
    spec = ModelSpec(family="timm", source="m.pth", image_size=(32, 32), patch_size=8, embed_dim=8, depth=1,
                     num_heads=1)
    text = html.unescape(model_summary(spec)).replace("\xa0", " ")
    assert "1 layer × 1 head" in text and "heads" not in text and "layers" not in text


def test_the_summary_wraps_between_phrases_only() -> None:
    spec = ModelSpec(family="timm", source="m.pth", image_size=(224, 224), patch_size=14, embed_dim=384, depth=12,
                     num_heads=12, reg_tokens=4)
    text = model_summary(spec)
    assert "12&nbsp;layers&nbsp;×&nbsp;12&nbsp;heads" in text
    assert "prefix&nbsp;tokens:&nbsp;cls,&nbsp;reg0,&nbsp;reg1,&nbsp;reg2,&nbsp;reg3" in text
    title = unbreakable_phrases("img.png — attention of patch (0, 5) (token 10) · layer 11 · head mean · own scale "
                                "0.00335–0.00436")
    phrases = title.split(" · ")
    assert len(phrases) == 4 and all(" " not in p.replace(" — ", "") for p in phrases)


def test_the_image_title_wraps_between_phrases(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    w.panel.clicked.emit(0, 1)
    shown = w.panel.title.item.toHtml()
    assert "layer&nbsp;1" in shown.replace("\xa0", "&nbsp;") or "layer\xa01" in shown
    assert np.isfinite(w.panel.values).all()


def test_a_click_on_class_relevance_keeps_the_map_and_the_scale(qtbot, loaded) -> None:  # noqa: ANN001
    """Round five: clicking a patch while viewing class relevance switched the map to query attention and ticked
    Normalise each map (which also flipped Features › Norms to own scale). The relevance stays; the patch is
    picked for the other docks, and the status bar says how to see its attention."""
    w = loaded
    w.state.update(source="relevance", normalize=False)
    w.select_query(w.session.model.spec.num_prefix + 3)
    assert w.state.source == "relevance" and w.state.normalize is False
    assert w.state.query == w.session.model.spec.num_prefix + 3
    assert any("stays the class relevance" in n for n in w.notes)
    w.state.update(source="cls")
    w.select_query(w.session.model.spec.num_prefix + 4)                  # elsewhere a click still shows the token's map
    assert w.state.source == "token" and w.state.normalize is True


def test_the_last_layer_stays_the_last_when_another_model_opens(qtbot, window, tmp_path) -> None:  # noqa: ANN001
    """Shown at its last layer, a model replaced by a deeper one opens at the new last layer (it opened at the old
    index: a 12-layer model at layer 2 after the 3-layer demo); a layer the user picked stays that index."""
    from _tiny import write_tiny_checkpoint

    shallow = write_tiny_checkpoint(tmp_path / "two.pth", depth=2)
    deep = write_tiny_checkpoint(tmp_path / "four.pth", depth=4)
    for path, want in ((shallow, 1), (deep, 3), (shallow, 1)):
        with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
            window.load_model(str(path), heads=HEADS)
        assert window.state.layer == want, (path.name, window.state.layer)
    window.state.update(layer=0)                       # the user's own pick
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(deep), heads=HEADS)
    assert window.state.layer == 0
    wait_idle(qtbot, window)
