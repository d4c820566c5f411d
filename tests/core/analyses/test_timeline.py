"""A training run as a timeline: the animated export (APNG / GIF), the demo's checkpoints saved during training
(`vitviz.demo.train --save-every`), the fine-tuned copy of the demo (`vitviz.demo.finetune`), and the lazy
checkpoint store the window's timeline reads (`vitviz.core.analyses.timeline.TimelineStore`)."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from _hostile import DEMO, random_png, run_folder
from _tiny import HEADS, write_tiny_checkpoint


def _cli(*argv: str) -> int:
    """`vitviz ARGV...`'s exit code, whether argparse exits or the command returns it."""
    from vitviz.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return main(list(argv))
        except SystemExit as e:
            return int(e.code)


def _frames(path: Path) -> list[np.ndarray]:
    with Image.open(path) as im:
        out = []
        for k in range(getattr(im, "n_frames", 1)):
            im.seek(k)
            out.append(np.asarray(im.convert("RGB")))
        return out


@pytest.fixture(scope="module")
def run3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three checkpoints whose names sort otherwise than their steps (100 < 20 as text)."""
    run = tmp_path_factory.mktemp("run3")
    for seed, step in enumerate((100, 20, 3)):
        write_tiny_checkpoint(run / f"step-{step}.safetensors", seed=seed)
    return run


def test_timeline_animation_frames_are_the_checkpoints_in_order(tmp_path: Path, photo: Path, run3: Path) -> None:
    out = tmp_path / "out"
    assert _cli("export", "--timeline", str(run3), "--heads", str(HEADS), str(photo), "--out", str(out),
                "--which-heads", "0", "--no-verify", "--quiet") == 0
    order = ["step-3", "step-20", "step-100"]
    pngs = [np.asarray(Image.open(out / f"photo_{label}_cls_L1_H0.png").convert("RGB")) for label in order]
    assert len({p.tobytes() for p in pngs}) == 3                      # three different maps
    apng, gif = out / "photo_animation_cls_L1_H0.png", out / "photo_animation_cls_L1_H0.gif"
    with Image.open(apng) as im:
        assert im.format == "PNG" and getattr(im, "is_animated", False) and im.n_frames == 3
        assert im.info.get("loop") == 0
    frames = _frames(apng)
    h, w = pngs[0].shape[:2]
    for frame, png in zip(frames, pngs):                              # APNG: lossless, in the timeline's order
        assert frame.shape[1] == w and frame.shape[0] > h              # a label strip below the map
        assert np.array_equal(frame[:h], png)
    gif_frames = _frames(gif)
    assert len(gif_frames) == 3
    for k, frame in enumerate(gif_frames):                            # GIF: one palette, close to its checkpoint
        err = np.abs(frame[:h].astype(int) - pngs[k].astype(int)).mean(axis=-1)
        others = [np.abs(frame[:h].astype(int) - p.astype(int)).mean() for p in pngs]
        assert err.mean() < 8 and int(np.argmin(others)) == k        # within ~3 % of the range
    manifest = json.loads((out / "manifest.json").read_text())
    outputs = manifest["images"][0]["outputs"]
    assert apng.name in outputs and gif.name in outputs
    assert manifest["timeline"]["animation"]["files"] == ["APNG", "GIF"]


def test_no_animation_flag(tmp_path: Path, photo: Path, run3: Path) -> None:
    out = tmp_path / "out"
    assert _cli("export", "--timeline", str(run3), "--heads", str(HEADS), str(photo), "--out", str(out),
                "--no-animation", "--no-verify", "--quiet") == 0
    names = {p.name for p in out.iterdir()}
    assert not any("animation" in n for n in names) and "photo_timeline_cls_L1_Hmean.png" in names
    assert json.loads((out / "manifest.json").read_text())["timeline"]["animation"] is None
    model = write_tiny_checkpoint(tmp_path / "m.pth")
    assert _cli("export", "--model", str(model), "--heads", "2", str(photo), "--out", str(tmp_path / "o2"),
                "--no-animation", "--no-verify", "--quiet") == 2       # only with --timeline


def test_write_animation_keeps_every_frame(tmp_path: Path) -> None:
    from vitviz.batch.compare import animation_frames, write_animation

    rng = np.random.default_rng(0)
    pics = [rng.integers(0, 256, (20, 30, 3), dtype=np.uint8) for _ in range(4)]
    frames = animation_frames(pics, ["a", "b", "c", "d"])
    path = write_animation(tmp_path / "x.png", frames)
    got = _frames(path)
    assert len(got) == 4 and all(np.array_equal(g, f) for g, f in zip(got, frames))
    with pytest.raises(ValueError, match="animations are written as"):
        write_animation(tmp_path / "x.webp", frames)


# ------------------------------------------------------------------------------------------ the demo's runs
def test_demo_train_save_every_writes_a_run_open_run_reads(tmp_path: Path) -> None:
    from vitviz.core.analyses.timeline import open_run
    from vitviz.demo import train

    small = ["--steps", "5", "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--batch", "4",
             "--val-images", "8", "--warmup", "2"]
    assert train.main(["--out", str(tmp_path / "a"), "--save-every", "2", *small]) == 0
    run_dir = tmp_path / "a" / "run"
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]
    assert all(sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"] for d in run_dir.iterdir())
    run = open_run(run_dir)
    assert run.labels == ["checkpoint-2", "checkpoint-4", "checkpoint-5"] and run.order_note.startswith("ordered by")
    from safetensors.torch import load_file

    last, final = load_file(str(run_dir / "checkpoint-5" / "model.safetensors")), \
        load_file(str(tmp_path / "a" / "model.safetensors"))
    assert all(np.array_equal(last[k].numpy(), final[k].numpy()) for k in final)    # the last one is the model
    first = load_file(str(run_dir / "checkpoint-2" / "model.safetensors"))
    assert not np.array_equal(first["head.weight"].numpy(), final["head.weight"].numpy())
    spec = run.model(0).spec
    assert (spec.depth, spec.num_heads, spec.labels[0]) == (1, 2, "circle")
    assert train.main(["--out", str(tmp_path / "b"), *small]) == 0                 # saving changes no weight
    plain = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert all(np.array_equal(plain[k].numpy(), final[k].numpy()) for k in final)
    assert not (tmp_path / "b" / "run").exists()
    with pytest.raises(SystemExit):
        train.main(["--out", str(tmp_path / "c"), "--run-dir", str(tmp_path / "r"), *small])


def test_finetune_copies_the_demo_and_moves_it(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    import vitviz
    from vitviz.demo import demo_checkpoint, finetune

    images = np.zeros((2, 4, 4, 3), np.uint8)
    images[1] += 200
    assert list(finetune.light_or_dark(images)) == [0, 1]
    net, _ = finetune.load_copy(demo_checkpoint())
    demo = load_file(str(demo_checkpoint() / "model.safetensors"))
    copied = net.state_dict()
    assert all(np.array_equal(copied[k].numpy(), v.numpy()) for k, v in demo.items() if not k.startswith("head."))
    assert tuple(copied["head.weight"].shape) == (2, demo["head.weight"].shape[1])
    out = tmp_path / "ft"
    assert finetune.main(["--out", str(out), "--steps", "3", "--batch", "4", "--pool", "8", "--check", "4"]) == 0
    tuned = load_file(str(out / "model.safetensors"))
    moved = [k for k, v in demo.items() if not k.startswith("head.") and not np.array_equal(tuned[k].numpy(), v.numpy())]
    assert "blocks.0.attn.qkv.weight" in moved
    model = vitviz.load(out)
    assert model.spec.labels == ("dark", "light") and model.spec.depth == vitviz.load(demo_checkpoint()).spec.depth
    log = (out / "finetune_log.txt").read_text()
    assert "step    3/3" in log and "CLS attention on the shape" in log and "accuracy" in log


# ----------------------------------------------------------------------------------------- the lazy store
def _store(folder: Path, **kw):
    from vitviz.core.analyses.timeline import TimelineStore, open_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TimelineStore(open_run(folder, heads=HEADS), **kw)


@pytest.fixture(scope="module")
def img() -> np.ndarray:
    return np.random.default_rng(3).integers(0, 256, (40, 52, 3), dtype=np.uint8)


def test_store_series_equal_the_per_result_figures(run3: Path, img: np.ndarray) -> None:
    from vitviz.core.analyses.timeline import run_metrics

    store = _store(run3)
    store.add_image("x", img)
    before = store.series("x")
    assert not before.done.any() and before.distance.shape == (3, 0)
    assert store.peek(1, "x") is None and store.loads == 0              # peeking never loads
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in (2, 0, 1):
            store.result(k, "x")
        box = (0.0, 0.0, 0.5, 0.75)
        want = run_metrics(store.run, img, box)                         # the figures one result at a time
    got = store.series("x", box)
    assert got.done.all() and got.labels == ("step-3", "step-20", "step-100")
    assert np.allclose(got.distance, want.distance, rtol=1e-12) and np.allclose(got.entropy, want.entropy)
    assert np.allclose(got.box_share, want.box_share, atol=1e-6)
    assert [p[0] for p in got.predictions] == [p[0] for p in want.predictions]
    assert np.allclose(got.top_probability, [p[2] for p in want.predictions])
    assert list(got.steps) == [3, 20, 100]
    other = store.series("x", (0.5, 0.0, 1.0, 1.0))                    # another box: no model runs
    assert store.runs == 3 and not np.allclose(other.box_share, got.box_share)
    assert store.series("x", heads=True).distance.shape == (3, 2, HEADS)
    maps = store.peek(0, "x")
    assert maps is store.result(0, "x") and store.stack(0, "x", "cls") is maps.stack("cls")
    assert np.array_equal(store.run_vmax("x", "cls"),
                          np.max([store.stack(k, "x").vmax for k in range(3)], axis=0))


def test_store_keeps_to_its_budget_and_its_figures(run3: Path, img: np.ndarray) -> None:
    probe = _store(run3)
    probe.add_image("x", img)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe.result(0, "x")
    one = probe.nbytes                                             # a model and a result
    store = _store(run3, budget_bytes=one + one // 4)
    store.add_image("x", img)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = store.result(0, "x").stack("cls").maps.copy()
        for k in (1, 2):
            store.result(k, "x")
            assert store.nbytes <= store.budget_bytes
        assert ("result", 0, "x") not in store.held and store.peek(0, "x") is None   # evicted, oldest first
        s = store.series("x")
        assert s.done.all() and np.isfinite(s.distance).all()    # the figures outlive the results
        loads = store.loads
        again = store.result(0, "x").stack("cls").maps            # made again, the same maps
    assert store.loads == loads + 1 and np.array_equal(again, first)
    assert store.missing("x") == []


def test_store_names_a_checkpoint_of_another_layout_against_the_first(tmp_path: Path, img: np.ndarray) -> None:
    from vitviz.core.analyses.timeline import TimelineError

    write_tiny_checkpoint(tmp_path / "step-1.safetensors", seed=1)
    write_tiny_checkpoint(tmp_path / "step-2.safetensors", depth=3, seed=2)
    write_tiny_checkpoint(tmp_path / "step-3.safetensors", seed=3)
    store = _store(tmp_path)
    store.add_image("x", img)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TimelineError, match=r"step-2.safetensors: another layout.*depth 3 \(the run: 2\)"):
            store.result(1, "x")                                   # checkpoint 0 is loaded first: the reference
        assert store.loads == 1 and store.run.layout["depth"] == 2
        assert list(store.failed) == [1] and "step-2" in store.failed[1]
        assert store.missing("x", around=1) == [2, 0]               # nearest first, later before earlier
        store.result(2, "x")
        with pytest.raises(TimelineError, match="step-2"):
            store.result(1, "x")                                   # remembered, not loaded again
    assert store.loads == 2
    s = store.series("x")
    assert list(s.done) == [False, False, True] and np.isnan(s.distance[1]).all()
    with pytest.raises(TimelineError, match="not open"):
        store.result(0, "y")
    store.remove_image("x")
    assert not any(e[0] == "result" for e in store.held)


def test_labels_too_long_for_small_pictures_keep_their_step() -> None:
    """Round five: on 64 px images every frame of `export --timeline` read 'checkpoin..' (the end, the step, was
    cut): a label that does not fit keeps its end."""
    from PIL import ImageDraw, ImageFont

    from vitviz.batch.compare import animation_frames, fit_label

    font = ImageFont.load_default()
    measure = ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength
    width = 64 - 4
    labels = ["checkpoint-1200", "checkpoint-2400"]
    fitted = [fit_label(s, width, lambda t: measure(t, font=font)) for s in labels]
    assert fitted[0] != fitted[1] and fitted[0].endswith("1200") and fitted[0].startswith("..")
    assert all(measure(f, font=font) <= width for f in fitted)
    assert fit_label("step-5", width, lambda t: measure(t, font=font)) == "step-5"       # fits: unchanged
    frames = animation_frames([np.zeros((64, 64, 3), np.uint8)] * 2, labels)
    assert not np.array_equal(frames[0], frames[1])                       # the two frames' labels differ


def test_store_draws_a_key_map_of_every_checkpoint(run3: Path, img: np.ndarray) -> None:
    """A map kind is a table row: the timeline draws key:N of each checkpoint from its own result."""
    store = _store(run3)
    store.add_image("x", img)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(3):
            r = store.result(k, "x").result
            want = r.attentions[:, :, r.num_prefix:, 5].reshape(r.attentions.shape[0], -1, *r.grid)
            np.testing.assert_array_equal(store.stack(k, "x", "key:5").maps[:, :-2], want)


def test_a_windowed_checkpoint_is_refused_for_its_missing_image_wide_attention(tmp_path: Path) -> None:
    """A run's checkpoint without an image-wide attention map per head (`ATTENTION`: a windowed Swin) is refused
    naming it, as Compare refuses one: the timeline asks the capability it needs, not the lane."""
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    from vitviz.core.analyses.timeline import TimelineError, open_run

    kw = dict(img_size=64, embed_dim=16, depths=(1, 1), num_heads=(1, 2), window_size=4, num_classes=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kw),
                    str(tmp_path / "checkpoint-1"), safe_serialization=True, model_args=kw)
        run = open_run(tmp_path)
        with pytest.raises(TimelineError, match="checkpoint-1: a windowed model .*global attention"):
            run.model(0)


# ---------------------------------------------------------------------------------------------- hostile runs (issue 34)

def test_a_windowed_run_is_refused_by_the_timeline(tiny_swin_folder: Path, tmp_path: Path) -> None:
    from vitviz.core.analyses.timeline import TimelineError, TimelineStore, open_run

    run = run_folder(tmp_path, tiny_swin_folder)
    with pytest.raises(TimelineError, match="windowed model"):
        open_run(run).model(0)
    store = TimelineStore(open_run(run))       # the window's store: the checkpoint is recorded as failed
    store.add_image("a", str(random_png(tmp_path / "a.png", size=64)))
    with pytest.raises(TimelineError, match="windowed model"):
        store.result(0, "a")
    assert 0 in store.failed and "windowed model" in store.failed[0]


def test_unreadable_run_folders_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint folder at mode 000 (and a run folder that can be entered but not listed): a TimelineError
    naming it. Permissions are simulated (the tests may run as root, whom mode 000 does not stop)."""
    from vitviz.core.analyses.timeline import TimelineError, open_run

    run = run_folder(tmp_path, DEMO)
    real = Path.iterdir

    def iterdir(self):  # noqa: ANN001, ANN202
        if self.name in locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    for locked in ({"checkpoint-2"}, {"run"}):
        with pytest.raises(TimelineError, match=f"{next(iter(locked))}: cannot be read \\(Permission denied"):
            open_run(run)
    with pytest.raises(TimelineError, match="expected the path"):
        open_run(None)  # type: ignore[arg-type]


def test_export_timeline_of_an_unreadable_run_is_a_clear_error(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    run = run_folder(tmp_path, DEMO)
    image = random_png(tmp_path / "a.png", size=64)
    os.chmod(run / "checkpoint-2", 0)
    try:
        if os.access(run / "checkpoint-2", os.R_OK):
            pytest.skip("running as root: mode 000 does not stop reading")
        code = _cli("export", "--timeline", str(run), str(image), "--out", str(tmp_path / "out"), "--quiet")
    finally:
        os.chmod(run / "checkpoint-2", 0o755)
    err = capsys.readouterr().err
    assert code == 2 and "checkpoint-2: cannot be read" in err and "Traceback" not in err
