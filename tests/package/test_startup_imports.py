"""Reading the family facts and listing the caches import no torch, so `vitviz models` starts in a blink.

Each check runs in a fresh interpreter (this test process has torch loaded already): the family facts
(`family_from_name`, `hf_family`, `recipe`) and `vitviz.cli.main(['models'])` over fake torch hub and Hugging Face
caches must leave `torch` (and torchvision) out of `sys.modules`, and still give the right answers. Fast: three
subprocesses of a fraction of a second each. `bench/startup.py` times the same listing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCH_FILES = {   # file -> the family `vitviz models` shows: a known torchvision download, else a guess from the
    "vit_b_16-c867db91.pth": "torchvision",                     # name, marked with '?'
    "deit_small_patch16_224-cd65a155.pth": "deit?",
    "cait_s24_224.pth": "cait?",
}
NO_TORCH = ("bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'timm'))\n"
            "assert not bad, 'imported ' + ', '.join(bad[:5])\n")


def _python(code: str, env: dict[str, str] | None = None) -> str:
    """stdout of `code` in a fresh interpreter that imports this checkout's vitviz; fails with its stderr."""
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "XDG_CACHE_HOME", "TORCH_HOME",
                                                               "HF_HOME")}
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**base, **(env or {})}, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_family_facts_import_no_torch() -> None:
    out = _python(
        "import sys\n"
        "import vitviz.core.reading.families as families\n"
        "import vitviz.core.reading.checkpoint\n"
        "from vitviz.core.reading.families import family_from_name, hf_family, recipe\n"
        "r = recipe('clip')\n"
        "print(family_from_name('cait_s24_224.pth'), family_from_name('deit_small_patch16_224-cd65a155.pth'),\n"
        "      hf_family('vit'), r.interpolation, r.mean[0])\n"
        "mods = sorted(m for m in sys.modules if m.startswith('vitviz.core.reading.families.'))\n"
        "print(len(mods))\n" + NO_TORCH)
    facts, count = out.split("\n")[:2]
    assert facts.split() == ["cait", "deit", "hf-vit", "bicubic", "0.48145466"]   # OpenAI CLIP's mean
    assert int(count) >= 15   # every family module was imported (base + 14 families), none imported torch


@pytest.fixture()
def fake_caches(tmp_path: Path) -> dict[str, str]:
    """A torch hub cache with three small fake checkpoints and an HF cache with one ViT snapshot."""
    hub = tmp_path / "torch" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    for name in TORCH_FILES:
        (hub / name).write_bytes(b"fake")
    snap = tmp_path / "hf" / "hub" / "models--google--vit-base-patch16-224" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (snap / "model.safetensors").write_bytes(b"fake weights")
    return {"TORCH_HOME": str(tmp_path / "torch"), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}


def test_models_listing_imports_no_torch(fake_caches: dict[str, str]) -> None:
    out = _python(
        "import sys\n"
        "from vitviz.cli import main\n"
        "assert main(['models']) == 0\n"
        "print('---')\n"
        "assert main(['models', '--json']) == 0\n" + NO_TORCH, env=fake_caches)
    table, listing = out.split("---\n")
    rows = {Path(r["path"]).name: r for r in json.loads(listing)["models"]}
    assert {name: rows[name]["family"] + ("?" if rows[name]["by_name"] else "") for name in TORCH_FILES} == TORCH_FILES
    tv = rows["vit_b_16-c867db91.pth"]
    assert tv["named"] == "torchvision:vit_b_16:IMAGENET1K_V1" and "1000 classes, 224 px" in tv["detail"]
    assert rows["abc"]["family"] == "hf-vit" and rows["abc"]["name"] == "google/vit-base-patch16-224"
    assert len(rows) == 4
    lines = table.splitlines()
    for name, family in [*TORCH_FILES.items(), ("google/vit-base-patch16-224", "hf-vit")]:
        line = next(line for line in lines if name in line)   # the row's name or its path
        assert family in line.split(), line


def test_torchvision_file_table_matches_torchvision() -> None:
    """The scan's torch-free table of torchvision's ViT files says what torchvision's own Weights enums say."""
    from torchvision.models import vision_transformer as tv

    from vitviz.catalog.scan import _TORCHVISION_FILES, _torchvision_info
    from vitviz.core.reading.metadata import torchvision_weights

    files = [w.url.split("/")[-1] for enum in (tv.ViT_B_16_Weights, tv.ViT_B_32_Weights, tv.ViT_L_16_Weights,
                                               tv.ViT_L_32_Weights, tv.ViT_H_14_Weights) for w in enum]
    assert sorted(files) == sorted(_TORCHVISION_FILES)
    for f in files:
        info = torchvision_weights(f)
        want = {"arch": info["arch"], "weights": info["weights"], "classes": len(info["categories"]),
                "crop": info["crop"]}
        assert _torchvision_info(f) == want, f
    assert _torchvision_info("vit_b_16-00000000.pth") is None   # torchvision's name pattern, not its file
