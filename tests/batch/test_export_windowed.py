"""`vitviz info` and `vitviz export` of windowed models (Swin, SAM / ViTDet): the stages and windows with their
provenance; the received and query maps per block and head under the export's names, the same pictures as the
library draws, the .npz of every block's windows; the plain ViT maps refused with the reason (no CLS token), and
the windowed maps refused for a plain ViT."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from parity_refs import perturb
from vitviz.cli import main

timm = pytest.importorskip("timm")


@pytest.fixture(scope="module")
def swin_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny timm Swin v1 hub folder (2 stages: 1 and 2 heads, 4x4 windows, 64 px)."""
    from timm.models import save_for_hf

    kw = dict(img_size=64, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, num_classes=5)
    torch.manual_seed(0)
    model = perturb(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kw))
    folder = tmp_path_factory.mktemp("swin")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(model, str(folder), safe_serialization=True, model_args=kw)
    return folder


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for name, size in (("a.png", (70, 90)), ("b.png", (64, 64))):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(folder / name)
    return folder


def test_info_lists_stages_and_windows(swin_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(swin_folder)]) == 0
    out = capsys.readouterr().out
    assert "family: timm-swin (swin, windowed attention: 4 blocks in 2 stages)" in out
    assert "stage 0        depth 2, heads 1, width 16, grid 16×16 (4 px per token)" in out
    assert "stage 0 block 1: windowed (4×4, shift 2)" in out
    assert "order              roll_pad" in out and "named" in out and "!!" not in out
    assert main(["info", str(swin_folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["windowed"] and [b["attention"] for b in data["blocks"]][:2] == ["windowed (4×4)",
                                                                              "windowed (4×4, shift 2)"]


def test_export_received_and_query(swin_folder: Path, images: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "maps"
    code = main(["export", "--model", str(swin_folder), str(images), "--out", str(out), "--maps", "received,query:17",
                 "--layers", "all", "--which-heads", "all,mean", "--npz", "--quiet", "--size", "input"])
    assert code == 0, capsys.readouterr().err
    names = sorted(p.name for p in out.iterdir())
    # stage 0 blocks (0, 1) have one head, stage 1 blocks (2, 3) two: each block gets its own heads and the mean
    for stem in ("a", "b"):
        for block, heads in ((0, [0]), (1, [0]), (2, [0, 1]), (3, [0, 1])):
            for head in heads + ["mean"]:
                assert f"{stem}_received_L{block}_H{head}.png" in names
                assert f"{stem}_query17_L{block}_H{head}.png" in names
        assert f"{stem}_received_L0_H1.png" not in names and f"{stem}.npz" in names
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["summary"]["done"] == 2 and manifest["model"]["spec"]["windowed"]
    assert manifest["model"]["verification"]["verdict"] == "verified"   # against timm, block by block
    with np.load(out / "b.npz") as npz:
        assert npz["block1"].shape == (16, 1, 16, 16) and npz["block3"].shape == (4, 2, 16, 16)
        assert (npz["block1_positions"] >= 0).all()
        assert json.loads(str(npz["geometry"]))[1]["attention"] == "windowed (4×4, shift 2)"
    # the picture is the library's: the model's run, the stage's stack, the one renderer
    import vitviz
    from vitviz.batch.windowed import window_stack
    from vitviz.core.analyses.maps import MapKind
    from vitviz.core.drawing.render import RenderOptions, draw_map

    model = vitviz.load(swin_folder, device="cpu")
    result = model.run(images / "b.png")
    g = result.geometry[3]
    rgb = draw_map(window_stack(result, MapKind("query", 17), g.stage), g.index, 1, result.image, (64, 64), g.stride,
                   RenderOptions(size="input"))
    np.testing.assert_array_equal(np.asarray(Image.open(out / "b_query17_L3_H1.png")), rgb)


def test_export_refuses_plain_maps_for_windowed(swin_folder: Path, images: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--model", str(swin_folder), str(images), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no CLS token" in err and "--maps received" in err
    assert main(["export", "--model", str(swin_folder), str(images), "--out", str(tmp_path / "o"),
                 "--maps", "rollout"]) == 2
    assert "patch merging" in capsys.readouterr().err
    assert main(["export", "--model", str(swin_folder), str(images), "--out", str(tmp_path / "o"),
                 "--maps", "query:999"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_export_refuses_windowed_maps_for_plain_vit(tiny_ckpt: Path, images: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from _tiny import HEADS

    assert main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), str(images), "--out",
                 str(tmp_path / "o"), "--maps", "received"]) == 2
    assert "windowed model's" in capsys.readouterr().err


def test_show_draws_a_windowed_result(swin_folder: Path, images: Path) -> None:
    import vitviz
    from vitviz.core.drawing.show import ShowError

    result = vitviz.load(swin_folder, device="cpu").run(images / "b.png")
    assert vitviz.show(result).size == vitviz.show(result, map="received", layer=-1).size   # 'cls' -> received
    assert vitviz.show(result, map="query:17", layer=3, head=1, colorbar=False, original=False).size == (64, 64)
    with pytest.raises(ShowError, match="heads in block 0"):
        vitviz.show(result, layer=0, head=1)
    with pytest.raises(ShowError, match="patch merging"):     # rollout is defined within one grid only
        vitviz.show(result, map="rollout")
    with pytest.raises(ShowError, match="plain ViT"):
        vitviz.show(result, map="entropy")


def test_export_and_show_a_key_map_of_a_windowed_model(swin_folder: Path, images: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """key:N is one row of the table and one compute branch per lane: `vitviz export --maps key:N` and
    `vitviz.show` draw it for a windowed model too, the same picture."""
    import vitviz

    out = tmp_path / "maps"
    code = main(["export", "--model", str(swin_folder), str(images / "b.png"), "--out", str(out), "--maps", "key:17",
                 "--layers", "3", "--which-heads", "1", "--quiet", "--colorbar"])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.glob("*.png")) == ["b_key17_L3_H1.png"]
    result = vitviz.load(swin_folder, device="cpu").run(images / "b.png")
    picture = vitviz.show(result, "key:17", layer=3, head=1)
    np.testing.assert_array_equal(np.asarray(picture), np.asarray(Image.open(out / "b_key17_L3_H1.png").convert("RGB")))
    assert main(["export", "--model", str(swin_folder), str(images), "--out", str(tmp_path / "o"),
                 "--maps", "key:999"]) == 2
    assert "out of range" in capsys.readouterr().err
