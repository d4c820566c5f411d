"""The Models menu (checkpoints in temporary torch hub / Hugging Face caches, recent files, named models) and
named models on the command line, resolved from a temporary cache or a file:// URL: never the network."""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from _gui import answer_heads, parse, wait_idle
from PySide6.QtWidgets import QInputDialog

from vitviz import catalog
from vitviz.demo import sample_photos
from vitviz.gui import settings as st
from vitviz.gui.app import apply_args

TV_FILE = "vit_b_16-c867db91.pth"       # torchvision's file name of torchvision:vit_b_16 (IMAGENET1K_V1)


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Empty torch hub and Hugging Face caches, selected through the environment as a user would."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    torch_dir, hf_dir = tmp_path / "torch" / "hub" / "checkpoints", tmp_path / "hf" / "hub"
    torch_dir.mkdir(parents=True)
    hf_dir.mkdir(parents=True)
    return torch_dir, hf_dir


def hf_snapshot(hf_dir: Path, repo: str, weights: Path) -> Path:
    """A Hugging Face hub cache entry (refs/main -> snapshots/REV with config.json and the weights)."""
    root = hf_dir / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("0123abcd")
    (snap / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch8_32", "num_classes": 5}))
    shutil.copy(weights, snap / "model.safetensors")
    return snap


def scan(qtbot, window) -> None:  # noqa: ANN001
    """Open the Models menu's scan (what showing the menu does) and wait for the answer."""
    with qtbot.waitSignal(window.models.scanned, timeout=60000):
        window.menus.models.aboutToShow.emit()


def texts(menu) -> list[str]:  # noqa: ANN001
    return [a.text() for a in menu.actions() if not a.isSeparator()]


def test_menu_lists_the_caches_and_recent_files_and_loads_a_choice(qtbot, window, caches, tiny_ckpt,  # noqa: ANN001
                                                                   tiny_ckpt_b) -> None:
    torch_dir, hf_dir = caches
    cached = torch_dir / TV_FILE
    shutil.copy(tiny_ckpt, cached)
    (torch_dir / "resnet50-11ad3fa6.pth").write_bytes(b"\0" * 10)            # not a ViT: not listed
    snap = hf_snapshot(hf_dir, "someone/vit-tiny", tiny_ckpt_b)
    st.add_recent_model(window.settings, str(tiny_ckpt_b))
    assert "Looking for checkpoints…" in " ".join(texts(window.menus.models))  # before the first scan: nothing
    scan(qtbot, window)
    menu_texts = texts(window.menus.models)
    assert menu_texts[0].startswith("&Demo model") or menu_texts[0].startswith("Demo model (not installed)")
    entries = window.models.actions_for()
    size = catalog.format_size(cached.stat().st_size)
    assert entries[str(cached)].text() == f"vit_b_16 · IMAGENET1K_V1\ttorchvision · {size} · torch hub"
    assert entries[str(snap)].text().startswith("someone/vit-tiny\ttimm · ")
    assert entries[str(tiny_ckpt_b)].text().startswith("tiny_b.safetensors\tunknown · ")
    assert "recent" in entries[str(tiny_ckpt_b)].text()
    assert not any("resnet" in t for t in menu_texts)
    named = dict((a.data(), a.text()) for a in window.models.named_menu.actions() if a.data())
    assert named["torchvision:vit_b_16:IMAGENET1K_V1"].endswith("\tcached")
    assert "\tdownload " in named["torchvision:vit_l_16:IMAGENET1K_V1"]
    assert len(named) == len(catalog.named_models())
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=60000):
        entries[str(cached)].trigger()
    if window.session.model.awaiting_answers:        # the tiny file under a torchvision name holds no head count
        answer_heads(qtbot, window, None)
    assert window.session.model.model_path == str(cached)
    assert window.images.paths() == [str(p) for p in sample_photos()]      # an empty list gets the photos
    wait_idle(qtbot, window, timeout=60000)
    assert window.session.result(window.session.image_list.current) is not None
    assert window.models.stale and st.recent_models(window.settings)[0] == str(cached)


