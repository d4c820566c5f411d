"""The window on windowed models (Swin, SAM / ViTDet), tiny timm models with random weights saved as hub folders:
they load without an error, the image panel draws the selected block's received map of the library
(`WindowedMaps`) at its stage's resolution with the block's window outlines (a shifted block's as after the shift),
a clicked patch gives the library's window-attention map with its window highlighted, Model info lists the stages
and blocks, the overview shows a stage's blocks, rollout says it is undefined across Swin's patch merging and
equals the library's through SAM's global blocks, and the window's export writes the CLI's bytes."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _gui import make_image, show_dock, wait_idle
from parity_refs import perturb

from vitviz.core.analyses.maps import MapKind
from vitviz.core.analyses.winview import WindowedMaps

timm = pytest.importorskip("timm")

SWIN_ARGS = dict(img_size=64, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, num_classes=5)
SAM_ARGS = dict(img_size=64, patch_size=8, embed_dim=32, depth=4, num_heads=2, global_attn_indexes=[1, 3],
                window_size=3, neck_chans=16, num_classes=0)


def _hub_folder(folder: Path, arch: str, args: dict) -> Path:
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = perturb(timm.create_model(arch, pretrained=False, **args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(model, str(folder), safe_serialization=True, model_args=args)
    return folder


@pytest.fixture(scope="module")
def swin_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Swin v1 (timm): 2 stages of 2 blocks (1 and 2 heads), 4 x 4 windows, every second block shifted by 2, 64 px:
    16 x 16 cells of 4 px, then 8 x 8 of 8 px."""
    return _hub_folder(tmp_path_factory.mktemp("swin"), "swin_tiny_patch4_window7_224", SWIN_ARGS)


@pytest.fixture(scope="module")
def sam_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SAM image encoder (timm samvit): 4 blocks, 1 and 3 global, 3 x 3 windows, 8 x 8 cells of 8 px."""
    return _hub_folder(tmp_path_factory.mktemp("sam"), "samvit_base_patch16", SAM_ARGS)


def open_windowed(qtbot, window, folder: Path, image: Path) -> WindowedMaps:  # noqa: ANN001
    """Load `folder` and run `image` in the window; no error box; the cached holder."""
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(folder))
    window.session.add_images([str(image)])
    wait_idle(qtbot, window, 30000)
    assert window.reporter.box is None or not window.reporter.box.isVisible(), window.reporter.box.text()
    maps = window.session.result(str(image))
    assert isinstance(maps, WindowedMaps)
    return maps


def library(folder: Path, image: Path) -> WindowedMaps:
    import vitviz

    return WindowedMaps(vitviz.load(str(folder), device="cpu").run(str(image)))


def path_segments(item) -> np.ndarray:  # noqa: ANN001
    """The (K, 2, 2) segments a QGraphicsPathItem draws (each a moveTo then a lineTo), in image pixels."""
    path = item.path()
    points = np.array([[path.elementAt(i).x, path.elementAt(i).y] for i in range(path.elementCount())])
    return points.reshape(-1, 2, 2)


def patch_pos(window, row: int, col: int):  # noqa: ANN001, ANN201
    """The image panel's viewport position of the centre of first-stage patch (row, col)."""
    from _gui import viewport_pos

    p = window.session.model.spec.patch_size
    return viewport_pos(window.panel.view_widget, window.panel.view, (col + 0.5) * p, (row + 0.5) * p)


@pytest.fixture(scope="module")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 70 x 90 picture: resized and cropped to the models' 64 x 64."""
    return make_image(tmp_path_factory.mktemp("photo") / "photo.png", 3, (70, 90))


@pytest.fixture
def swin_window(qtbot, window, swin_folder, photo):  # noqa: ANN001, ANN201
    maps = open_windowed(qtbot, window, swin_folder, photo)
    return window, maps, library(swin_folder, photo)


@pytest.fixture
def sam_window(qtbot, window, sam_folder, photo):  # noqa: ANN001, ANN201
    maps = open_windowed(qtbot, window, sam_folder, photo)
    return window, maps, library(sam_folder, photo)


