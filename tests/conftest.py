"""Shared fixtures for every test: Qt without a display, and the tiny checkpoint most tests load.

The tests mirror the package (tests/core/reading/ tests vitviz/core/reading/, tests/gui/ vitviz/gui/, ...; package/
holds the whole package's tests, parity/ the parity with the original implementations). Helper code lives in modules
beside this file (`_tiny.py`: tiny timm-layout checkpoints; `_rollout_ref.py`: the test-side rollout reference;
`parity_refs.py`, `tutorial_refs.py`, `parity_towers.py`: the original implementations parity tests compare with).
pytest puts this folder on `sys.path` (it imports this conftest in its default "prepend" mode), so tests in every
folder import them by name; test files need unique names (no `__init__.py` anywhere).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Every spec any test builds, of every family, is walked field by field: a setting that changes the computation
# without a provenance entry, with a source of no known kind, or assumed and not flagged fails the test that built
# it (vitviz.core.spec.audit_provenance; tests/core/test_provenance.py shows the audit can fail).
os.environ.setdefault("VITVIZ_AUDIT", "1")


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
