"""Regenerate the README screenshots of the window.

    xvfb-run -a -s "-screen 0 1600x1000x24" python resources/screenshots/make_screenshots.py

Also writes one picture per analysis dock (panel_*.png). Uses a ViT-B/16-shaped checkpoint with random weights (written to a temporary folder; no download) and the sample
photos in resources/samples (a drawn scene when they are missing), so the maps show the window's features, not what a trained model attends to. Each view is produced the
way a user gets it: `--screenshot` for the first, the window's own controls for the others.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def draw_scene(path: Path, mirror: bool = False) -> Path:
    from PIL import Image, ImageDraw, ImageFilter

    img = Image.new("RGB", (320, 240))
    d = ImageDraw.Draw(img)
    for y in range(240):
        d.line([(0, y), (320, y)], fill=(90, 140, int(120 + 100 * y / 240)))
    d.rectangle([0, 170, 320, 240], fill=(70, 120, 60))
    d.ellipse([60, 70, 170, 180], fill=(230, 170, 60))
    d.ellipse([90, 95, 110, 115], fill=(30, 30, 30))
    d.ellipse([125, 95, 145, 115], fill=(30, 30, 30))
    d.polygon([(200, 180), (250, 60), (300, 180)], fill=(150, 80, 70))
    img = img.filter(ImageFilter.GaussianBlur(1))
    (img.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if mirror else img).save(path)
    return path


def main() -> int:
    import torch
    from _tiny import tiny_state_dict
    from PySide6.QtCore import QSettings

    from vitviz.gui.app import ensure_app
    from vitviz.gui.window import MainWindow

    tmp = Path(tempfile.mkdtemp())
    sd = tiny_state_dict(embed_dim=768, depth=12, patch=16, grid=(14, 14), num_classes=1000)
    for key in sd:
        if key.endswith("attn.qkv.weight"):
            sd[key] *= 0.12          # softer attention than raw random weights, so maps follow the image
        if key == "pos_embed":
            sd[key] *= 0.1
    ckpt = tmp / "vit_b16_random.pth"
    torch.save(sd, ckpt)
    samples = sorted((ROOT / "resources" / "samples").glob("*.jpg"))
    if samples:
        scene, *others = samples
    else:
        scene, others = draw_scene(tmp / "scene.png"), [draw_scene(tmp / "scene_mirrored.png", mirror=True)]
    app = ensure_app()
    win = MainWindow(QSettings(str(tmp / "s.ini"), QSettings.Format.IniFormat))
    win.persist_settings = False
    win.resize(1500, 920)
    win.show()
    win.load_model(str(ckpt), heads=12)
    win.add_images([str(scene), *map(str, others)])
    _wait(app, lambda: win.is_idle() and win.session.result(str(scene)) is not None)
    shots = {
        "window_cls.png": dict(source="cls", layer=3, head="mean", colormap="inferno", opacity=0.55,
                               per_tile=True, normalize=True),
        "window_patch_query.png": dict(source="token", query=1 + 6 * 14 + 4, layer=8, head=5, show_grid=True,
                                       colormap="turbo", opacity=0.5, smooth=False),
        "window_rollout.png": dict(source="rollout", query=None, layer=11, show_grid=False, colormap="viridis",
                                   smooth=True, opacity=0.6),
    }
    for name, values in shots.items():
        win.state.update(**values)
        for _ in range(5):
            app.processEvents()
        win.grab().save(str(HERE / name))
        print("wrote", HERE / name)
    panel_shots(app, win, scene, others)
    win.close()
    return 0


PANEL_SHOTS = {
    "panel_matrix.png": ("matrixDock", dict(source="token", query=1 + 6 * 14 + 4, layer=5, head="mean",
                                            matrix_log=True, colormap="viridis", opacity=0.6)),
    "panel_rollout.png": ("rolloutDock", dict(source="rollout", query=None, layer=11, rollout_fusion="max",
                                              rollout_discard=0.6, rollout_residual=0.5, colormap="inferno")),
    "panel_posembed.png": ("posEmbedDock", dict(colormap="viridis")),
    "panel_headstats.png": ("headStatsDock", dict(layer=9, head=3, stats_average=True)),
    "panel_info.png": ("infoDock", dict()),
}


def panel_shots(app, win, scene: Path, others: list) -> None:  # noqa: ANN001
    """One picture per analysis dock: the dock floated at a readable size, driven through the view state."""
    for name, (dock_name, values) in PANEL_SHOTS.items():
        win.state.update(**values)
        dock = win.dock(dock_name)
        dock.setFloating(True)
        dock.resize(*((760, 820) if dock_name == "infoDock" else (980, 700)))
        dock.show()
        dock.raise_()
        if dock_name == "posEmbedDock":
            win.posembed.hover(4, 9)
        for _ in range(10):
            app.processEvents()
        dock.grab().save(str(HERE / name))
        print("wrote", HERE / name)
        dock.setFloating(False)
    win.reset_layout()
    for _ in range(5):
        app.processEvents()


def _wait(app, condition, timeout_s: float = 300) -> None:  # noqa: ANN001
    import time

    end = time.time() + timeout_s
    while not condition():
        if time.time() > end:
            raise TimeoutError("the window did not become idle")
        app.processEvents()
        time.sleep(0.01)


if __name__ == "__main__":
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb" if os.environ.get("DISPLAY") else "offscreen")
    raise SystemExit(main())