def test_swin_received_map_is_the_librarys_with_the_blocks_outlines(swin_window) -> None:  # noqa: ANN001
    window, maps, ref = swin_window
    assert window.state.source == "received"
    offered = [window.controls.source_combo.itemData(i) for i in range(window.controls.source_combo.count())]
    assert offered == ["rollout", "key", "received", "query"]   # no CLS, token, relevance... for a windowed model
    assert window.controls.layer_label.text() == "Block"
    panel = window.panel
    for block, head in ((1, 0), (3, 1), (2, "mean"), (0, "max")):
        window.state.update(layer=block, head=head)
        g = ref.geometry[block]
        np.testing.assert_allclose(panel.values, ref.stack("received", g.stage).select(g.index, head), atol=1e-6)
        assert panel.values.shape == g.grid                          # the stage's resolution: 16 x 16, then 8 x 8
        assert panel.overlay_item.mapRectToParent(panel.overlay_item.boundingRect()).width() == 64
        assert f"stage {g.stage} · block {g.index}" in panel.title.text
        assert f"stage {g.stage} · block {g.index}" in window.controls.block_label.text()
        # the block's outlines on the view, in image pixels: the library's segments times the stage's stride
        assert panel.outline_item.isVisible()
        np.testing.assert_allclose(path_segments(panel.outline_item), ref.outlines(block).segments * g.stride)
    # a shifted block (stage 0 block 1, shift 2 of 4 x 4 windows of 4 px) is drawn as after the shift: its inner
    # lines at x = 8, 24, 40, 56 px, the unshifted block's at 16, 32, 48
    def inner_x(block: int) -> set[float]:
        window.state.update(layer=block)
        segs = path_segments(panel.outline_item)
        vertical = segs[segs[:, 0, 0] == segs[:, 1, 0]]
        return {float(x) for x in vertical[:, 0, 0]} - {0.0, 64.0}
    assert inner_x(1) == {8.0, 24.0, 40.0, 56.0} and inner_x(0) == {16.0, 32.0, 48.0}
    window.state.update(layer=1)
    assert "windowed (4×4, shift 2)" in panel.title.text
    # the stage's heads: stage 0 has one, so head 1 asked of block 0 shows its only head
    window.state.update(layer=0, head=1)
    np.testing.assert_allclose(panel.values, ref.stack("received", 0).select(0, 0), atol=1e-6)
    assert window.controls.head_spin.maximum() == 0


