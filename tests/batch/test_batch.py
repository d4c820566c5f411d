"""`vitviz export`, run as a subprocess on a tiny model: outputs, manifest, skip/overwrite, exit codes, interrupts."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


from _hostile import DEMO, random_png
from _rollout_ref import reference_rollout_rows

from vitviz.batch.jobs import unique_stems
from vitviz.batch.plan import parse_maps, parse_picks, resolve_picks
from vitviz.core.analyses.maps import MapKind, SelectionError, map_stack
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.core.running.images import seen_region
from vitviz.core.spec import Preprocess

ROOT = Path(__file__).resolve().parents[2]
HEADS = "2"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _export(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vitviz", "export", *args], capture_output=True, text=True,
                          env=_env(), timeout=120, **kw)


def _slow_export(tiny_ckpt: Path, tmp_path: Path, count: int, out: Path, *args: str) -> list[str]:
    """The command line of an export of `count` 96 px images, one per batch, slow enough to interrupt."""
    images = tmp_path / "many"
    images.mkdir()
    for i in range(count):
        _image(images / f"img{i:02d}.png", i, (96, 96))
    return [sys.executable, "-m", "vitviz", "export", "--model", str(tiny_ckpt), "--heads", HEADS, str(images),
            "--out", str(out), "--batch-size", "1", "--size", "original", *args]


def _image(path: Path, seed: int, size: tuple[int, int] = (40, 52)) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three good images (one in a subfolder, with a name clash), a non-image and a truncated PNG."""
    root = tmp_path_factory.mktemp("images")
    (root / "sub").mkdir()
    _image(root / "a.png", 0)
    _image(root / "b.jpg", 1, (64, 30))
    _image(root / "sub" / "a.png", 2)
    (root / "notes.png").write_bytes(b"this is not an image")
    data = (root / "a.png").read_bytes()
    (root / "trunc.png").write_bytes(data[: len(data) // 2])
    return root


@pytest.fixture(scope="module")
def first_run(tiny_ckpt: Path, folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("out")
    proc = _export("--model", str(tiny_ckpt), "--heads", HEADS, str(folder), "--out", str(out), "--maps",
                   "cls,rollout,token:3", "--layers", "all,mean", "--which-heads", "all,mean", "--npz")
    return out, proc


def _pngs(out: Path) -> dict[str, np.ndarray]:
    return {str(p.relative_to(out)): np.asarray(Image.open(p).convert("RGB")) for p in sorted(out.rglob("*.png"))}


def test_export_writes_every_map_and_reports_bad_images(first_run, folder: Path) -> None:
    out, proc = first_run
    assert proc.returncode == 1, proc.stderr
    assert "notes.png" in proc.stderr and "trunc.png" in proc.stderr
    assert "3 done, 0 skipped, 2 failed" in proc.stdout
    pngs = _pngs(out)
    expected = {f"{stem}_{m}_L{layer}_H{head}.png"
                for stem in ("a", "b") for layer in ("0", "1", "mean")
                for m, heads in (("cls", ("0", "1", "mean")), ("token3", ("0", "1", "mean")), ("rollout", ("mean",)))
                for head in heads}
    assert {k for k in pngs if "/" not in k} == expected
    assert {k.split("/", 1)[1] for k in pngs if k.startswith("sub/")} == {e for e in expected if e.startswith("a_")}
    assert not any("notes" in k or "trunc" in k for k in pngs)
    assert pngs["a_cls_L0_H0.png"].shape == (37, 37, 3)  # the 40 x 52 original's region the model saw
    # the maps really differ between heads, layers, maps and images
    for other in ("a_cls_L0_H1.png", "a_cls_L1_H0.png", "a_token3_L0_H0.png", "a_rollout_L0_Hmean.png",
                  "sub/a_cls_L0_H0.png"):
        assert not np.array_equal(pngs["a_cls_L0_H0.png"], pngs[other]), other
    assert sorted(p.name for p in out.rglob("*.npz")) == ["a.npz", "a.npz", "b.npz"]
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*"))


def test_manifest_records_parameters_spec_and_hashes(first_run, folder: Path) -> None:
    out, _ = first_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parameters"]["maps"] == ["cls", "rollout", "token3"]
    assert manifest["model"]["spec"]["num_heads"] == 2 and manifest["model"]["spec"]["depth"] == 2
    assert manifest["summary"]["done"] == 3 and manifest["summary"]["failed"] == 2
    by_path = {Path(e["path"]).relative_to(folder).as_posix(): e for e in manifest["images"]}
    assert set(by_path) == {"a.png", "b.jpg", "sub/a.png", "notes.png", "trunc.png"}
    for rel, entry in by_path.items():
        assert entry["sha256"] == hashlib.sha256((folder / rel).read_bytes()).hexdigest()
    assert by_path["notes.png"]["status"] == "failed" and "not a recognised image" in by_path["notes.png"]["error"]
    assert by_path["sub/a.png"]["status"] == "done"
    assert all((out / o).exists() for o in by_path["sub/a.png"]["outputs"])
    assert by_path["notes.png"]["outputs"] == []  # nothing was written for a failed image


def test_png_is_the_map_the_model_computes(first_run, tiny_ckpt: Path, folder: Path) -> None:
    """The CLI's PNG equals the window's rendering of the same result (same layer, head and defaults)."""
    out, _ = first_run
    import vitviz
    from vitviz.core.analyses.maps import ResultMaps
    from vitviz.gui.exporting import render_view as render
    from vitviz.gui.state import ViewState

    result = vitviz.load(tiny_ckpt, heads=2, device="cpu").run(folder / "b.jpg")
    maps = ResultMaps(result)
    for name, state in (("b_cls_L1_H0.png", ViewState(source="cls", layer=1, head=0)),
                        ("b_token3_Lmean_Hmean.png", ViewState(source="token", query=3, layer="mean", head="mean")),
                        ("b_rollout_L1_Hmean.png", ViewState(source="rollout", layer=1, head="mean"))):
        gui = render(maps, state, heatmap_only=False, colorbar=False).astype(int)  # the original's resolution
        cli = np.asarray(Image.open(out / name).convert("RGB")).astype(int)
        assert gui.shape == cli.shape and np.abs(gui - cli).max() <= 1, name


def test_rerun_skips_and_overwrite_rewrites(first_run, tiny_ckpt: Path, folder: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = first_run
    png = out / "a_cls_L0_H0.png"
    before = png.stat().st_mtime_ns
    proc = _export("--model", str(tiny_ckpt), "--heads", HEADS, str(folder), "--out", str(out), "--maps",
                   "cls,rollout,token:3", "--layers", "all,mean", "--which-heads", "all,mean", "--npz")
    assert proc.returncode == 1 and "0 done, 3 skipped, 2 failed" in proc.stdout, proc.stdout + proc.stderr
    assert png.stat().st_mtime_ns == before
    good = [str(folder / "a.png"), str(folder / "b.jpg")]
    png.unlink()  # a missing output is written again even without --overwrite (in-process, quiet)
    from vitviz.cli import main

    assert main(["export", "--model", str(tiny_ckpt), "--heads", HEADS, *good, "--out", str(out), "--layers", "0",
                 "--which-heads", "0", "--quiet"]) == 0
    assert png.exists() and capsys.readouterr().out == ""
    before = (out / "b_cls_L0_H0.png").stat().st_mtime_ns
    proc = _export("--model", str(tiny_ckpt), "--heads", HEADS, *good, "--out", str(out), "--layers", "0",
                   "--which-heads", "0", "--overwrite", "--style", "heatmap", "--cmap", "gray", "--size", "original")
    assert proc.returncode == 0 and "2 done, 0 skipped, 0 failed" in proc.stdout
    assert (out / "b_cls_L0_H0.png").stat().st_mtime_ns != before
    gray = np.asarray(Image.open(out / "b_cls_L0_H0.png").convert("RGB"))
    assert np.array_equal(gray[..., 0], gray[..., 1])  # really re-rendered with the new colormap
    # --size original: b.jpg is 64 x 30 (h x w); shorter side 30 -> 35 px (crop 32 / 0.9), 64 -> int(74.7) = 74,
    # centre crop 32 x 32, which in the original's pixels is 32 * 64 / 74 = 27.7 rows by 32 * 30 / 35 = 27.4 columns
    assert gray.shape[:2] == (28, 27)


@pytest.mark.parametrize("args, message", [
    (["--maps", "cls,nope"], "map 'nope'"),
    (["--layers", "9"], "layer 9 out of range"),
    (["--which-heads", "2"], "head 2 out of range"),
    (["--maps", "token:99"], "token:99 out of range"),
    (["--opacity", "2"], "between 0 and 1"),
    (["--batch-size", "0"], "positive integer"),
])
def test_bad_arguments_exit_2(tiny_ckpt: Path, folder: Path, tmp_path: Path, args: list[str], message: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """In-process (the subprocess path is covered below): argparse errors and selections the model refutes."""
    from vitviz.cli import main

    argv = ["export", "--model", str(tiny_ckpt), "--heads", HEADS, str(folder / "a.png"), "--out", str(tmp_path), *args]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    assert code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_bad_checkpoint_and_missing_input_exit_2(tiny_ckpt: Path, folder: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    proc = _export("--model", str(folder / "notes.png"), str(folder / "a.png"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "notes.png" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    from vitviz.cli import main

    assert main(["export", "--model", str(tiny_ckpt), str(tmp_path / "missing.png"), "--out", str(tmp_path / "o")]) == 2
    assert "missing.png: not found" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_leaves_only_complete_files(tiny_ckpt: Path, tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "out"
    cmd = _slow_export(tiny_ckpt, tmp_path, 40, out, "--maps", "cls,token:1,token:2,rollout", "--layers", "all,mean",
                       "--which-heads", "all,mean,max", "--colorbar")
    env = _env()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("*.png"))) < 20 and proc.poll() is None:
        time.sleep(0.02)  # polling for the first outputs, the one wait this test needs
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    pngs = list(out.glob("*.png"))
    assert 20 <= len(pngs) < 40 * 34, "the run was not interrupted mid-way"
    assert not [p for p in out.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    for p in pngs:
        with Image.open(p) as im:
            im.load()  # raises on a truncated file
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["summary"]["interrupted"] is True


def test_killed_run_leaves_no_partial_file_and_the_rerun_cleans_up(tiny_ckpt: Path, tmp_path: Path) -> None:
    """SIGKILL cannot be caught: final names still only ever hold complete files, and the next run removes the
    temporary files of dead writers (but not those of a live one) and finishes the job."""
    out = tmp_path / "out"
    cmd = _slow_export(tiny_ckpt, tmp_path, 30, out, "--maps", "cls,rollout", "--layers", "all", "--which-heads", "all,mean")
    env = _env()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("*.png"))) < 10 and proc.poll() is None:
        time.sleep(0.01)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    killed = list(out.glob("*.png"))
    per_image = 2 * 3 + 2  # cls: 2 layers x heads 0, 1, mean; rollout: 2 layers x the fused heads (mean) only
    assert 10 <= len(killed) < 30 * per_image, "the run was not killed mid-way"
    for p in killed:
        with Image.open(p) as im:
            im.load()  # raises on a truncated file
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # that process has exited
    name = "img29_cls_L0_Hmean.png"
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]
    planted_dead = out / f".{name}.{dead_pid}@{host}-abcd1234.tmp"
    planted_live = out / f".{name}.{os.getpid()}@{host}-abcd1234.tmp"  # pytest is alive: a concurrent writer
    other_host = out / f".{name}.{dead_pid}@not-{host}-abcd1234.tmp"  # a writer on another machine
    unrelated = out / f".notes.txt.{dead_pid}@{host}-abcd1234.tmp"  # not an output of this export
    for p in (planted_dead, planted_live, other_host, unrelated):
        p.write_bytes(b"partial")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "temporary file(s) a killed earlier run left" in done.stderr
    assert "rollout maps are written once per layer as H mean" in done.stderr
    assert not planted_dead.exists() and planted_live.exists() and other_host.exists() and unrelated.exists()
    left = {p.name for p in out.iterdir() if p.suffix == ".tmp"}
    assert left == {planted_live.name, other_host.name, unrelated.name}, left
    assert len(list(out.glob("*.png"))) == 30 * per_image
    with Image.open(out / name) as im:
        im.load()


# ------------------------------------------------------------------------------------------------ units


def test_selection_parsing() -> None:
    assert parse_maps("cls, rollout,token:7,cls") == [MapKind("cls"), MapKind("rollout"), MapKind("token", 7)]
    assert parse_picks("0-2,5,mean", "layer", ("all", "mean")) == [0, 1, 2, 5, "mean"]
    assert resolve_picks(["last", "all"], 3, "layer") == [2, 0, 1]
    assert resolve_picks(parse_picks("-1,0,-3", "layer", ("all",)), 3, "layer") == [2, 0]  # -3 is layer 0
    from vitviz.cli import _attach_negative_picks
    assert _attach_negative_picks(["export", "--layers", "-1,0", "--which-heads", "-1", "x"]) == \
        ["export", "--layers=-1,0", "--which-heads", "-1", "x"]  # argparse reads a bare '-1' as a value itself
    with pytest.raises(SelectionError, match="layer -4 out of range.*3 layers"):
        resolve_picks([-4], 3, "layer")
    for bad in ("3-1", "x", ""):
        with pytest.raises(SelectionError):
            parse_picks(bad, "layer", ("all",))
    with pytest.raises(SelectionError, match="token:N"):
        parse_maps("token:-1")


def test_unique_stems_disambiguate_clashes() -> None:
    pairs = [(Path("x/cat.jpg"), Path(".")), (Path("y/cat.png"), Path(".")), (Path("z/cat.png"), Path(".")),
             (Path("w/cat.jpg"), Path("sub"))]
    assert unique_stems(pairs, lambda p: p.stem) == ["cat_jpg", "cat_png", "cat_2", "cat"]


def test_rollout_rows_match_the_reference() -> None:
    """The export's rollout stack (the engine's rollout through each layer) against the test-side reference."""
    from vitviz.core.spec import ModelSpec

    rng = np.random.default_rng(0)
    attn = rng.random((3, 2, 5, 5), dtype=np.float32)
    attn /= attn.sum(-1, keepdims=True)
    spec = ModelSpec(family="test", source="test", image_size=(16, 16), patch_size=8, embed_dim=8, depth=3,
                     num_heads=2)
    rows = map_stack(attn, MapKind("rollout"), spec).maps[:, 0].reshape(3, 4)
    np.testing.assert_allclose(rows, reference_rollout_rows(attn, 1)[:, 1:], rtol=1e-5)
    for fusion, discard, residual in [("max", 0.5, 0.3), ("min", 0.0, 0.0), ("mean", 0.75, 1.0)]:
        params = RolloutParams(fusion, discard, 0, residual)
        rows = map_stack(attn, MapKind("rollout", rollout=params), spec).maps[:, 0].reshape(3, 4)
        ref = reference_rollout_rows(attn, 1, fusion, discard, residual)[:, 1:]
        np.testing.assert_allclose(rows, ref, rtol=1e-5, atol=1e-7)


def test_cls_and_token_maps_keep_only_their_rows_and_draw_the_same(tiny_ckpt: Path, folder: Path,
                                                                    tmp_path: Path) -> None:
    """CLS / token maps alone capture only those query rows; the PNGs equal a full-matrix run's."""
    from vitviz.batch.plan import query_rows

    assert query_rows(parse_maps("cls,token:3")) == [0, 3] and query_rows(parse_maps("cls,rollout")) is None
    outs = {}
    for name, maps in (("rows", "cls,token:3"), ("full", "cls,token:3,mean")):
        outs[name] = tmp_path / name
        done = _export("--model", str(tiny_ckpt), "--heads", HEADS, str(folder / "a.png"), "--out", str(outs[name]),
                       "--maps", maps, "--layers", "all", "--which-heads", "all,mean,max", "--colorbar")
        assert done.returncode == 0, done.stderr
    pngs = sorted(p.name for p in outs["rows"].glob("*.png"))
    assert len(pngs) == 2 * 2 * 4
    for name in pngs:
        assert (outs["rows"] / name).read_bytes() == (outs["full"] / name).read_bytes(), name


def test_rollout_options_reach_the_pngs(tiny_ckpt: Path, folder: Path, tmp_path: Path) -> None:
    """--fusion / --discard-ratio / --residual change the rollout PNG (and the manifest records them)."""
    def export(label: str, *extra: str) -> bytes:
        out = tmp_path / "_".join(extra or ("default",))
        done = _export("--model", str(tiny_ckpt), "--heads", HEADS, str(folder / "a.png"), "--out", str(out),
                       "--maps", "rollout", "--style", "heatmap", *extra)
        assert done.returncode == 0, done.stderr
        assert [p.name for p in out.glob("*.png")] == [f"a_{label}_L1_Hmean.png"]
        return (out / f"a_{label}_L1_Hmean.png").read_bytes()

    base = export("rollout")
    assert export("rollout-d0.9", "--discard-ratio", "0.9") != base
    assert export("rollout-max", "--fusion", "max") != base
    assert export("rollout-min-d0.5-r0.2", "--fusion", "min", "--discard-ratio", "0.5", "--residual", "0.2") != base
    assert export("rollout", "--residual", "0.5") == base  # the default, spelled out

    same = tmp_path / "rerun"  # other settings into the same folder: new files, not "already done"
    for extra in ((), ("--fusion", "max")):
        done = _export("--model", str(tiny_ckpt), "--heads", HEADS, str(folder / "a.png"), "--out", str(same),
                       "--maps", "rollout", *extra)
        assert done.returncode == 0 and "0 skipped" in done.stdout, done.stdout
    assert sorted(p.name for p in same.glob("*.png")) == ["a_rollout-max_L1_Hmean.png", "a_rollout_L1_Hmean.png"]
    manifest = json.loads((tmp_path / "--discard-ratio_0.9" / "manifest.json").read_text())
    assert manifest["parameters"]["discard_ratio"] == 0.9
    bad = _export("--model", str(tiny_ckpt), str(folder), "--out", str(tmp_path / "x"), "--discard-ratio", "1")
    assert bad.returncode == 2 and "expected 0 <= R < 1" in bad.stderr


def test_seen_region_matches_preprocess_crop() -> None:
    from vitviz.core.running.images import preprocess

    yy, xx = np.mgrid[0:300, 0:400]
    smooth = np.stack([xx * 255 // 399, yy * 255 // 299, (xx + yy) * 255 // 698], axis=-1).astype(np.uint8)
    img = Image.fromarray(smooth)  # a gradient, so resampling differences stay small
    pp = Preprocess(crop=(224, 224), resize=256, mode="center", interpolation="bilinear")
    region = seen_region(img, pp)
    assert region.shape == (262, 263, 3)  # 224 / 256 of the shorter side; 400 -> int(341.3) = 341 truncates
    _, display = preprocess(img, pp)
    small = np.asarray(Image.fromarray(region).resize((224, 224), Image.Resampling.BILINEAR)).astype(int)
    assert np.abs(small - display.astype(int)).max() <= 3
    assert seen_region(img, Preprocess(crop=(224, 224), mode="squash")).shape == (300, 400, 3)


def test_seen_region_size_is_the_rounded_box_size() -> None:
    """The crop is as wide as the box rounds to, wherever its edges fall (rounding each edge could add a pixel)."""
    from vitviz.core.running.images import source_box

    pp = Preprocess(crop=(224, 224), resize=256, mode="center", interpolation="bilinear")
    for h, w in [(300, 400), (333, 500), (375, 500), (481, 353), (250, 251), (1000, 1337)]:
        img = Image.new("RGB", (w, h))
        left, top, right, bottom = source_box((h, w), pp)
        assert seen_region(img, pp).shape == (round(bottom - top), round(right - left), 3), (h, w)


def test_progress_bar_on_a_terminal_lines_elsewhere() -> None:
    import io

    from vitviz.cli.progress import ProgressBar

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        bar = ProgressBar(3, enabled=True, stream=stream)
        for _ in range(3):
            bar.advance()
        bar.close()
    assert "3/3" in tty.getvalue() and "[" in tty.getvalue()
    assert "\r" not in pipe.getvalue() and "3/3 images (100%)" in pipe.getvalue()   # not a terminal: lines


def _named_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty torch hub cache under tmp_path (TORCH_HOME), and no network: a download attempt fails offline."""
    import urllib.error
    import urllib.request

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)

    def offline(url, timeout=None):
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    return cache


def test_export_accepts_a_cached_named_model(tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """`--model torchvision:vit_b_16` is the torch hub file the window would open (here a small stand-in)."""
    import torch
    from torchvision.models import VisionTransformer

    from vitviz.cli import main

    cache = _named_cache(tmp_path, monkeypatch)
    torch.manual_seed(0)
    net = VisionTransformer(image_size=224, patch_size=16, num_layers=1, num_heads=12, hidden_dim=48, mlp_dim=64)
    torch.save(net.state_dict(), cache / "vit_b_16-c867db91.pth")
    out = tmp_path / "out"
    assert main(["export", "--model", "torchvision:vit_b_16", str(folder / "a.png"), "--out", str(out),
                 "--which-heads", "0,mean", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in out.glob("*.png")) == ["a_cls_L0_H0.png", "a_cls_L0_Hmean.png"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["checkpoint"] == "torchvision:vit_b_16"
    assert manifest["model"]["spec"]["source"] == str(cache / "vit_b_16-c867db91.pth")
    assert manifest["model"]["spec"]["num_heads"] == 12


def test_export_named_model_offline_exits_2_naming_file_and_folder(tmp_path: Path, folder: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from vitviz.cli import main

    cache = _named_cache(tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert main(["export", "--model", "torchvision:vit_b_32", str(folder / "a.png"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("downloading vit_b_32-d86f8d99.pth (353 MB) from https://")
    assert f"vitviz: error: vit_b_32-d86f8d99.pth is not in {cache}" in err and "no network in tests" in err
    assert "not found" not in err and "Traceback" not in err
    assert not out.exists() and list(cache.iterdir()) == []


def test_the_summary_gives_a_pace_that_reads() -> None:
    """Round five: a slow model's summary said '0.0 images/s'; below one image a second it says seconds per image."""
    from vitviz.batch.pipeline import summary_line

    counts = {"done": 4, "skipped": 0, "failed": 0, "files": 8}
    assert summary_line(counts, 4, "out", 2.0, False).endswith("in 2.0 s (2.0 images/s)")
    assert summary_line(counts, 4, "out", 50.0, False).endswith("in 50.0 s (12.5 s per image)")
    assert summary_line({**counts, "done": 0}, 4, "out", 3.0, False).endswith("in 3.0 s")


# ----------------------------------------------------------------------------------------------- huge ranges (issue 34)

@pytest.mark.parametrize("option, value", [("--layers", "0-9999999"), ("--which-heads", "0-9999999"),
                                           ("--layers", "0-99999999999"), ("--which-heads", "3,0-99999999999")])
def test_huge_layer_and_head_ranges_are_refused_before_expanding(option: str, value: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    from vitviz.cli import main

    image = random_png(tmp_path / "a.png")
    try:
        code = main(["export", "--model", str(DEMO), str(image), "--out", str(tmp_path / "out"), option, value])
    except SystemExit as e:  # argparse
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert "no model has" in err and "Traceback" not in err and "MemoryError" not in err
    assert not (tmp_path / "out").exists()