def test_empty_caches_say_where_they_looked_and_refresh_finds_new_files(qtbot, window, caches,  # noqa: ANN001
                                                                        tiny_ckpt) -> None:
    torch_dir, _ = caches
    scan(qtbot, window)
    assert any(t.strip().startswith("None found in") and str(torch_dir.parent.parent) in t
               for t in texts(window.menus.models))
    shutil.copy(tiny_ckpt, torch_dir / "deit_tiny_patch16_224-a1311bcf.pth")
    window.menus.models.aboutToShow.emit()              # not stale: shows what it has, scans nothing
    assert not window.models.scanning
    with qtbot.waitSignal(window.models.scanned, timeout=60000):
        window.models.refresh_action.trigger()
    assert str(torch_dir / "deit_tiny_patch16_224-a1311bcf.pth") in window.models.actions_for()


def test_named_model_on_the_command_line_uses_the_cache(qtbot, window, caches, tiny_ckpt) -> None:  # noqa: ANN001
    torch_dir, _ = caches
    shutil.copy(tiny_ckpt, torch_dir / TV_FILE)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=60000):
        apply_args(window, parse("--model", "torchvision:vit_b_16", "--heads", "2"))
    assert window.session.model.model_path == "torchvision:vit_b_16"
    assert window.session.model.spec.num_heads == 2 and window.session.model.spec.grid == (4, 4)
    assert window.images.paths() == [str(p) for p in sample_photos()]
    wait_idle(qtbot, window, timeout=60000)
    assert window.reporter.errors == []


def test_named_model_is_downloaded_with_progress(qtbot, window, caches, tiny_ckpt,  # noqa: ANN001
                                                 monkeypatch) -> None:
    torch_dir, _ = caches
    monkeypatch.setattr(catalog, "resolve_named", functools.partial(catalog.resolve_named, url=tiny_ckpt.as_uri(),
                                                                    check_hash=False))
    progress: list[tuple[str, float]] = []
    window.session.client.progress.connect(lambda text, fraction: progress.append((text, fraction)))
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=60000):
        window.choose_model("torchvision:vit_b_32")
    assert (torch_dir / "vit_b_32-d86f8d99.pth").read_bytes() == tiny_ckpt.read_bytes()
    assert progress[0][1] == 0.0 and progress[-1][1] == 1.0
    assert progress[-1][0].startswith("Downloading torchvision:vit_b_32: 100% (")
    wait_idle(qtbot, window, timeout=60000)
    assert not window.busy_bar.isVisible() and window.busy_bar.maximum() == 0   # back to a busy indicator


def test_offline_named_model_shows_the_catalogs_message(qtbot, window, caches, tmp_path,  # noqa: ANN001
                                                        monkeypatch) -> None:
    torch_dir, _ = caches
    offline = (tmp_path / "offline" / "vit_l_16.pth").as_uri()
    monkeypatch.setattr(catalog, "resolve_named", functools.partial(catalog.resolve_named, url=offline))
    with qtbot.waitSignal(window.session.error, timeout=60000) as blocker:
        apply_args(window, parse("--model", "torchvision:vit_l_16"))
    title, summary, details = blocker.args
    assert title == "Could not load model"
    assert "vit_l_16-852ce7e3.pth" in summary and str(torch_dir) in summary
    qtbot.waitUntil(lambda: window.reporter.box is not None and window.reporter.box.isVisible())
    assert window.reporter.box.text() == summary and "DownloadError" in details
    assert window.session.model.spec is None and list(torch_dir.iterdir()) == []


def test_demo_entry_loads_the_demo_and_keeps_the_users_images(qtbot, window, caches, fake_demo,  # noqa: ANN001
                                                              tmp_path) -> None:
    ckpt, demo_images = fake_demo
    scan(qtbot, window)
    demo = next(a for a in window.menus.models.actions() if a.objectName() == "demo_model")
    assert demo.isEnabled()
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=60000):
        demo.trigger()
    assert window.images.paths() == [str(p) for p in demo_images]
    assert window.models.stale                      # the next show scans again
    wait_idle(qtbot, window, timeout=60000)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=60000):
        window.choose_model(str(ckpt))              # a list with images is left as it is
    assert window.images.paths() == [str(p) for p in demo_images]


