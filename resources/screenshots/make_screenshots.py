"""Regenerate the README screenshots of the window.

    xvfb-run -a -s "-screen 0 1600x1000x24" python resources/screenshots/make_screenshots.py [--only demo|photos]

`first_run.png` is what `vitviz` with no arguments shows (made through `--screenshot`, like a user would). The
window_*.png views (the window at 1500 × 920, its default layout for that size) and one panel_*.png per dock
(controls, images, overview, matrix, rollout, position embedding, head statistics, model info) use the bundled
demo model (a small ViT trained on the shapes task, so the maps,
the rollout, the position embedding and the head statistics show what a trained model learned) on the shipped
shapes images, driven through the window's own view state. `photos_random_vitb.png` shows the sample photographs
under a ViT-B/16-shaped checkpoint with *random* weights (no download offline): it shows the window at ImageNet
scale, not what a trained ImageNet model attends to.

`--only docks` makes `dock_1280x800_*.png`: every dock as the default layout of a 1280 × 800 screen has it (the
window at 1216 × 736, the dock raised in place, not floated; the Features dock once per view), with the demo, and
the Positions dock of an EVA-02-shaped model with random weights (a learned table and RoPE, both shown): what a
newcomer on a small screen sees, to look at before a layout change is done.

`--only docks` then makes the same at 1280 × 800 for a windowed model (`dock_1280x800_swin_*.png`,
`window_1280x800_swin.png`: Swin-T's shape with random weights, its 24-head last stage selected), the Compare dock
(the demo against a noisy copy) and the Timeline dock (a made-up run blending random weights into the demo's);
`--only swin` / `--only compare` make those alone. Pictures over 150 kB are stored with a 256-colour palette.

`--only models` makes the pictures of models the demo is not: `panel_posembed_rope.png` (the Positions dock of a
DINOv3-shaped RoPE ViT-S/16 with random weights, saved as a timm hub folder: what RoPE does to attention depends on
its settings, not on trained weights) and `dialog_heads.png` ("what the file does not say": the question the window
asks when a checkpoint does not say how many heads it has, nor its norm order, activation and attention scale;
`--only dialog` makes it alone).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
OUT = HERE


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate the screenshots in resources/screenshots.")
    parser.add_argument("--only", choices=("demo", "photos", "models", "dialog", "docks", "swin", "compare"),
                        help="only the demo-model, the photo or the other models' screenshots (or only the "
                             "assumptions dialog, or only the docks at 1280 x 800)")
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write to (default: this one)")
    args = parser.parse_args(argv)
    global OUT
    OUT = args.out
    OUT.mkdir(parents=True, exist_ok=True)
    from vitviz.gui.app import ensure_app
    from vitviz.gui.bundled import demo_model

    app = ensure_app()
    if args.only in (None, "demo"):
        if demo_model() is None:
            sys.stderr.write("the demo model is missing: python -m vitviz.demo.train --out resources/demo\n")
            return 1
        first_run_shot()
        demo_shots(app)
    if args.only in (None, "photos"):
        photo_shot(app)
    if args.only in (None, "models"):
        rope_shot(app)
    if args.only in (None, "models", "dialog"):
        assumptions_dialog_shot(app)
    if args.only in (None, "docks"):
        dock_shots(app)
    if args.only in ("swin", "compare"):          # one part of `docks` alone
        from PySide6.QtCore import QRect

        from vitviz.gui.window import default_size

        size = default_size(QRect(0, 0, *SMALL_SCREEN))
        tag = f"{SMALL_SCREEN[0]}x{SMALL_SCREEN[1]}"
        (swin_dock_shots if args.only == "swin" else compare_and_run_shots)(app, size, tag)
    return 0


def first_run_shot() -> None:
    """`vitviz` with no arguments, through `--screenshot` in a fresh process (no settings of the user's)."""
    out = OUT / "first_run.png"
    env = {k: v for k, v in os.environ.items() if k != "VITVIZ_SETTINGS"}
    subprocess.run([sys.executable, str(ROOT / "main.py"), "--screenshot", str(out)], check=True, env=env)
    print("wrote", out)


def new_window(app, tmp: Path, size: tuple[int, int] = (1500, 920)):  # noqa: ANN001, ANN201
    from PySide6.QtCore import QSettings

    from vitviz.gui.window import MainWindow

    from PySide6.QtCore import QSize

    win = MainWindow(QSettings(str(tmp / "s.ini"), QSettings.Format.IniFormat))
    win.persist_settings = False
    win.use_size(QSize(*size))          # the default layout for that size, as a user's first start has it
    win.show()
    return win


def target_token(index: int) -> int:
    """The token of the patch at the centre of the target shape in shipped demo image `index` (0-based)."""
    from vitviz.demo.samples import pick_samples
    from vitviz.demo.shapes import PATCH_SIZE

    x0, y0, x1, y1 = pick_samples()[index][1].box
    grid_w = 64 // PATCH_SIZE
    return 1 + ((y0 + y1) // 2 // PATCH_SIZE) * grid_w + (x0 + x1) // 2 // PATCH_SIZE


def demo_shots(app) -> None:  # noqa: ANN001
    """The window and every analysis dock with the demo model on the shapes images."""
    from vitviz.gui.bundled import demo_model, images_for

    win = new_window(app, Path(tempfile.mkdtemp()))
    demo = demo_model()
    images = images_for(demo)
    win.load_demo()
    _wait(app, lambda: win.is_idle() and all(win.session.result(p) is not None for p in images))
    _settle(app)
    query = target_token(0)
    last = win.session.model.spec.depth - 1
    shots = {
        "window_cls.png": dict(source="cls", layer=last, head="mean", colormap="inferno", opacity=0.55,
                               per_tile=True, normalize=True, smooth=True),
        "window_patch_query.png": dict(source="token", query=query, layer=last, head="mean", show_grid=True,
                                       colormap="turbo", opacity=0.5, smooth=False),
        "window_rollout.png": dict(source="rollout", query=None, layer=last, show_grid=False, colormap="viridis",
                                   smooth=True, opacity=0.6),
    }
    for name, values in shots.items():
        win.state.update(**values)
        _settle(app)
        win.grab().save(str(OUT / name))
        print("wrote", OUT / name)
    win.state.update(source="cls", query=None)
    panel_shots(app, win, query, last)
    win.close()


def photo_shot(app) -> None:  # noqa: ANN001
    """The sample photographs under a ViT-B/16-shaped checkpoint with random weights (no download)."""
    import torch
    from _tiny import tiny_state_dict

    from vitviz.demo import sample_photos

    tmp = Path(tempfile.mkdtemp())
    sd = tiny_state_dict(embed_dim=768, depth=12, patch=16, grid=(14, 14), num_classes=1000)
    for key in sd:
        if key.endswith("attn.qkv.weight"):
            sd[key] *= 0.12          # softer attention than raw random weights, so maps follow the image
        if key == "pos_embed":
            sd[key] *= 0.1
    ckpt = tmp / "vit_b16_random.pth"
    torch.save(sd, ckpt)
    photos = [str(p) for p in sample_photos()] or [str(draw_scene(tmp / "scene.png"))]
    win = new_window(app, tmp)
    win.load_model(str(ckpt), heads=12)
    win.session.add_images(photos)
    _wait(app, lambda: win.is_idle() and win.session.result(photos[0]) is not None)
    win.state.update(source="cls", layer=3, head="mean", colormap="inferno", opacity=0.55, per_tile=True,
                     normalize=True)
    _settle(app)
    win.grab().save(str(OUT / "photos_random_vitb.png"))
    print("wrote", OUT / "photos_random_vitb.png")
    win.close()


def rope_shot(app) -> None:  # noqa: ANN001
    """The Positions dock of a RoPE model: a DINOv3-shaped ViT-S/16 (2 blocks, random weights) as a timm hub folder."""
    import warnings

    import timm

    from vitviz.demo import sample_photos

    tmp = Path(tempfile.mkdtemp())
    args = dict(depth=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = timm.create_model("vit_small_patch16_dinov3", pretrained=False, num_classes=0, **args)
    folder = tmp / "vit_small_patch16_dinov3_random"
    timm.models._hub.save_for_hf(model, str(folder), model_args=args, safe_serialization=True)
    photos = [str(p) for p in sample_photos()] or [str(draw_scene(tmp / "scene.png"))]
    win = new_window(app, tmp)
    win.load_model(str(folder))
    win.session.add_images(photos)
    _wait(app, lambda: win.is_idle() and win.session.result(photos[0]) is not None and win.session.model.rope is not None)
    win.state.update(source="cls", layer=1, head="mean", colormap="viridis")
    dock = win.dock("posEmbedDock")
    dock.setFloating(True)
    dock.resize(980, 620)
    dock.show()
    dock.raise_()
    _settle(app)
    win.posembed.hover(4, 9)
    _settle(app)
    dock.grab().save(str(OUT / "panel_posembed_rope.png"))
    print("wrote", OUT / "panel_posembed_rope.png")
    win.close()


def assumptions_dialog_shot(app) -> None:  # noqa: ANN001
    """The window asking what a checkpoint does not say (a bare state dict of width 128, a width no registered ViT
    has, as a tutorial's training script saves it: its head count is a guess, and nothing names the model, so its
    norm order, activation and attention scale are assumed too), drawn over the window where it opens, with the
    status bar's verdict line below it."""
    import torch
    from _tiny import tiny_state_dict
    from PySide6.QtGui import QPainter

    from vitviz.demo import sample_photos

    tmp = Path(tempfile.mkdtemp())
    ckpt = tmp / "my_vit.pth"
    torch.save(tiny_state_dict(embed_dim=128, depth=4, patch=16, grid=(14, 14), num_classes=10), ckpt)
    photos = [str(p) for p in sample_photos()] or [str(draw_scene(tmp / "scene.png"))]
    win = new_window(app, tmp)
    win.session.add_images(photos)
    win.load_model(str(ckpt))
    _wait(app, lambda: win.assumptions_dialog is not None and win.assumptions_dialog.isVisible() and win.is_idle())
    _settle(app, 20)
    dialog = win.assumptions_dialog
    shot = win.grab()
    painter = QPainter(shot)
    where = win.mapFromGlobal(dialog.mapToGlobal(dialog.rect().topLeft()))
    if not win.rect().contains(where):          # no window manager placed it: centre it over the window
        where = win.rect().center() - dialog.rect().center()
    painter.drawPixmap(where, dialog.grab())
    painter.end()
    shot.save(str(OUT / "dialog_heads.png"))
    print("wrote", OUT / "dialog_heads.png")
    dialog.reject()
    win.close()


SMALL_SCREEN = (1280, 800)
DOCK_NAMES = {"overviewDock": "overview", "matrixDock": "matrix", "rolloutDock": "rollout",
              "posEmbedDock": "posembed", "headStatsDock": "headstats", "featuresDock": "features",
              "infoDock": "info", "imagesDock": "images", "controlsDock": "controls"}


def dock_shots(app, screen: tuple[int, int] = SMALL_SCREEN) -> None:  # noqa: ANN001
    """Every dock in place in the default layout of a `screen`-sized screen: the demo's, and EVA-02's Positions."""
    from PySide6.QtCore import QRect

    from vitviz.gui.bundled import demo_model, images_for
    from vitviz.gui.window import default_size

    size = default_size(QRect(0, 0, *screen))
    tag = f"{screen[0]}x{screen[1]}"
    win = new_window(app, Path(tempfile.mkdtemp()), (size.width(), size.height()))
    images = images_for(demo_model())
    win.load_demo()
    _wait(app, lambda: win.is_idle() and all(win.session.result(p) is not None for p in images))
    win.state.update(source="token", query=target_token(0), layer=win.session.model.spec.depth - 1, head="mean")
    drawn: list[str] = []
    win.features.shown.connect(drawn.append)
    for dock_name, short in DOCK_NAMES.items():
        dock = win.dock(dock_name)
        dock.raise_()
        _settle(app, 20)
        views = ("pca", "similarity", "norms") if dock_name == "featuresDock" else ("",)
        for view in views:
            if view:
                drawn.clear()
                win.features.show_tab(view)
                _wait(app, lambda view=view: view in drawn and win.is_idle())
            _settle(app, 20)
            name = OUT / f"dock_{tag}_{short}{'_' + view if view else ''}.png"
            dock.grab().save(str(name))
            print("wrote", name)
    win.close()
    eva02_positions_shot(app, size, tag)
    swin_dock_shots(app, size, tag)
    compare_and_run_shots(app, size, tag)


WINDOW_MAX_BYTES = 150_000     # a dock picture above this is stored with a 256-colour palette


def save_small(widget, path: Path) -> None:  # noqa: ANN001
    """Save a widget's picture, with a 256-colour palette when the full colours would be large."""
    from PIL import Image

    widget.grab().save(str(path))
    if path.stat().st_size > WINDOW_MAX_BYTES:
        Image.open(path).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print("wrote", path, path.stat().st_size, "bytes")


def swin_dock_shots(app, size, tag: str) -> None:  # noqa: ANN001
    """Every analysis dock with a windowed model: Swin-T's shape (4 stages, 3 to 24 heads, 7 × 7 windows) with
    random weights as a timm hub folder, the last stage's block selected (its 24 heads)."""
    import warnings

    import timm

    from vitviz.demo import sample_photos

    tmp = Path(tempfile.mkdtemp())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=10)
    folder = tmp / "swin_tiny_random"
    timm.models._hub.save_for_hf(model, str(folder), model_args=dict(num_classes=10), safe_serialization=True)
    photos = [str(p) for p in sample_photos()][:2] or [str(draw_scene(tmp / "scene.png"))]
    win = new_window(app, tmp, (size.width(), size.height()))
    win.load_model(str(folder))
    win.session.add_images(photos)
    _wait(app, lambda: win.is_idle() and win.session.result(photos[0]) is not None)
    win.state.update(layer=win.session.model.spec.depth - 1, head="mean")    # the map the window picks for Swin
    _settle(app, 20)
    save_small(win, OUT / f"window_{tag}_swin.png")
    for dock_name in ("overviewDock", "matrixDock", "rolloutDock", "posEmbedDock", "headStatsDock", "featuresDock",
                      "infoDock"):
        dock = win.dock(dock_name)
        dock.raise_()
        _settle(app, 20)
        save_small(dock, OUT / f"dock_{tag}_swin_{DOCK_NAMES[dock_name]}.png")
    win.close()


def compare_and_run_shots(app, size, tag: str) -> None:  # noqa: ANN001
    """The Compare dock (the demo against a copy with every weight moved by noise) and the Timeline dock (a
    'training run' of the demo: checkpoints blending random weights into the trained ones), in place."""
    import torch
    from safetensors.torch import load, save_file

    from vitviz.gui.bundled import demo_model, images_for

    tmp = Path(tempfile.mkdtemp())
    demo = Path(demo_model())
    trained = load((demo / "model.safetensors").read_bytes())   # read, not mapped (fails on some mounts)
    torch.manual_seed(0)
    noise = {k: torch.randn_like(v) * v.float().std().nan_to_num(0.02).clamp(min=0.02) for k, v in trained.items()}

    def write(folder: Path, tensors: dict) -> Path:
        folder.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_bytes((demo / "config.json").read_bytes())
        return folder

    moved = write(tmp / "demo_moved", {k: v + 0.3 * noise[k] for k, v in trained.items()})
    run = tmp / "run"
    for step in (100, 200, 400, 800):
        keep = step / 800
        write(run / f"checkpoint-{step}", {k: keep * v + (1 - keep) * noise[k] for k, v in trained.items()})
    images = images_for(demo)
    win = new_window(app, tmp, (size.width(), size.height()))
    win.load_demo()
    _wait(app, lambda: win.is_idle() and all(win.session.result(p) is not None for p in images))
    win.compare_with(str(moved))
    _wait(app, lambda: win.is_idle() and win.compare.active)
    dock = win.dock("compareDock")
    dock.raise_()
    _settle(app, 40)
    _wait(app, win.is_idle)
    save_small(dock, OUT / f"dock_{tag}_compare.png")
    win.open_run(str(run))
    _wait(app, lambda: win.is_idle() and win.timeline.store is not None)
    dock = win.dock("timelineDock")
    dock.raise_()
    _settle(app, 40)
    _wait(app, win.is_idle)
    _settle(app, 40)
    save_small(dock, OUT / f"dock_{tag}_timeline.png")
    save_small(win, OUT / f"window_{tag}_timeline.png")
    win.close()


def eva02_positions_shot(app, size, tag: str) -> None:  # noqa: ANN001
    """The Positions dock of an EVA-02-shaped ViT (random weights, 2 blocks, a timm hub folder) in place."""
    import warnings

    import timm

    from vitviz.demo import sample_photos

    tmp = Path(tempfile.mkdtemp())
    args = dict(depth=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = timm.create_model("eva02_tiny_patch14_224", pretrained=False, num_classes=0, **args)
    folder = tmp / "eva02_tiny_random"
    timm.models._hub.save_for_hf(model, str(folder), model_args=args, safe_serialization=True)
    photos = [str(p) for p in sample_photos()][:1] or [str(draw_scene(tmp / "scene.png"))]
    win = new_window(app, tmp, (size.width(), size.height()))
    win.load_model(str(folder))
    win.session.add_images(photos)
    _wait(app, lambda: win.is_idle() and win.session.result(photos[0]) is not None and win.session.model.rope is not None)
    dock = win.dock("posEmbedDock")
    dock.raise_()
    _settle(app, 20)
    win.posembed.hover(4, 9)
    _settle(app)
    name = OUT / f"dock_{tag}_posembed_eva02.png"
    dock.grab().save(str(name))
    print("wrote", name)
    win.close()


def _settle(app, rounds: int = 10) -> None:  # noqa: ANN001
    for _ in range(rounds):
        app.processEvents()


def panel_values(query: int, last: int) -> dict[str, tuple[str, dict]]:
    """Each analysis dock and the view it is shown with."""
    return {
        "panel_matrix.png": ("matrixDock", dict(source="token", query=query, layer=last, head="mean",
                                                matrix_log=True, colormap="viridis", opacity=0.6)),
        "panel_rollout.png": ("rolloutDock", dict(source="rollout", query=None, layer=last, rollout_fusion="mean",
                                                  rollout_discard=0.0, rollout_residual=0.5, colormap="inferno")),
        "panel_posembed.png": ("posEmbedDock", dict(colormap="viridis")),
        "panel_headstats.png": ("headStatsDock", dict(source="cls", layer=last, head=1, stats_average=True)),
        "panel_info.png": ("infoDock", dict()),
        "panel_overview.png": ("overviewDock", dict(source="cls", query=None, layer=last, head="mean",
                                                    per_tile=False, colormap="viridis")),
        "panel_controls.png": ("controlsDock", dict(source="cls", query=None, layer=last, head="mean")),
        "panel_images.png": ("imagesDock", dict()),
    }


PANEL_SIZES = {"infoDock": (760, 820), "controlsDock": (380, 620), "imagesDock": (420, 560)}


def panel_shots(app, win, query: int, last: int) -> None:  # noqa: ANN001
    """One picture per analysis dock: the dock floated at a readable size, driven through the view state."""
    for name, (dock_name, values) in panel_values(query, last).items():
        win.state.update(**values)
        dock = win.dock(dock_name)
        dock.setFloating(True)
        dock.resize(*PANEL_SIZES.get(dock_name, (980, 700)))
        dock.show()
        dock.raise_()
        if dock_name == "posEmbedDock":
            win.posembed.hover(3, 4)
        _settle(app)
        dock.grab().save(str(OUT / name))
        print("wrote", OUT / name)
        dock.setFloating(False)
    win.reset_layout()
    _settle(app, 5)


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