def test_swin_clicked_patch_gives_its_window_attention(qtbot, swin_window) -> None:  # noqa: ANN001
    from PySide6.QtCore import Qt

    window, maps, ref = swin_window
    window.state.update(layer=1, head=0)                       # a shifted block
    row, col = 5, 14
    qtbot.mouseClick(window.panel.view_widget.viewport(), Qt.MouseButton.LeftButton, pos=patch_pos(window, row, col))
    q = row * 16 + col
    assert (window.state.source, window.state.query) == ("query", q)
    panel = window.panel
    for block in (1, 3):
        window.state.update(layer=block)
        g = ref.geometry[block]
        want = ref.stack(MapKind("query", q), g.stage).select(g.index, 0)
        np.testing.assert_allclose(panel.values, want, atol=1e-6)
        assert want[g.grid[0] * row // 16, g.grid[1] * col // 16] > 0 and (want == 0).any()   # inside its window
        np.testing.assert_allclose(path_segments(panel.outline_item.query_item),
                                   ref.query_outline(block, (row, col)) * g.stride)
    assert panel.highlight_item.isVisible()
    # shifted by 2, the window of patch (5, 14) wraps around the right edge: its pieces on both sides
    window.state.update(layer=1)
    xs = path_segments(panel.outline_item.query_item)[:, :, 0]
    assert xs.min() == 0 and xs.max() == 64
    # clicking it again clears the query: back to what every patch receives
    qtbot.mouseClick(window.panel.view_widget.viewport(), Qt.MouseButton.LeftButton, pos=patch_pos(window, row, col))
    assert (window.state.source, window.state.query) == ("received", None)
    assert panel.outline_item.counts[1] == 0


def test_swin_info_overview_and_head_statistics(qtbot, swin_window, photo) -> None:  # noqa: ANN001
    window, maps, ref = swin_window
    info = show_dock(qtbot, window, "infoDock")
    text = info.text()
    for line in ("stage 0", "2 blocks, 1 head, width 16", "16×16 tokens of 4 px", "2 blocks, 2 heads, width 32",
                 "8×8 tokens of 8 px", "windowed (4×4, shift 2)", "stage 1 block 1 (block 3)"):
        assert line in text, line
    assert "Could not" not in text
    overview = show_dock(qtbot, window, "overviewDock")
    window.state.update(layer=3, head="mean")
    assert overview._blocks == [2, 3] and overview._shape[:2] == (2, 4)       # stage 1's blocks x (2 heads, mean, max)
    assert overview.plot.getAxis("left").labelText == "block"
    from PySide6.QtCore import QPointF, Qt

    gh, gw, gap = *overview._shape[2:], overview._gap          # a click on row 0, head 1: block 2 (stage 1's first)
    scene = overview.plot.vb.mapViewToScene(QPointF(1.5 * (gw + gap), 0.5 * (gh + gap)))
    qtbot.mouseClick(overview.widget.viewport(), Qt.MouseButton.LeftButton, pos=overview.widget.mapFromScene(scene))
    assert (window.state.layer, window.state.head) == (2, 1)
    stats = window.session.head_stats[str(photo)]
    dist, ent, share = stats
    assert dist.shape == ent.shape == (4, 2) and share.shape == (4, 2, 1)
    assert np.isnan(dist[:2, 1]).all() and np.isfinite(dist[2:]).all()      # stage 0 has one head
    ov = ref.overview(1)
    np.testing.assert_allclose(dist[2:], ov.distance * 8)                       # cells of 8 px
    np.testing.assert_allclose(ent[2:], ov.entropy)
    np.testing.assert_allclose(share[:, 0, 0], 1.0, atol=1e-5)                 # 64 px: no padding windows
    heads = show_dock(qtbot, window, "headStatsDock")
    assert heads.shown is not None and heads.shown[0].shape == (4, 2)
    assert heads.distance.plot.getAxis("bottom").labelText == "block"


def test_swin_says_what_it_cannot_show(qtbot, swin_window) -> None:  # noqa: ANN001
    window, maps, ref = swin_window
    rollout = show_dock(qtbot, window, "rolloutDock")
    title = rollout.rollout_view.title.text
    assert "not defined" in title and "patch merging" in title
    assert rollout.rollout_map is None
    # said once (the line under the maps repeated the title, issue 35's second pass); its settings do nothing here
    assert rollout.timing.text() == "" and not rollout.controls.isEnabled()
    window.state.update(source="rollout")
    assert "patch merging" in window.panel.title.text and not window.panel.overlay_item.isVisible()
    assert "windowed" in show_dock(qtbot, window, "matrixDock").title.text
    assert "windowed" in show_dock(qtbot, window, "posEmbedDock").message.text()
    assert "windowed" in show_dock(qtbot, window, "featuresDock").status.text()
    assert window.reporter.box is None or not window.reporter.box.isVisible()


def test_sam_windowed_and_global_blocks_and_rollout(qtbot, sam_window) -> None:  # noqa: ANN001
    from vitviz.core.analyses.rollout import RolloutParams

    window, maps, ref = sam_window
    panel = window.panel
    for block in (0, 1):                                       # windowed (3 x 3), then global (8 x 8)
        window.state.update(layer=block, head=1)
        g = ref.geometry[block]
        np.testing.assert_allclose(panel.values, ref.stack("received", 0).select(block, 1), atol=1e-6)
        assert g.describe() in panel.title.text and g.describe() in window.controls.block_label.text()
        np.testing.assert_allclose(path_segments(panel.outline_item), ref.outlines(block).segments * 8)
    assert len(path_segments(panel.outline_item)) == 4                        # a global block: the border only
    info = show_dock(qtbot, window, "infoDock").text()
    assert "global (8×8)" in info and "windowed (3×3)" in info and "2 global" in info
    # rollout through SAM's global blocks (1 and 3): the library's, in the dock and in the image panel
    rollout = show_dock(qtbot, window, "rolloutDock")
    want = ref.rollout(0, RolloutParams(), None, blocks="global")
    assert want.maps.shape[0] == 2
    np.testing.assert_allclose(rollout.rollout_map, want.select(1, "mean"), atol=1e-6)
    assert "global blocks 1, 3" in rollout.rollout_view.title.text
    assert rollout.controls.isEnabled()
    window.state.update(source="rollout", layer=2)             # through block 1, the last global one before 2
    np.testing.assert_allclose(panel.values, want.select(0, "mean"), atol=1e-6)
    assert "through block 1 (global blocks)" in panel.title.text
    window.select_query(19)                                     # the rollout of patch 19
    np.testing.assert_allclose(panel.values, ref.rollout(0, RolloutParams(query=19), (2, 3), "global").select(
        0, "mean"), atol=1e-6)



def test_sam_absolute_table_in_the_positions_dock(qtbot, sam_window, sam_folder) -> None:  # noqa: ANN001
    """SAM adds a learned absolute table before its blocks: the Positions dock shows its similarities (the
    library's table, no prefix rows), and says that the blocks' relative positions are not drawn there."""
    import vitviz
    from vitviz.core.analyses import analysis
    window, _maps, _ref = sam_window
    qtbot.waitUntil(lambda: window.session.model.pos_embed is not None, timeout=20000)
    dock = show_dock(qtbot, window, "posEmbedDock")
    data = dock.data
    assert data is not None and data.grid == (8, 8) and data.prefix_rows == 0
    table = vitviz.load(str(sam_folder), device="cpu").pos_embed((8, 8))
    np.testing.assert_allclose(data.similarity, analysis.pos_embed_similarity(table, (8, 8), 0), atol=1e-5)
    assert data.mosaic is not None and "relative positions" in dock.title.text()


def _cli(*args: str) -> None:
    from vitviz.cli import main

    assert main(["export", *args, "--quiet"]) == 0


def _pngs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))}


