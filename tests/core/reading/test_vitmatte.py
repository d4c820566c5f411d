"""transformers VitMatte (issue 31: a folder ended in the catch-all "please report"): refused by name, saying why
(the 4-channel RGB + trimap input its attention depends on), with and without its config.json."""
from __future__ import annotations

import shutil

import pytest

import vitviz
from vitviz.errors import UnknownLayoutError

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def vitmatte_folder(tmp_path_factory: pytest.TempPathFactory):
    from transformers import VitDetConfig, VitMatteConfig, VitMatteForImageMatting

    backbone = VitDetConfig(image_size=32, pretrain_image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, mlp_ratio=2, num_channels=4, out_features=["stage2"])
    model = VitMatteForImageMatting(VitMatteConfig(backbone_config=backbone, hidden_size=32,
                                                   convstream_hidden_sizes=[8, 8, 8],
                                                   fusion_hidden_sizes=[8, 8, 8, 8]))
    folder = tmp_path_factory.mktemp("vitmatte")
    model.save_pretrained(folder)
    return folder


def test_vitmatte_folder_is_refused_by_name(vitmatte_folder) -> None:
    with pytest.raises(UnknownLayoutError) as e:
        vitviz.load(vitmatte_folder, device="cpu")
    msg = str(e.value)
    assert "VitMatte" in msg and "4 input channels" in msg and "trimap" in msg and "please report" not in msg


def test_vitmatte_weights_alone_are_refused_by_name(vitmatte_folder, tmp_path) -> None:
    path = tmp_path / "vitmatte-small.safetensors"
    shutil.copy(vitmatte_folder / "model.safetensors", path)
    with pytest.raises(UnknownLayoutError, match="VitMatte.*trimap"):
        vitviz.load(path, device="cpu")