def test_unreadable_folders_are_named_in_the_menu(qtbot, window, caches, tiny_ckpt, tiny_ckpt_b,  # noqa: ANN001
                                                  monkeypatch) -> None:
    """Folders the scan cannot read are left out and named in a disabled item whose tooltip says why; the rest is
    listed. The scan's `skipped` travels through the worker's answer."""
    from vitviz.gui.models_menu import _home

    torch_dir, hf_dir = caches
    shutil.copy(tiny_ckpt, torch_dir / "deit_tiny_patch16_224-a1311bcf.pth")
    readable = hf_snapshot(hf_dir, "someone/vit-tiny", tiny_ckpt_b)
    locked = [hf_snapshot(hf_dir, f"someone/vit-locked{i}", tiny_ckpt_b).parent.parent for i in (1, 2)]
    real_iterdir = Path.iterdir

    def iterdir(self: Path):  # noqa: ANN202 - permission denied on the locked repositories' snapshot folders
        if self.parent in locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    answers: list[object] = []
    window.session.catalog_ready.connect(answers.append)
    scan(qtbot, window)
    assert [s.path for s in answers[0].entries.skipped] == locked     # the worker's answer keeps `skipped`
    assert set(window.models.actions_for()) >= {str(torch_dir / "deit_tiny_patch16_224-a1311bcf.pth"), str(readable)}
    assert not any("locked" in key for key in window.models.actions_for())
    item = next(a for a in window.menus.models.actions() if a.objectName() == "skipped_folders")
    assert item.text().strip().startswith("Skipped 2 unreadable folders") and not item.isEnabled()
    tip = item.toolTip().splitlines()
    assert tip[1:] == [f"{_home(repo)}: Permission denied ({repo / 'snapshots'})" for repo in locked]
    assert texts(window.menus.models).index(item.text()) < texts(window.menus.models).index("&Refresh")

    monkeypatch.setattr(Path, "iterdir", real_iterdir)                # readable again: Refresh drops the item
    with qtbot.waitSignal(window.models.scanned, timeout=60000):
        window.models.refresh_action.trigger()
    assert not any(a.objectName() == "skipped_folders" for a in window.menus.models.actions())
    assert {str(locked[0] / "snapshots" / "0123abcd"), str(readable)} <= set(window.models.actions_for())
    assert window.reporter.errors == []


def test_one_unreadable_cache_with_nothing_else(qtbot, window, caches, monkeypatch) -> None:  # noqa: ANN001
    """A whole cache that cannot be listed: the menu still says where it looked, and names the one folder."""
    from vitviz.gui.models_menu import _home

    torch_dir, _ = caches
    skipped = catalog.ScanResult(skipped=[catalog.Skipped(torch_dir, "Input/output error")])
    monkeypatch.setattr(catalog, "scan", lambda recent=(), **_kw: skipped)
    scan(qtbot, window)
    item = next(a for a in window.menus.models.actions() if a.objectName() == "skipped_folders")
    assert item.text().strip().startswith("Skipped 1 unreadable folder ") and not item.isEnabled()
    assert item.toolTip().splitlines()[1:] == [f"{_home(torch_dir)}: Input/output error"]
    assert any(t.strip().startswith("None found in") for t in texts(window.menus.models))


@pytest.mark.parametrize("name, needle", [
    ("hf:acme/tiny@../../../x", "revision '../../../x' holds '..'"),
    ("hf:acme/tiny@/etc/evil", "revision '/etc/evil'"),
    ("hf:acme/tiny@ma\u00efn", "non-ASCII"),
    ("hf:a--b/c", "'--'"),
    ("hf:org/name.git", ".git"),
    ("torchvision:vit_b_16:../x", "weights '../x'"),
])
def test_open_by_name_refuses_what_the_library_refuses(qtbot, window, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                                       tmp_path: Path, name: str, needle: str) -> None:
    asked: list[str] = []
    monkeypatch.setattr(window.session, "load_model", lambda path, device=None, **kw: asked.append(path))
    monkeypatch.setattr(QInputDialog, "getText", lambda *_a, **_k: (name, True))
    window.models.by_name_action.trigger()
    assert asked == []
    title, text = window.reporter.errors[-1][:2]
    assert title == "Not a model name" and needle in text and "expected" in text
    window.reporter.box.close()