def test_window_export_is_the_clis_bytes(qtbot, swin_window, swin_folder, photo, tmp_path) -> None:  # noqa: ANN001
    window, maps, ref = swin_window
    actions = window.file_actions
    # the current view (received, block 3, head 1) with a colorbar, as `vitviz export --colorbar`
    window.state.update(source="received", layer=3, head=1)
    mine = actions.export_png_to(tmp_path / "view.png", colorbar=True)
    _cli("--model", str(swin_folder), str(photo), "--out", str(tmp_path / "cli"), "--maps", "received",
         "--layers", "3", "--which-heads", "1", "--colorbar")
    assert mine.read_bytes() == (tmp_path / "cli" / "photo_received_L3_H1.png").read_bytes()
    # every block x head of patch 37's window attention (its map on its own scale: --scale own)
    window.select_query(37)
    assert (window.state.source, window.state.normalize) == ("query", True)
    (tmp_path / "all").mkdir()
    written = actions.export_all_to(tmp_path / "all", overwrite=True)
    _cli("--model", str(swin_folder), str(photo), "--out", str(tmp_path / "cli_all"), "--maps", "query:37",
         "--layers", "all", "--which-heads", "all,mean,max", "--scale", "own")
    cli = _pngs(tmp_path / "cli_all")
    assert len(written) == len(cli) == 2 * 3 + 2 * 4 and "photo_query37_L0_H0.png" in cli
    assert _pngs(tmp_path / "all") == cli
    # the .npz: the arrays export writes (`WindowedMaps.arrays`)
    out = actions.export_npz_to(tmp_path / "photo.npz", overwrite=True)
    _cli("--model", str(swin_folder), str(photo), "--out", str(tmp_path / "cli_npz"), "--maps", "received",
         "--layers", "0", "--which-heads", "0", "--npz")
    with np.load(out) as a, np.load(tmp_path / "cli_npz" / "photo.npz") as b:
        assert sorted(a.files) == sorted(b.files) and "block3" in a.files
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_bare_torchvision_swin_file_with_assumptions(qtbot, window, tmp_path, photo) -> None:  # noqa: ANN001
    """A bare state dict (no config, no release name): its assumed settings are said in Model info, not asked in
    the plain ViT's dialog, and the model runs."""
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    net = perturb(SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[1, 2],
                                  window_size=[4, 4], num_classes=5))
    torch.save(net.state_dict(), tmp_path / "swin.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        maps = open_windowed(qtbot, window, tmp_path / "swin.pth", photo)
    assert window.assumptions_dialog is None
    assert window.session.model.spec.family == "torchvision-swin" and maps.spec.assumptions
    assert "shift_rule is assumed" in window.session.model.described["shift_rule"]
    text = show_dock(qtbot, window, "infoDock").text()
    assert "Assumed" in text and "shift_rule" in text and "stage 1 block 1 (block 3)" in text
    np.testing.assert_allclose(window.panel.values, maps.stack("received", 1).select(1, "mean"), atol=1e-6)


def test_swin_at_another_input_size(qtbot, swin_window, swin_folder, photo) -> None:  # noqa: ANN001
    """Run at size 96: the stages' grids follow (24 x 24, 12 x 12), the maps are the library's run at that size,
    the hover readout names the stage cell of a patch."""
    import vitviz

    window, maps, ref = swin_window
    window.session.set_image_size((96, 96))
    wait_idle(qtbot, window, 30000)
    at = WindowedMaps(vitviz.load(str(swin_folder), device="cpu").run(str(photo), image_size=(96, 96)))
    window.state.update(source="received", layer=2, head=1)
    assert window.panel.values.shape == (12, 12)
    np.testing.assert_allclose(window.panel.values, at.stack("received", 1).select(0, 1), atol=1e-6)
    np.testing.assert_allclose(path_segments(window.panel.outline_item), at.outlines(2).segments * 8)
    assert "stage cell 2, 7" in window.panel.readout(5, 14) and "patch 134" in window.panel.readout(5, 14)
    assert "24×24" in show_dock(qtbot, window, "infoDock").text()


def test_a_windowed_model_a_is_refused_in_the_compare_dock_and_a_plain_a_compares(qtbot, window, swin_folder,  # noqa: ANN001
                                                                                  tiny_ckpt, tmp_path) -> None:
    """Compare draws two plain ViTs on one token grid: with a windowed model as A the dock says why, with no error
    box (it was "AttributeError: 'WindowedResult' object has no attribute 'attentions'"); loading a plain ViT as
    A then compares with the B already loaded."""
    from _gui import HEADS

    photo = make_image(tmp_path / "photo.png", 3)
    open_windowed(qtbot, window, swin_folder, photo)
    window.compare_with(str(tiny_ckpt), heads=HEADS)
    qtbot.waitUntil(lambda: window.compare.b_spec is not None and window.is_idle(), timeout=30000)
    frame, note = window.compare.frame_for(window.state)
    assert frame is None and "Model A is a windowed model (timm-swin)" in note and window.compare.error == ""
    assert window.compare.view is None and window.reporter.errors == []
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    qtbot.waitUntil(lambda: window.compare.view is not None and window.is_idle(), timeout=30000)
    frame, note = window.compare.frame_for(window.state)
    assert frame is not None and np.array_equal(frame.diff, np.zeros_like(frame.diff))    # A against itself


def test_the_mean_over_layers_is_said_to_be_the_last_block(qtbot, window, swin_folder, tmp_path) -> None:  # noqa: ANN001
    """`--layer mean` (or a mean picked before) on a windowed model: no mean over the stages' grids, so the last
    block is shown -- and the status bar says so."""
    window.state.update(layer="mean")
    open_windowed(qtbot, window, swin_folder, make_image(tmp_path / "photo.png", 1))
    depth = window.session.model.spec.depth
    assert window.state.layer == depth - 1
    assert any("no mean over blocks" in n and f"last block ({depth - 1})" in n for n in window.notes)


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
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(folder))
    wait_idle(qtbot, window)
    assert window.reporter.box is None or not window.reporter.box.isVisible()
    assert window.session.model.spec.family == "timm-swin" and window.state.source == "received"
    # the ViT was shown at its last layer (1): the Swin opens at its last block (stage 1's second, block 3)
    assert window.state.layer == 3 and "stage 1 · block 1 (block 3" in window.panel.title.text
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(tiny_ckpt), heads=2)
    wait_idle(qtbot, window)
    assert window.state.source == "cls" and window.controls.layer_label.text() == "Layer"
    assert window.reporter.box is None or not window.reporter.box.isVisible()


def test_the_verdict_line_says_swin_and_sam_folders_are_verified(qtbot, window, swin_folder, sam_folder,  # noqa: ANN001
                                                                   photo) -> None:
    """The window's check builds timm's Swin / SAM from the folder and compares them block by block: the line says
    "Verified against timm" for each (it said "Not verified" for every windowed file before)."""
    s = window.session
    for folder in (swin_folder, sam_folder):
        with qtbot.waitSignal(s.model.model_loaded, timeout=30000):
            window.load_model(str(folder))
        with qtbot.waitSignal(s.model.verification_changed, timeout=60000,
                              check_params_cb=lambda *a: s.model.verification is not None or bool(
                                  s.model.verify_failure)):
            s.add_images([str(photo)])
        wait_idle(qtbot, window, 30000)
        check = s.model.verification
        assert s.model.verify_failure == "" and check.verdict == "verified", (check.summary(), check.reason)
        assert window.status.verdict_label.text().startswith("Verified against timm"), \
            window.status.verdict_label.text()
