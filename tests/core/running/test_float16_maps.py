"""float16 storage of captured attention (issue 36): `run(half=True)`, `forward_captured(half=True)`, export
`--half`. Each probability is rounded once to float16 (10 stored mantissa bits): within 2^-11 (4.9e-4) of its
float32 value relatively where it is a normal float16 (>= 2^-14), within 2^-25 absolutely below that, so within
2^-12 (2.4e-4) absolutely everywhere (values are at most 1). Derived maps are computed in float32 from the
rounded values; on this model the rollout vector stays within 1e-4 of float32's, relatively."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import vitviz
from vitviz.cli import main as vitviz_main
from vitviz.core.analyses.rollout import rollout_vector

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
UNIT = 2.0 ** -11   # float16's unit roundoff


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    args = dict(img_size=64, patch_size=8, embed_dim=64, depth=6, num_heads=4)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **args)
    out = tmp_path_factory.mktemp("f16") / "timm"
    timm.models._hub.save_for_hf(model, str(out), model_args=args, safe_serialization=True)
    return out


def test_error_bound_of_float16_maps(folder: Path) -> None:
    model = vitviz.load(folder, device="cpu")
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    full, half = model.run(x), model.run(x, half=True)
    assert half.attentions.dtype == np.float16 and half.attentions.nbytes * 2 == full.attentions.nbytes
    a, b = full.attentions, half.attentions.astype(np.float32)
    err = np.abs(a - b)
    assert err.max() > 0   # rounded: the comparison can fail
    normal = a >= 2.0 ** -14
    assert (err[normal] <= UNIT * a[normal]).all(), (err[normal] / a[normal]).max()
    assert (err[~normal] <= 2.0 ** -25).all()
    assert err.max() <= 2.0 ** -12
    np.testing.assert_array_equal(half.logits, full.logits)   # only the stored maps are rounded, not the forward
    ra = rollout_vector(a, "mean", 0.0, num_prefix=1)
    rb = rollout_vector(half.attentions, "mean", 0.0, num_prefix=1)
    assert np.abs(ra - rb).max() <= 1e-4 * np.abs(ra).max()


def test_rows_in_float16(folder: Path) -> None:
    model = vitviz.load(folder, device="cpu")
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    rows, _ = model.forward_captured(x, half=True, rows=[0])
    full, _ = model.forward_captured(x)
    assert rows.dtype == np.float16 and rows.shape == (1, 6, 4, 1, 65)
    np.testing.assert_array_equal(rows, full[:, :, :, :1].astype(np.float16))


def test_export_half_writes_float16_maps(folder: Path, tmp_path: Path) -> None:
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    for name, flags in (("f32", []), ("f16", ["--half"])):
        code = vitviz_main(["export", "--model", str(folder), str(tmp_path / "a.png"), "--out", str(tmp_path / name),
                            "--maps", "cls", "--npz", "--quiet", "--no-verify", *flags])
        assert code == 0
    f32, = (tmp_path / "f32").rglob("*.npz")
    f16, = (tmp_path / "f16").rglob("*.npz")
    a, b = np.load(f32)["attentions"], np.load(f16)["attentions"]
    assert a.dtype == np.float32 and b.dtype == np.float16
    assert np.abs(a - b.astype(np.float32)).max() <= 2.0 ** -12
