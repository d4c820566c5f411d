"""Loading a model into the window (`vitviz.gui.model_slot`): a load that fails never replaces the working model
or evicts its cached results, its error names the file, no payload runs and memory stays bounded (issues 13, 25)."""
from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from _gui import wait_idle
from _tiny import tiny_state_dict
from PIL import Image
from safetensors.torch import save_file


def test_a_bad_model_after_a_good_one_keeps_it(qtbot, loaded, tmp_path: Path) -> None:  # noqa: ANN001
    """With a model open, a failed load changes nothing: the box says so, no demo replaces the model."""
    window = loaded
    window.demo_fallback = True
    before = window.session.model.model_path
    bad = tmp_path / "broken.pth"
    bad.write_bytes(b"nope")
    window.load_model(str(bad))
    qtbot.waitUntil(lambda: window.reporter.box is not None and window.reporter.box.isVisible(), timeout=20000)
    wait_idle(qtbot, window)
    assert window.session.model.model_path == before
    assert "still available" in window.reporter.box.informativeText()


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (os.system, (f"touch {self.marker}",))


def _expand(folder: Path) -> Path:     # 20M x 32 floats (2.4 GiB) from a 100 KB file
    path = folder / "expand.pth"
    torch.save({**tiny_state_dict(), "head.weight": torch.zeros(1).expand(20_000_000, 32),
                "head.bias": torch.zeros(1).expand(20_000_000)}, path)
    return path


def _payload(folder: Path) -> Path:
    path = folder / "payload.pth"
    torch.save({"model": tiny_state_dict(), "hook": _Payload(folder / "pwned")}, path)
    return path


def _nan(folder: Path) -> Path:
    path = folder / "nan.pth"
    torch.save({k: torch.full_like(v, float("nan")) for k, v in tiny_state_dict().items()}, path)
    return path


def _bad_config(folder: Path) -> Path:
    hub = folder / "hub"
    hub.mkdir()
    save_file(tiny_state_dict(), str(hub / "model.safetensors"))
    (hub / "config.json").write_text(json.dumps({"architecture": "vit_x", "pretrained_cfg": {"std": [0, 0, 0]}}))
    return hub


def _fifo(folder: Path) -> Path:
    path = folder / "fifo.pth"
    os.mkfifo(path)
    return path


def _peak_rss() -> int:
    """Peak RSS in bytes since the last reset (VmHWM after clear_refs 5 where allowed, else ru_maxrss)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


@pytest.mark.parametrize("make,needle", [(_expand, "broadcast view"), (_payload, "would call posix.system"),
                                         (_nan, "NaN or infinite weights"), (_bad_config, "'pretrained_cfg.std'"),
                                         (_fifo, "named pipe")])
def test_failed_load_keeps_the_model_and_its_cached_results(qtbot, loaded, images, tmp_path: Path,  # noqa: ANN001
                                                            make: Callable[[Path], Path], needle: str) -> None:
    w = loaded
    spec, device = w.session.model.spec, w.session.model.device
    cached = w.session.cached_paths()
    assert cached and w.session.result(str(images[0])) is not None
    bad = make(tmp_path)
    _reset_peak()
    before = _peak_rss()
    w.load_model(str(bad))
    qtbot.waitUntil(lambda: w.reporter.box is not None and w.reporter.box.isVisible(), timeout=20000)
    wait_idle(qtbot, w)
    assert w.reporter.box.windowTitle() == "Could not load model"
    assert bad.name in w.reporter.box.text() and needle in w.reporter.box.text(), w.reporter.box.text()
    assert w.session.model.spec is spec and w.session.model.device == device        # the working model is still loaded ...
    assert w.session.cached_paths() == cached                            # ... with every cached result
    assert w.session.result(str(images[0])) is not None
    assert not (tmp_path / "pwned").exists()
    assert _peak_rss() - before < 300 << 20
    w.reporter.box.close()
    later = images[0].parent / "later.png"
    Image.new("RGB", (40, 40), "blue").save(later)
    w.session.add_images([str(later)])                                    # and it still runs images
    wait_idle(qtbot, w)
    assert w.session.result(str(later)) is not None


def test_load_error_without_a_path_in_its_message_names_the_file(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    """An override refused (its message is about the override) still names the checkpoint in the error box."""
    w = loaded
    w.load_model(str(tiny_ckpt), heads=0)
    qtbot.waitUntil(lambda: w.reporter.box is not None and w.reporter.box.isVisible(), timeout=20000)
    assert tiny_ckpt.name in w.reporter.box.text() and "override heads 0;" in w.reporter.box.text()
