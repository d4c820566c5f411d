"""Regenerate the screenshots of the class relevance source and the Features dock.

    xvfb-run -a -s "-screen 0 1600x1000x24" python resources/screenshots/make_feature_screenshots.py [--only demo|photos]

`window_relevance.png` and `panel_features_*.png` use the bundled demo model (a small ViT trained on the shapes
task, so relevance, feature PCA and similarity show what a trained model learned) on the shipped shapes images,
driven through the window's own view state and the Features dock's controls. `features_photos_random_vitb.png`
shows the dock's patch similarity between two sample photographs under a ViT-B/16-shaped checkpoint with *random*
weights (no download offline): the window at ImageNet scale, not what a trained ImageNet model sees.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

import make_screenshots as shots  # noqa: E402 - the helpers of the other screenshots

OUT = HERE


def relevance_shot(app, win, name: str = "window_relevance.png") -> None:  # noqa: ANN001
    """The main window with the class relevance of the image's top class, and the Features dock's PCA beside it."""
    session = win.session
    win.state.update(source="relevance", relevance_method="relevance", relevance_class=None, colormap="inferno",
                     opacity=0.6, smooth=True, normalize=False, show_grid=False, query=None)
    drawn: list[str] = []
    win.features.shown.connect(drawn.append)
    win.features.show_tab("pca")
    win.dock("featuresDock").raise_()
    shots._wait(app, lambda: (maps := session.image_list.current_maps) is not None and maps.relevance(None) is not None
                and "pca" in drawn and win.is_idle())
    shots._settle(app)
    win.grab().save(str(OUT / name))
    print("wrote", OUT / name)


def features_shots(app, win, images: list[str], tag: str = "") -> None:  # noqa: ANN001
    """The Features dock, floated at a readable size, on each of its views."""
    panel, session = win.features, win.session
    dock = win.dock("featuresDock")
    dock.setFloating(True)
    dock.resize(1000, 760)
    dock.show()
    dock.raise_()
    drawn: list[str] = []
    panel.shown.connect(drawn.append)

    def shoot(view: str, name: str) -> None:
        shots._wait(app, lambda: view in drawn and win.is_idle())
        shots._settle(app)
        dock.grab().save(str(OUT / name))
        print("wrote", OUT / name)

    if not tag:
        drawn.clear()
        panel.show_tab("pca")
        panel.set_scope("all")
        shoot("pca", "panel_features_pca.png")
    drawn.clear()
    panel.show_tab("similarity")
    panel.set_other(images[1])
    shoot("similarity", f"panel_features_similarity{tag}.png")
    sim = panel._sim
    assert sim is not None
    gh, gw = session.image_list.current_maps.grid
    drawn.clear()
    panel.query_patch("a", *(_hot_patch(session, gh, gw) if not tag else (5, 4)), hold=True)   # photos: an eye
    shoot("similarity", f"panel_features_similarity{tag}.png")
    if not tag:
        drawn.clear()
        panel.show_tab("norms")
        shoot("norms", "panel_features_norms.png")
    dock.setFloating(False)
    win.reset_layout()
    shots._settle(app, 5)


def _hot_patch(session, gh: int, gw: int) -> tuple[int, int]:  # noqa: ANN001
    """The patch of the current image the model's CLS attends to most in the last layer (on the object)."""
    import numpy as np

    maps = session.image_list.current_maps
    values = maps.stack("cls").select(-1, "mean")
    row, col = np.unravel_index(int(np.argmax(values)), values.shape)
    return int(row), int(col)


def demo(app) -> None:  # noqa: ANN001
    from vitviz.gui.bundled import demo_model, images_for

    win = shots.new_window(app, Path(tempfile.mkdtemp()))
    images = images_for(demo_model())
    win.load_demo()
    shots._wait(app, lambda: win.is_idle() and all(win.session.result(p) is not None for p in images))
    relevance_shot(app, win)
    win.state.update(source="cls", colormap="viridis")
    features_shots(app, win, [str(p) for p in images])
    win.close()


def photos(app) -> None:  # noqa: ANN001
    import torch
    from _tiny import tiny_state_dict

    from vitviz.demo import sample_photos

    tmp = Path(tempfile.mkdtemp())
    sd = tiny_state_dict(embed_dim=768, depth=12, patch=16, grid=(14, 14), num_classes=1000)
    for key in sd:
        if key.endswith("attn.qkv.weight"):
            sd[key] *= 0.12
        if key == "pos_embed":
            sd[key] *= 0.1
    ckpt = tmp / "vit_b16_random.pth"
    torch.save(sd, ckpt)
    pictures = [str(p) for p in sample_photos()]
    chosen = [p for p in pictures if Path(p).stem in ("chelsea", "coffee")] or pictures[:2]
    win = shots.new_window(app, tmp)
    win.load_model(str(ckpt), heads=12)
    win.session.add_images(chosen)
    shots._wait(app, lambda: win.is_idle() and all(win.session.result(p) is not None for p in chosen))
    relevance_shot(app, win, "window_relevance_photos_random_vitb.png")
    win.state.update(colormap="inferno", opacity=0.55)
    features_shots(app, win, chosen, tag="_photos_random_vitb")
    win.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("demo", "photos"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    global OUT
    OUT = args.out
    OUT.mkdir(parents=True, exist_ok=True)
    from vitviz.gui.app import ensure_app

    app = ensure_app()
    if args.only != "photos":
        demo(app)
    if args.only != "demo":
        photos(app)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb" if os.environ.get("DISPLAY") else "offscreen")
    raise SystemExit(main())
