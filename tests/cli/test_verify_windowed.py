"""`vitviz verify` on a windowed model's folder: the timm original built and compared block by block, each block's
largest difference per size in the report, and exit code 0; a bare state dict exits 1 with the reason."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from parity_refs import perturb
from vitviz.cli import main

timm = pytest.importorskip("timm")
ARGS = dict(img_size=64, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, num_classes=5)


def test_vitviz_verify_a_timm_swin_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = perturb(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **ARGS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(model, str(tmp_path / "hub"), safe_serialization=True, model_args=ARGS)
    assert main(["verify", str(tmp_path / "hub")]) == 0
    out = capsys.readouterr().out
    assert "timm.create_model('swin_tiny_patch4_window7_224', strict_img_size=False)" in out
    assert "64x64" in out and "72x72" in out and out.strip().splitlines()[-1].startswith("Verified against timm")
    assert main(["verify", str(tmp_path / "hub"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "verified" and [len(s["layers"]) for s in doc["per_layer"]] == [4, 4]
    torch.save(model.state_dict(), tmp_path / "swin.pth")
    assert main(["verify", str(tmp_path / "swin.pth"), "--image-size", "64"]) == 1
    assert "nothing names this file's architecture" in capsys.readouterr().out
