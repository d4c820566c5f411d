"""`vitviz export --engine ray`: the local engine's files, byte for byte, from Ray Data on a local Ray.

The tests marked `ray` share one local Ray (`ray.init(num_cpus=2)`, no network) for the module and run the CLI in
this process on the tiny checkpoint; they are left out of a plain `pytest` run (pyproject's addopts) and run with
`pytest -m ray tests/test_ray_export.py` (README's test command runs both). The unmarked tests need no Ray: the
flags, the install hint, and how inputs are collected.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.cli import main

HEADS = "2"
MAPS = ["--maps", "cls,mean,max,rollout,token:3,relevance,norms", "--layers", "all", "--which-heads", "all,mean",
        "--npz"]


def _image(path: Path, seed: int, size: tuple[int, int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve images of different sizes (two in a subfolder, a .png / .jpg stem clash) and a truncated PNG."""
    root = tmp_path_factory.mktemp("ray_images")
    for i in range(9):
        _image(root / f"img{i}.png", i, (30 + 7 * i, 52 - 2 * i))
    _image(root / "img0.jpg", 20, (64, 30))
    _image(root / "sub" / "x.png", 21, (40, 40))
    _image(root / "sub" / "y.png", 22, (33, 61))
    data = (root / "img1.png").read_bytes()
    (root / "trunc.png").write_bytes(data[: len(data) // 2])
    return root


def _files(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _export(ckpt: Path, inputs: list[str], out: Path | str, *args: str) -> int:
    return main(["export", "--model", str(ckpt), "--heads", HEADS, *inputs, "--out", str(out), "--no-verify", *args])


@pytest.fixture(scope="module")
def local_run(tiny_ckpt: Path, folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local engine's export of `folder` (batches of 8): what the Ray engine must reproduce."""
    out = tmp_path_factory.mktemp("local_out")
    assert _export(tiny_ckpt, [str(folder)], out, *MAPS, "--quiet") == 1  # the truncated PNG fails
    return out


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for every test of the module (its start-up is the slow part)."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_run(ray_session, tiny_ckpt: Path, folder: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same export on Ray: one actor, batches of 3 (other batches than the local run's)."""
    out = tmp_path_factory.mktemp("ray_out")
    code = _export(tiny_ckpt, [str(folder)], out, *MAPS, "--engine", "ray", "--actors", "1", "--batch-size", "3")
    return out, code


@pytest.mark.ray
def test_same_files_as_the_local_engine(ray_run, local_run: Path) -> None:
    out, _ = ray_run
    ray_files, local_files = _files(out), _files(local_run)
    assert len(local_files) == 12 * 30  # 29 PNGs and an .npz per image
    assert sorted(ray_files) == sorted(local_files)
    differ = [name for name in local_files if ray_files[name] != local_files[name]]
    assert not differ, f"{len(differ)} files differ from the local engine's, e.g. {differ[:3]}"


@pytest.mark.ray
def test_a_bad_image_is_reported_and_the_rest_complete(ray_run, local_run: Path) -> None:
    out, code = ray_run
    assert code == 1
    manifest, local = _manifest(out), _manifest(local_run)
    assert manifest["summary"]["done"] == 12 and manifest["summary"]["failed"] == 1
    assert manifest["summary"]["files"] == 12 * 30 and not manifest["summary"]["interrupted"]
    failed = [e for e in manifest["images"] if e["status"] == "failed"]
    assert [Path(e["path"]).name for e in failed] == ["trunc.png"] and "trunc.png" in failed[0]["error"]
    assert manifest["images"] == local["images"]  # paths, hashes, statuses, outputs and the error: one manifest


@pytest.mark.ray
def test_the_manifest_names_the_engine_and_its_workers(ray_run) -> None:
    engine = _manifest(ray_run[0])["engine"]
    assert engine["name"] == "ray" and engine["actors"] == 1 and engine["restarts"] == 0
    assert engine["decoded_in_actors"] == 0, "Ray Data fused the decoding into the model actors"
    assert sum(w["images"] for w in engine["workers"]) == 13 and engine["workers"][0]["device"] == "cpu"
    assert engine["model_shipped"] == "path"


@pytest.mark.ray
def test_resume_after_an_interrupted_run(ray_session, tiny_ckpt: Path, folder: Path, local_run: Path,
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl+C after the fourth image: what is on disk is recorded; the rerun skips it and finishes the rest."""
    from vitviz.cli.progress import ProgressBar

    out = tmp_path / "out"
    seen = []

    def advance(self: ProgressBar, n: int = 1) -> None:
        seen.append(n)
        if len(seen) == 4:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(ProgressBar, "advance", advance)
        code = _export(tiny_ckpt, [str(folder)], out, *MAPS, "--engine", "ray", "--actors", "1",
                       "--batch-size", "1", "--quiet")
    assert code == 130
    first = _manifest(out)
    assert first["summary"]["interrupted"] and first["summary"]["done"] >= 3
    assert first["summary"]["done"] + first["summary"]["failed"] < 13
    for entry in first["images"]:  # every output the manifest lists is on disk, complete
        for name in entry["outputs"]:
            assert _files(out)[name] == _files(local_run)[name]
    done = {e["path"] for e in first["images"] if e["status"] == "done"}

    assert _export(tiny_ckpt, [str(folder)], out, *MAPS, "--engine", "ray", "--actors", "1", "--quiet") == 1
    second = _manifest(out)
    assert {e["path"] for e in second["images"] if e["status"] == "skipped"} == done
    assert second["summary"]["done"] == 12 - len(done) and second["summary"]["failed"] == 1
    assert second["engine"]["resumed_from_manifest"] >= 3  # skipped without being read again
    assert _files(out) == _files(local_run)


@pytest.mark.ray
def test_uris_globs_and_lists_and_a_worker_that_dies(ray_session, tiny_ckpt: Path, folder: Path,
                                                     local_run: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    """Inputs as a list of file:// URIs and a glob, the output a pyarrow.fs URI; the model actor dies on its
    first batch: Ray restarts it, the batch is retried, the run says so and completes."""
    from vitviz.batch.ray_engine import FAULT_ENV

    listing = tmp_path / "images.txt"
    listing.write_text("# three of them\n" + "".join(f"{(folder / f'img{i}.png').as_uri()}\n" for i in (2, 3, 4)))
    out = tmp_path / "remote"
    monkeypatch.setenv(FAULT_ENV, str(tmp_path / "died"))
    code = _export(tiny_ckpt, [str(listing), str(folder / "sub" / "*.png")], out.as_uri(), "--maps", "cls,rollout",
                   "--layers", "all", "--which-heads", "all,mean", "--engine", "ray", "--actors", "1",
                   "--batch-size", "2")
    assert code == 0 and (tmp_path / "died").exists()
    assert "died and Ray restarted it" in capsys.readouterr().err
    manifest = _manifest(out)
    assert manifest["engine"]["restarts"] >= 1 and manifest["summary"]["done"] == 5
    assert [e["path"] for e in manifest["images"]][:3] == [(folder / f"img{i}.png").as_uri() for i in (2, 3, 4)]
    got, want = _files(out), _files(local_run)
    assert len(got) == 5 * 8 and not [p for p in got if p.startswith(".")]
    for name, data in got.items():  # the glob's files sit at the top: their folder is the pattern's
        assert data == want.get(name, want.get(f"sub/{name}")), name


# -- no Ray needed ------------------------------------------------------------------------------------------------


def test_ray_options_need_the_ray_engine(tiny_ckpt: Path, folder: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    assert _export(tiny_ckpt, [str(folder)], tmp_path / "o", "--actors", "2") == 2
    assert "--actors: Ray options, for --engine ray only" in capsys.readouterr().err
    assert _export(tiny_ckpt, [str(folder)], "s3://bucket/maps") == 2
    assert "s3://bucket/maps: a pyarrow.fs URI is read and written by --engine ray only" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_without_ray_the_engine_says_how_to_install_it(tiny_ckpt: Path, folder: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as when it is not installed
    monkeypatch.setitem(sys.modules, "ray.data", None)
    assert _export(tiny_ckpt, [str(folder)], tmp_path / "o", "--engine", "ray") == 2
    assert 'pip install "vitviz[ray]"' in capsys.readouterr().err


def test_sources_from_folders_globs_lists_and_uris(folder: Path, tmp_path: Path) -> None:
    from vitviz.batch.jobs import InputError, collect_inputs
    from vitviz.batch.ray_engine import collect_sources

    out = tmp_path / "out"
    plain = collect_sources([str(folder)], out, None)  # plain local inputs: exactly the local engine's
    assert [(s.path, s.sub) for s in plain] == collect_inputs([str(folder)], out, None)
    globbed = collect_sources([f"{folder}/**/*.png"], out, None)
    assert [(Path(s.read).name, s.sub.as_posix()) for s in globbed][-3:] == [("x.png", "sub"), ("y.png", "sub"),
                                                                             ("trunc.png", ".")]  # natural order
    listing = tmp_path / "list.lst"
    listing.write_text(f"{folder}/img1.png\n\n# a comment\nmissing.png\n{folder}/sub\n")
    listed = collect_sources([str(listing)], out, None)
    assert [Path(s.read).name for s in listed] == ["img1.png", "missing.png", "x.png", "y.png"]  # not looked at
    assert listed[1].read == str(tmp_path / "missing.png")  # relative to the list's folder
    pytest.importorskip("pyarrow")
    uris = collect_sources([f"file://{folder}", f"file://{folder}/img*.png"], "s3://bucket/out", "img[12]*")
    assert [(str(s.path).rsplit("/", 1)[-1], s.sub.as_posix(), s.remote) for s in uris][:3] == [
        ("img1.png", ".", True), ("img2.png", ".", True), ("img0.png", ".", True)]
    assert len(uris) == 9  # the folder's two 'img[12]*' files (--glob), then the glob's seven other .png
    with pytest.raises(InputError, match="not found"):
        collect_sources([f"file://{folder}/nothing"], out, None)
