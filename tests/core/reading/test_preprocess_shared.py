"""One reading of timm's preprocessing settings and of the user's preprocessing overrides, for the checkpoint reader
(`vitviz.core.reading.hyperparams`) and the live path (`vitviz.core.running.live`) alike: the same pretrained_cfg gives the same
recipe whichever path opens the model, and the same bad override the same refusal."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import vitviz
from vitviz.core.spec import IMAGENET_MEAN, Preprocess
from vitviz.errors import VitvizError

CFG = {"crop_pct": 0.9, "interpolation": "bilinear", "mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3),
       "crop_mode": "squash"}


def test_from_timm_cfg_reads_every_setting_and_defaults_the_rest() -> None:
    pp = Preprocess.from_timm_cfg(CFG, (224, 224))
    assert pp == Preprocess(crop=(224, 224), resize=248, mode="squash", interpolation="bilinear",
                            mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3))
    bare = Preprocess.from_timm_cfg({}, (384, 384))
    assert bare.resize == 438 and bare.mode == "center" and bare.mean == IMAGENET_MEAN


def test_with_overrides_applies_and_refuses_alike() -> None:
    pp, changed = Preprocess.from_timm_cfg(CFG, (32, 32)).with_overrides({"mean": [0.1], "resize": "40",
                                                                           "crop_mode": "center"}, 3)
    assert changed == ["mean", "resize", "crop_mode"] and pp.mean == (0.1,) and pp.resize == 40 and pp.mode == "center"
    for bad, match in (({"mean": (0.1, 0.2)}, "expected 1 or 3"), ({"crop_mode": "zoom"}, "crop_mode 'zoom'"),
                       ({"resize": 0}, "positive size")):
        with pytest.raises(VitvizError, match=match):
            pp.with_overrides(bad, 3)
    assert Preprocess.overridden_source("guess: ImageNet mean/std", ["mean", "std"]) == (
        "override: ImageNet mean/std; mean, std overridden")


class _Tiny(torch.nn.Module):
    """A ViT in timm's key names (the checkpoint path reads it), also runnable as a module (the live path)."""

    def __init__(self) -> None:
        super().__init__()
        import timm

        self.inner = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=1,
                                       num_heads=2, num_classes=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


@pytest.mark.filterwarnings("ignore")
def test_both_paths_read_the_same_pretrained_cfg(tmp_path: Path) -> None:
    pytest.importorskip("timm")
    model = _Tiny().eval()
    folder = tmp_path / "m"
    folder.mkdir()
    torch.save(model.inner.state_dict(), folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": 3,
                                                    "pretrained_cfg": CFG,
                                                    "model_args": {"img_size": 32, "patch_size": 8, "embed_dim": 32,
                                                                   "depth": 1, "num_heads": 2}}))
    from_file = vitviz.load(folder, device="cpu").spec.preprocess
    model.pretrained_cfg = dict(CFG)
    live = vitviz.load(model, live=True, device="cpu").spec.preprocess
    assert from_file == live == Preprocess.from_timm_cfg(CFG, (32, 32))
    with pytest.raises(VitvizError, match="expected 1 or 3"):
        vitviz.load(folder, device="cpu", mean=(0.1, 0.2))
    with pytest.raises(VitvizError, match="expected 1 or 3"):
        vitviz.load(model, live=True, device="cpu", mean=(0.1, 0.2))
