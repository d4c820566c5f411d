"""Shared fixtures for every test: Qt without a display, the tiny checkpoint most tests load, and the models that
tests of several modules load (the demo, a tiny Swin, the newer families' tiny checkpoints).

The tests mirror the package (tests/core/reading/ tests vitviz/core/reading/, tests/gui/ vitviz/gui/, ...; package/
holds the whole package's tests, parity/ the parity with the original implementations). Helper code lives in modules
beside this file (`_tiny.py`: tiny timm-layout checkpoints; `_hostile.py`: the hostile-input tests' helpers;
`_rollout_ref.py`: the test-side rollout reference; `parity_refs.py`, `tutorial_refs.py`, `parity_towers.py`: the
original implementations parity tests compare with). pytest puts this folder on `sys.path` (it imports this conftest
in its default "prepend" mode), so tests in every folder import them by name; test files need unique names (no
`__init__.py` anywhere).
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Every spec any test builds, of every family, is walked field by field: a setting that changes the computation
# without a provenance entry, with a source of no known kind, or assumed and not flagged fails the test that built
# it (vitviz.core.spec.audit_provenance; tests/core/test_provenance.py shows the audit can fail).
os.environ.setdefault("VITVIZ_AUDIT", "1")
# Ctrl+C as in a terminal: a shell without job control starts a background job with SIGINT ignored, and the tests
# that interrupt an export (in this process or in a child, which inherits the ignoring) then saw it run to its end
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _own_answers(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test remembers its answers ("remember for this file", vitviz.catalog.answers) in a store of its own,
    never in the user's ~/.config, and never sees another test's."""
    monkeypatch.setenv("VITVIZ_ANSWERS", str(tmp_path_factory.mktemp("answers") / "answers.json"))


@pytest.fixture(scope="session")
def _shapes_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vitviz-shapes")


@pytest.fixture(autouse=True)
def _own_cache(_shapes_cache: Path, tmp_path_factory: pytest.TempPathFactory,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vitviz's own cache (`$VITVIZ_CACHE`: remembered verdicts, the library architectures' shape signatures of
    `vitviz.core.reading.identify`) is each test's own, never the user's ~/.cache, so no test sees a verdict another one
    remembered; the shape signatures, which depend on nothing but the installed libraries, are carried from test to
    test (built at most once a session)."""
    import shutil

    mine = tmp_path_factory.mktemp("vitviz-cache")
    for f in _shapes_cache.glob("shapes-*.json"):
        shutil.copy(f, mine / f.name)
    monkeypatch.setenv("VITVIZ_CACHE", str(mine))
    yield
    for f in mine.glob("shapes-*.json"):
        shutil.copy(f, _shapes_cache / f.name)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer ViT (load it with `heads=_tiny.HEADS`) with a 4x4 grid of 8-px patches (32x32 input), 5 classes."""
    from _tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.pth")


@pytest.fixture(scope="session")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 40 x 52 random RGB picture: not square, and not a whole number of the tiny model's patches."""
    from PIL import Image

    path = tmp_path_factory.mktemp("photo") / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 52, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tiny_ckpt: Path):  # noqa: ANN201 - a VitModel
    """`tiny_ckpt` loaded (2 heads), on the CPU."""
    from _hostile import quiet_load
    from _tiny import HEADS

    return quiet_load(tiny_ckpt, heads=HEADS)


@pytest.fixture(scope="session")
def demo():  # noqa: ANN201 - a VitModel
    """The bundled demo model (resources/demo) loaded."""
    import vitviz
    from _hostile import DEMO

    return vitviz.load(DEMO)


@pytest.fixture(scope="session")
def tiny_swin_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny timm Swin v1 hub folder (64 px, 4x4 windows, 2 stages; `_windowed.save_tiny_timm_swin`)."""
    pytest.importorskip("timm")
    from _windowed import save_tiny_timm_swin

    return save_tiny_timm_swin(tmp_path_factory.mktemp("swin"))


@pytest.fixture(scope="session")
def family_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random checkpoints of the newer families, built once: a timm DINOv3 and a Perception Encoder hub folder
    (config.json model_args), a transformers DINOv3 folder (rope_theta) and open_clip's whole CLIP with its
    open_clip_config.json."""
    import json

    import open_clip
    import timm
    import torch
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    root = tmp_path_factory.mktemp("families")
    folders = {}
    torch.manual_seed(0)
    for key, arch, extra in (("dinov3", "vit_small_patch16_dinov3", {}),
                             ("pe", "vit_pe_core_base_patch16_224", dict(img_size=64, attn_pool_num_heads=2))):
        args = dict(embed_dim=64, num_heads=4, depth=2, **extra)
        model = timm.create_model(arch, pretrained=False, num_classes=0, **args)
        folders[key] = root / key
        timm.models._hub.save_for_hf(model, str(folders[key]), model_args=args, safe_serialization=True)
    hf = DINOv3ViTModel(DINOv3ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, image_size=32, patch_size=8, num_register_tokens=2))
    folders["hf-dinov3"] = root / "hf-dinov3"
    hf.save_pretrained(folders["hf-dinov3"])
    clip = open_clip.CLIP(embed_dim=16, vision_cfg=dict(layers=2, width=64, head_width=16, patch_size=8,
                                                        image_size=32),
                          text_cfg=dict(context_length=8, vocab_size=49408, width=32, heads=2, layers=1))
    folders["open_clip"] = root / "open_clip"
    folders["open_clip"].mkdir()
    torch.save(clip.state_dict(), folders["open_clip"] / "open_clip_pytorch_model.bin")
    (folders["open_clip"] / "open_clip_config.json").write_text(json.dumps({"model_cfg": {
        "embed_dim": 16, "vision_cfg": dict(layers=2, width=64, head_width=16, patch_size=8, image_size=32),
        "text_cfg": dict(context_length=8, vocab_size=49408, width=32, heads=2, layers=1)}}))
    return folders
