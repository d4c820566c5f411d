"""Models and results print as one-line summaries (never their arrays), and every result kind shows a picture
in Jupyter (`_repr_png_`)."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from _tiny import write_tiny_checkpoint

import vitviz
from vitviz.core.analyses.maps import ResultMaps

PNG = b"\x89PNG"


def _image(folder: Path) -> str:
    from PIL import Image

    path = folder / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_model_and_result_reprs_summarise(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(write_tiny_checkpoint(tmp_path / "tiny.pth"))
    text = repr(model)
    spec = model.spec
    assert text.startswith("VitModel(tiny.pth: ") and spec.family in text
    assert f"{spec.depth} blocks × {spec.num_heads} heads" in text and "cpu" in text and "0x" not in text
    result = model.run(_image(tmp_path))
    text = repr(result)
    assert text.startswith("AttentionResult(photo.png: ") and str(tuple(result.attentions.shape)) in text
    assert "top " in text and len(text) < 300
    check = vitviz.verify(model)   # the verdict, once asked, is part of the model's line
    assert repr(model).endswith(f", {check.verdict})") or f", {check.verdict}, " in repr(model)
    maps = ResultMaps(result)
    assert repr(maps).startswith("ResultMaps(AttentionResult(")
    for shown in (result, maps):
        assert shown._repr_png_().startswith(PNG)


def test_windowed_model_and_result(tmp_path: Path) -> None:
    import timm
    from timm.models import save_for_hf

    kw = dict(img_size=64, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, num_classes=5)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kw), str(tmp_path),
                    safe_serialization=True, model_args=kw)
        model = vitviz.load(tmp_path)
    assert repr(model).startswith("WindowedModel(") and "4 blocks, heads 1/2" in repr(model)
    result = model.run(_image(tmp_path))
    text = repr(result)
    assert text.startswith("WindowedResult(photo.png: 4 blocks") and "top " in text and len(text) < 300
    assert result._repr_png_().startswith(PNG)
