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
from PIL import Image

from parity_refs import perturb
from vitviz.core.maps import MapKind
from vitviz.core.winview import WindowedMaps

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
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
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


def test_swin_received_map_and_outlines(qtbot, window, swin_folder, tmp_path) -> None:  # noqa: ANN001
    image = make_image(tmp_path / "photo.png", 3, (70, 90))
    maps = open_windowed(qtbot, window, swin_folder, image)
    assert window.state.source == "received"
    ref = library(swin_folder, image)
    panel = window.panel
    for block, head in ((1, 0), (3, 1), (2, "mean")):
        window.state.update(layer=block, head=head)
        g = ref.geometry[block]
        want = ref.stack("received", g.stage).select(g.index, head)
        np.testing.assert_allclose(panel.values, want, atol=1e-6)
        assert panel.values.shape == g.grid
        outlines = ref.outlines(block).segments
        assert panel.outline_item.isVisible() and panel.outline_item.counts[0] == len(outlines)
        assert f"stage {g.stage}" in panel.title.text
    print(maps)
