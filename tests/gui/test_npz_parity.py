"""The window's .npz (File › Export › arrays) and `vitviz export --npz` write the same arrays under the same keys for
every map kind that needs a pass of its own: both come from one table (`ResultMaps.arrays`), fed here by the
window's own requests (the work the worker runs) and by the CLI."""
from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from _gui import HEADS

import vitviz
from vitviz.cli import main
from vitviz.core import files
from vitviz.gui import exporting
from vitviz.gui.protocol import Features, Relevance, Run


def test_window_npz_equals_export_npz_for_gradient_and_feature_maps(tiny_ckpt: Path, images: list[Path],
                                                                     tmp_path: Path) -> None:
    image = str(images[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ctx = SimpleNamespace(model=vitviz.load(tiny_ckpt, heads=HEADS, device="cpu"), slots={})
    maps = Run(image=image)(ctx).maps                                # what the window caches for the image
    for request in (Relevance(image=image, target=2), Features(image=image)):
        request.keep(maps, request(ctx))                             # what its PassStores keep when answered
    ours = files.read_npz(exporting.export_npz(maps, tmp_path / "window.npz"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), image, "--out", str(tmp_path / "cli"),
                     "--maps", "relevance:2,gradrollout:2,attngrad:2,norms", "--npz", "--device", "cpu",
                     "--quiet"]) == 0
    cli = files.read_npz(next((tmp_path / "cli").glob("*.npz")))
    assert {"relevance_c2", "attngrad_c2_class", "norms", "prefix_norms"} <= set(cli)
    assert set(ours) == set(cli), (sorted(set(ours) ^ set(cli)))
    for key, value in cli.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(ours[key], value, err_msg=key)
        else:
            assert ours[key] == value, key
