"""A text prompt as the relevance target in the window: the map shown is the library's `prompt_relevance` (LeGrad
of the prompt's embedding from the file's own text tower), and the window's export of it is the file
`vitviz export --maps 'text:PROMPT'` writes (same name, same bytes)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _gui import wait_idle
from parity_refs import perturb

open_clip = pytest.importorskip("open_clip")

PROMPT = "a photo of a cat"
CFG = {"embed_dim": 16, "quick_gelu": True,
       "vision_cfg": dict(layers=2, width=64, head_width=16, patch_size=8, image_size=32, mlp_ratio=2.0),
       "text_cfg": dict(context_length=16, vocab_size=49408, width=32, heads=2, layers=1)}


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """open_clip's whole CLIP (text tower too) with its open_clip_config.json beside it."""
    torch.manual_seed(0)
    model = perturb(open_clip.CLIP(**CFG).eval())
    folder = tmp_path_factory.mktemp("clip")
    torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": CFG}))
    return folder / "open_clip_pytorch_model.bin"


def test_text_prompt_map_is_the_librarys_and_exports_as_the_cli(qtbot, window, clip_file: Path, images,  # noqa: ANN001
                                                                  tmp_path: Path) -> None:
    import vitviz
    from vitviz.cli import main
    from vitviz.core.analyses.text import prompt_relevance
    from vitviz.gui import exporting

    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(clip_file))
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    picker = window.controls.relevance_picker
    assert picker.isEnabled() or window.state.source != "relevance"
    window.state.update(source="relevance", relevance_prompt=PROMPT)
    qtbot.waitUntil(lambda: window.panel.values is not None and "prompt" in window.panel.title.text, timeout=60000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(clip_file, device="cpu")
    expected = prompt_relevance(model, str(images[0]), PROMPT).map
    np.testing.assert_allclose(window.panel.values, expected, atol=1e-6)

    ours = tmp_path / "window"
    ours.mkdir()
    exporting.export_all(window.session.image_list.current_maps, window.state, ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["export", "--model", str(clip_file), str(images[0]), "--out", str(tmp_path / "cli"), "--maps",
                     f"text:{PROMPT}", "--device", "cpu", "--quiet"]) == 0
    window_pngs = {p.name: p.read_bytes() for p in ours.glob("*.png")}
    cli_pngs = {p.name: p.read_bytes() for p in (tmp_path / "cli").glob("*.png")}
    assert window_pngs and set(window_pngs) == set(cli_pngs), (sorted(window_pngs), sorted(cli_pngs))
    assert window_pngs == cli_pngs

    # the .npz: the window's holds the prompt's map and scores under export's keys, with the same values
    from vitviz.core import files
    npz = exporting.export_npz(window.session.image_list.current_maps, tmp_path / "window.npz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["export", "--model", str(clip_file), str(images[0]), "--out", str(tmp_path / "cli_npz"),
                     "--maps", f"text:{PROMPT}", "--npz", "--device", "cpu", "--quiet"]) == 0
    ours_npz, cli_npz = files.read_npz(npz), files.read_npz(next((tmp_path / "cli_npz").glob("*.npz")))
    text_keys = [k for k in cli_npz if k.startswith("text_")]
    assert len(text_keys) == 2 and set(ours_npz) == set(cli_npz), (sorted(ours_npz), sorted(cli_npz))
    for key in cli_npz:
        if isinstance(cli_npz[key], np.ndarray):
            np.testing.assert_array_equal(ours_npz[key], cli_npz[key], err_msg=key)
        else:
            assert ours_npz[key] == cli_npz[key], key
