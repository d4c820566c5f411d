"""`vitviz.load` takes every name the command line takes (`hf:`, `timm:`, `torchvision:`), through the same
resolution (`vitviz.catalog.named.resolve_model_arg`), against a fake hub on 127.0.0.1 that huggingface_hub itself
writes into its cache from (no internet). The README's notebook snippet is run here as written.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from _fakehub import COMMIT, FakeHub, hf_repo, timm_repo
from PIL import Image

import vitviz
from vitviz.catalog import hub
from vitviz.catalog.named import DownloadError

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture()
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    tiny_hf = hf_repo(tmp_path)
    repos = {"timm/vit_tiny_patch8_32.test": timm_repo(), "acme/tiny-vit": tiny_hf,
             "facebook/dinov2-small": tiny_hf}   # the README's name, served with a tiny ViT
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_load_by_hub_name_downloads_with_progress_then_uses_the_cache(fake_hub: FakeHub, tmp_path: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    model = vitviz.load("timm:vit_tiny_patch8_32.test", progress=lambda d, t: seen.append((d, t)))
    assert model.spec.num_heads == 2 and model.spec.image_size == (32, 32)
    assert seen and seen[-1][0] == seen[-1][1]
    # huggingface_hub's own layout: models--ORG--NAME/snapshots/<commit>/ with refs/main
    snap = tmp_path / "hf-cache" / "models--timm--vit_tiny_patch8_32.test" / "snapshots" / COMMIT
    assert (snap / "model.safetensors").exists()
    fake_hub.gets.clear()
    assert vitviz.load("timm:vit_tiny_patch8_32.test", offline=True).spec.num_heads == 2
    assert fake_hub.gets == []


def test_load_by_name_with_revision_and_offline_rules(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubError, match="acme/tiny-vit"):   # not cached, offline: nothing asked
        vitviz.load("hf:acme/tiny-vit")
    assert fake_hub.gets == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert vitviz.load(f"hf:acme/tiny-vit@{COMMIT}").spec.num_heads == 4
    # a commit was fetched, `main` never resolved: offline, the cache has the repository but not that revision
    with pytest.raises(hub.HubError, match="holds acme/tiny-vit but not its revision 'main'"):
        vitviz.load("hf:acme/tiny-vit", offline=True)
    assert vitviz.load("hf:acme/tiny-vit").spec.num_heads == 4
    fake_hub.gets.clear()
    assert vitviz.load("hf:acme/tiny-vit", offline=True).spec.num_heads == 4 and fake_hub.gets == []
    with pytest.raises(hub.HubError, match="no revision 'v9'"):
        vitviz.load("hf:acme/tiny-vit@v9")
    with pytest.raises(hub.HubError, match="expected"):   # a malformed revision, refused before the hub is asked
        vitviz.load("hf:acme/tiny-vit@../x")


def test_load_torchvision_name_offline_names_the_file_and_folder(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    with pytest.raises(DownloadError) as info:
        vitviz.load("torchvision:vit_b_16", offline=True)
    assert "vit_b_16-c867db91.pth" in str(info.value) and str(tmp_path / "torch") in str(info.value)


def test_the_cli_resolves_through_the_same_function(monkeypatch: pytest.MonkeyPatch) -> None:
    import vitviz.cli.models as models

    calls: list[str] = []
    monkeypatch.setattr(models, "resolve_model_arg", lambda text, progress=None, offline=None: calls.append(text)
                        or "x.pth")
    assert models.resolve_cli_model("timm:vit_tiny_patch8_32.test", quiet=True) == "x.pth"
    assert calls == ["timm:vit_tiny_patch8_32.test"]


def test_readme_notebook_snippet_runs_as_written(fake_hub: FakeHub, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    section = README.read_text(encoding="utf-8").split("### In a notebook", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'vitviz.load("hf:facebook/dinov2-small")' in code
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(tmp_path / "cat.jpg")
    monkeypatch.chdir(tmp_path)
    scope: dict = {"vitviz": vitviz}
    exec(compile(code, "README.md", "exec"), scope)   # noqa: S102 -- the README's own snippet
    result = scope["result"]
    assert result._repr_png_().startswith(b"\x89PNG")   # what Jupyter shows for the bare `result` line
    assert len(repr(result)) < 500
