"""`vitviz export --engine ray`: the local engine's files, byte for byte, from Ray Data on a local Ray.

The tests marked `ray` share one local Ray (`ray.init(num_cpus=2)`, no network) for the module and run the CLI in
this process on the tiny checkpoint; they are left out of a plain `pytest` run (pyproject's addopts) and run with
`pytest -m ray tests/batch/test_ray_export.py` (README's test command runs both). The unmarked tests need no Ray: the
flags, the install hint, how inputs are collected, and hostile lists, URIs and manifests (issue 34).
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _hostile import fifo, random_png
from PIL import Image

import vitviz
from vitviz.batch.jobs import InputError
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


NOTE_CAPTURED = "VITVIZ_TEST_NOTE_CAPTURED"   # (a VITVIZ_* variable: the engine gives it to its tasks and actors)


def _note_captured() -> None:
    """Each Ray worker's setup (`worker_process_setup_hook`): in a run whose environment names a file by
    NOTE_CAPTURED, every call of `VitModel.forward_captured` (the whole (L, H, T, T) stack) appends a line to it;
    in any other, nothing is changed."""
    import os

    if not os.environ.get(NOTE_CAPTURED):
        return
    from vitviz.core.running.capture import VitModel

    captured = VitModel.forward_captured

    def noted(self: VitModel, *args: Any, **kwargs: Any) -> Any:
        with open(os.environ[NOTE_CAPTURED], "a", encoding="utf-8") as note:
            note.write(f"forward_captured in process {os.getpid()}\n")
        return captured(self, *args, **kwargs)

    VitModel.forward_captured = noted


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One local Ray for every test of the module (its start-up is the slow part). Its workers' temporary folder
    (TMPDIR) is the module's own, returned, so that what an actor leaves there is seen; Ray's session folder stays
    where it was (RAY_TMPDIR). Each worker runs `_note_captured` as it starts (by value: the module is not
    importable there)."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    workers_tmp = tmp_path_factory.mktemp("workers_tmp")
    with pytest.MonkeyPatch.context() as patch:  # Ray's processes take the environment they are started with
        patch.setenv("RAY_TMPDIR", os.environ.get("RAY_TMPDIR") or tempfile.gettempdir())
        patch.setenv("TMPDIR", str(workers_tmp))
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"worker_process_setup_hook": _note_captured})
    yield workers_tmp
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_run(ray_session, tiny_ckpt: Path, folder: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same export on Ray: one actor, batches of 3 (other batches than the local run's); the actor dies
    after writing its first batch's files (as on a node that is lost), and its batch runs again."""
    from vitviz.batch.ray_engine import FAULT_ENV

    out = tmp_path_factory.mktemp("ray_out")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FAULT_ENV, str(tmp_path_factory.mktemp("fault") / "died"))
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
    # the files the lost worker wrote are this run's: its images are done, their files counted (the retried batch
    # found them there and left them alone)
    assert manifest["summary"]["done"] == 12 and manifest["summary"]["failed"] == 1
    assert manifest["summary"]["files"] == 12 * 30 and not manifest["summary"]["interrupted"]
    failed = [e for e in manifest["images"] if e["status"] == "failed"]
    assert [Path(e["path"]).name for e in failed] == ["trunc.png"] and "trunc.png" in failed[0]["error"]
    assert manifest["images"] == local["images"]  # paths, hashes, statuses, outputs and the error: one manifest


@pytest.mark.ray
def test_the_manifest_names_the_engine_and_its_workers(ray_run) -> None:
    engine = _manifest(ray_run[0])["engine"]
    assert engine["name"] == "ray" and engine["actors"] == 1 and engine["restarts"] == 1
    assert engine["decoded_in_actors"] == 0, "Ray Data fused the decoding into the model actors"
    assert sum(w["images"] for w in engine["workers"]) == 13 and engine["workers"][0]["device"] == "cpu"
    assert engine["model_shipped"] == "path"


@pytest.mark.ray
def test_resume_after_an_interrupted_run(ray_session, tiny_ckpt: Path, folder: Path, local_run: Path,
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl+C after the fourth image: what is on disk is recorded; the rerun skips it and finishes the rest."""
    from vitviz.batch.jobs import sha256_file
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
    for entry in first["images"]:  # every output the manifest lists is on disk, complete, and hashed
        for name in entry["outputs"]:
            assert _files(out)[name] == _files(local_run)[name]
        if entry["status"] in ("done", "skipped"):
            assert entry["sha256"] == sha256_file(Path(entry["path"])), entry["path"]
    # An actor stopped in the middle of a write leaves its atomic writer's temporary file (`.NAME.PID@HOST-*.tmp`,
    # never an output); the rerun removes it (`remove_stale_temps`), as the last comparison shows.
    finished = [name for name in _files(out) if not re.fullmatch(r"(.*/)?\.[^/]+\.\d+@[^/]+\.tmp", name)]
    assert first["summary"]["files"] == sum(len(e["outputs"]) for e in first["images"]) == len(finished)
    done = {e["path"] for e in first["images"] if e["status"] == "done"}

    assert _export(tiny_ckpt, [str(folder)], out, *MAPS, "--engine", "ray", "--actors", "1", "--quiet") == 1
    second = _manifest(out)
    assert {e["path"] for e in second["images"] if e["status"] == "skipped"} == done
    assert second["summary"]["done"] == 12 - len(done) and second["summary"]["failed"] == 1
    assert second["engine"]["resumed_from_manifest"] >= 3  # skipped without being read again
    assert _files(out) == _files(local_run)


@pytest.mark.ray
def test_progress_moves_a_batch_at_a_time(ray_session, tiny_ckpt: Path, folder: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor waits before its second batch until the first one's progress has been shown: it is shown while
    the actor still works (not when a block of several batches is done)."""
    from vitviz.batch.ray_engine import GATE_ENV
    from vitviz.cli.progress import ProgressBar

    gate = tmp_path / "shown"
    monkeypatch.setenv(GATE_ENV, str(gate))
    advance = ProgressBar.advance

    def shown(self: ProgressBar, n: int = 1) -> None:
        gate.touch()
        advance(self, n)

    monkeypatch.setattr(ProgressBar, "advance", shown)
    images = [str(folder / f"img{i}.png") for i in range(6)]
    assert _export(tiny_ckpt, images, tmp_path / "out", "--maps", "cls", "--engine", "ray", "--actors", "1",
                   "--batch-size", "2", "--quiet") == 0
    assert gate.exists() and not Path(f"{gate}.late").exists(), "no progress until the actor's block was done"


@pytest.mark.ray
def test_uris_globs_and_lists_and_a_worker_that_dies(ray_session: Path, tiny_ckpt: Path, folder: Path,
                                                     local_run: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    """Inputs as a list of file:// URIs and a glob, the output a pyarrow.fs URI, the model shipped through the
    object store; the model actor dies after writing its first batch into its temporary folder: Ray restarts it,
    the batch is retried, the run says so and completes, Ray's own lines about it go to its log file, and the
    workers' temporary folder holds afterwards what it held before (no model copy, no unsent file)."""
    from vitviz.batch.ray_engine import FAULT_ENV

    listing = tmp_path / "images.txt"
    listing.write_text("# three of them\n" + "".join(f"{(folder / f'img{i}.png').as_uri()}\n" for i in (2, 3, 4)))
    out = tmp_path / "remote"
    monkeypatch.setenv(FAULT_ENV, str(tmp_path / "died"))
    before = sorted(os.listdir(ray_session))
    code = _export(tiny_ckpt, [str(listing), str(folder / "sub" / "*.png")], out.as_uri(), "--maps", "cls,rollout",
                   "--layers", "all", "--which-heads", "all,mean", "--engine", "ray", "--actors", "1",
                   "--batch-size", "2", "--ship-model", "store")
    assert code == 0 and (tmp_path / "died").exists()
    assert sorted(os.listdir(ray_session)) == before
    captured = capsys.readouterr()
    assert "died and Ray restarted it" in captured.err
    assert "(raylet)" not in captured.out + captured.err and "worker died" not in captured.out
    manifest = _manifest(out)
    assert manifest["engine"]["restarts"] >= 1 and manifest["summary"]["done"] == 5
    assert manifest["engine"]["model_shipped"] == "object store" and Path(manifest["engine"]["log"]).is_file()
    assert [e["path"] for e in manifest["images"]][:3] == [(folder / f"img{i}.png").as_uri() for i in (2, 3, 4)]
    got, want = _files(out), _files(local_run)
    assert len(got) == 5 * 8 and not [p for p in got if p.startswith(".")]
    for name, data in got.items():  # the glob's files sit at the top: their folder is the pattern's
        assert data == want.get(name, want.get(f"sub/{name}")), name


@pytest.mark.ray
def test_a_list_is_exported_as_it_is_read(ray_session, tiny_ckpt: Path, folder: Path, local_run: Path,
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capfd: pytest.CaptureFixture) -> None:
    """Chunks of two: a list of five images runs as three Ray Data runs, the first image finished before the
    list's last line is read; every image has its entry and the local engine's bytes; Ray's C++ lines (an ERROR
    line as an actor starts) stay off stderr; a rerun skips all five from the manifest without starting a run."""
    import vitviz.batch.ray_engine as ray_engine
    from vitviz.cli.progress import ProgressBar

    monkeypatch.setattr(ray_engine, "CHUNK", 2)
    read: list[str] = []
    lines = ray_engine._list_lines

    def counted(text: str):  # noqa: ANN202
        for line in lines(text):
            read.append(line)
            yield line

    monkeypatch.setattr(ray_engine, "_list_lines", counted)
    read_at_progress: list[int] = []
    advance = ProgressBar.advance

    def seen(self: ProgressBar, n: int = 1) -> None:
        read_at_progress.append(len(read))
        advance(self, n)

    monkeypatch.setattr(ProgressBar, "advance", seen)
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{folder / f'img{i}.png'}\n" for i in range(2, 7)))
    out = tmp_path / "out"
    args = ["--maps", "cls,rollout", "--layers", "all", "--which-heads", "all,mean", "--engine", "ray", "--actors",
            "1", "--batch-size", "2"]
    assert _export(tiny_ckpt, [str(listing)], out, *args) == 0
    assert read_at_progress[0] <= 3 < len(read) == 6     # 5 lines and the empty rest after the last newline
    manifest = _manifest(out)
    assert [Path(e["path"]).name for e in manifest["images"]] == [f"img{i}.png" for i in range(2, 7)]
    assert manifest["summary"]["done"] == 5 and manifest["engine"]["chunks"] == 3
    assert manifest["engine"]["listed_all"] is True
    got, want = _files(out), _files(local_run)
    assert len(got) == 5 * 8 and all(data == want[name] for name, data in got.items())
    assert manifest["summary"]["files"] == sum(len(e["outputs"]) for e in manifest["images"]) == len(got)
    err = capfd.readouterr().err
    assert not [line for line in err.splitlines() if ray_engine.NATIVE_LINE.match(line.encode())], err[-2000:]

    assert _export(tiny_ckpt, [str(listing)], out, *args, "--quiet") == 0
    again = _manifest(out)
    assert again["engine"]["resumed_from_manifest"] == 5 and again["engine"]["chunks"] == 0
    assert [e["status"] for e in again["images"]] == ["skipped"] * 5 and _files(out) == got


@pytest.mark.ray
def test_a_streamed_export_on_ray_writes_the_local_pictures_without_the_stack(
        ray_session, tiny_ckpt: Path, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CLS, token and rollout maps (`Plan.stream`): the Ray engine's actors keep of each layer only what the maps
    read, as the local engine does -- the same PNGs, byte for byte, as the local engine's streamed export, and no
    actor ever calls `forward_captured` (noted by `_note_captured` in each worker); the control, a mean map (not
    streamable), shows the note is taken where it is called."""
    note = tmp_path / "captured.txt"
    monkeypatch.setenv(NOTE_CAPTURED, str(note))
    images = [str(folder / f"img{i}.png") for i in range(4)]
    maps = ["--maps", "cls,token:3,rollout", "--layers", "all", "--which-heads", "all,mean", "--quiet"]
    assert _export(tiny_ckpt, images, tmp_path / "local", *maps) == 0
    assert _export(tiny_ckpt, images, tmp_path / "ray", *maps, "--engine", "ray", "--actors", "1",
                   "--batch-size", "3") == 0
    got, want = _files(tmp_path / "ray"), _files(tmp_path / "local")
    assert len(want) == 4 * 14 and got == want   # per image: 2 layers x (3 heads + mean) x 2 maps, and 2 rollouts
    assert not note.exists(), note.read_text()
    assert _export(tiny_ckpt, images[:1], tmp_path / "control", "--maps", "mean", "--quiet", "--engine", "ray",
                   "--actors", "1") == 0
    assert note.read_text().startswith("forward_captured in process ")


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


def test_an_address_that_does_not_answer_is_named_at_once(tiny_ckpt: Path, folder: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """--address of a port where nothing listens: vitviz's message naming it, exit 2 (Ray alone retries for
    minutes)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray of this process is running (the module's Ray tests); the address would not be used")
    with socket.socket() as free:  # a port nothing listens on: bound, then released
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert _export(tiny_ckpt, [str(folder / "img1.png")], tmp_path / "o", "--engine", "ray",
                   "--address", f"127.0.0.1:{port}") == 2
    err = capsys.readouterr().err
    assert f"cannot join the Ray cluster at 127.0.0.1:{port}" in err and "accepted no connection" in err
    assert not ray.is_initialized()


def test_the_manifest_says_what_is_on_disk_after_a_stop(folder: Path, tmp_path: Path) -> None:
    """The driver's record of a chunk after a stop or a lost worker (`RayExporter._settle`), without Ray: an image
    a lost worker wrote (its retry found the files: 'skipped') is done; one no actor reported with all its files
    there is done and hashed; one with part of its files stays pending; files counted as they are on disk."""
    from vitviz.batch.jobs import Job, sha256_file
    from vitviz.batch.ray_engine import Destination, RayExporter, RaySettings, Source

    out = tmp_path / "out"
    out.mkdir()
    images = [folder / f"img{i}.png" for i in range(3)]
    jobs = [Job(i, p, [out / f"img{i}_a.png", out / f"img{i}_b.png"]) for i, p in enumerate(images)]
    (out / "img2_a.png").write_bytes(b"from an earlier run")
    exporter = RayExporter(None, {}, "cpu", None, None, [], out, Destination(out), RaySettings())  # type: ignore
    exporter.jobs = {job.index: job for job in jobs}
    exporter._sources = {i: (Source(p, str(p), Path(".")), p.stem) for i, p in enumerate(images)}
    exporter._before = exporter._present(jobs)
    for name in ("img0_a", "img0_b", "img1_a", "img1_b"):
        (out / f"{name}.png").write_bytes(name.encode())
    jobs[0].status, exporter.counts["skipped"] = "skipped", 1  # the retried batch found the lost worker's files
    exporter._settle(jobs)
    assert [j.status for j in jobs] == ["done", "done", "pending"]
    assert jobs[1].sha256 == sha256_file(images[1]) and jobs[0].written == jobs[0].outputs
    assert exporter.counts == {"done": 2, "skipped": 0, "failed": 0, "files": 5}


def test_a_stopped_chunk_waits_for_this_nodes_actors_before_it_is_recorded(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray lets an actor it releases after a stop finish the batch it is running: its image's files landed after
    the chunk was recorded (on disk, not in the manifest; `test_resume_after_an_interrupted_run` failed now and
    then). A stopped chunk now waits for this node's actors to exit first. Here the actor is a process that writes
    its image's two files 0.5 s after the stop: the record counts them and calls the image done."""
    import subprocess
    import threading

    from vitviz.batch import ray_engine
    from vitviz.batch.jobs import Job
    from vitviz.batch.ray_engine import Destination, RayExporter, RaySettings, Source, _Worker

    out = tmp_path / "out"
    out.mkdir()
    image = folder / "img0.png"
    job = Job(0, image, [out / "img0_a.png", out / "img0_b.png"])
    exporter = RayExporter(None, {}, "cpu", None, None, [], out, Destination(out), RaySettings())  # type: ignore
    exporter.plan = type("Plan", (), {"jobs": staticmethod(lambda pairs, root, stems: [job])})()
    exporter._spill = tempfile.TemporaryFile("w+", encoding="utf-8")
    names = [str(o) for o in job.outputs]
    writes = f"import time, pathlib; time.sleep(0.5); [pathlib.Path(p).write_bytes(b'x') for p in {names!r}]"
    actor = subprocess.Popen([sys.executable, "-c", writes])
    threading.Thread(target=actor.wait, daemon=True).start()      # reaped at once, as Ray's raylet reaps its actors
    exporter.workers = {"actor": _Worker("node-here", "cpu", {actor.pid})}
    monkeypatch.setattr(ray_engine, "_node_id", lambda: "node-here")

    def stopped(_todo: list[Job]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(exporter, "_run", stopped)
    with pytest.raises(KeyboardInterrupt):
        exporter._chunk([(Source(image, str(image), Path(".")), image.stem)], [])
    assert actor.poll() is not None
    assert job.status == "done" and exporter.counts["files"] == 2 and job.written == job.outputs


def test_a_list_is_named_as_it_is_listed(folder: Path, tmp_path: Path) -> None:
    """A list's images are named in one pass (the first keeps its stem, a later one of the same folder and stem
    takes `_ext`, then `_2`...), duplicates left out; local files and folders keep the local engine's names."""
    from vitviz.batch.jobs import collect_inputs, unique_stems
    from vitviz.batch.plan import safe_stem
    from vitviz.batch.ray_engine import SourceStream

    other = _image(tmp_path / "b" / "img0.png", 3, (20, 20))
    listing = tmp_path / "list.txt"
    listing.write_text(f"{folder}/img0.png\n{folder}/img0.jpg\n{other}\n{folder}/img0.png\n{folder}/img1.png\n")
    stream = SourceStream([str(listing)], tmp_path / "out", None)
    assert stream.listed == 0 and not stream.complete
    got = [(Path(s.read).name, stem) for s, stem in stream]
    assert got == [("img0.png", "img0"), ("img0.jpg", "img0_jpg"), ("img0.png", "img0_png"), ("img1.png", "img1")]
    assert stream.listed == 4 and stream.complete
    plain = SourceStream([str(folder)], tmp_path / "out", None)
    pairs = collect_inputs([str(folder)], tmp_path / "out", None)
    assert [stem for _, stem in plain] == unique_stems(pairs, safe_stem)   # img0_png, img0_jpg: the local engine's


def test_native_ray_lines_on_stderr_go_to_the_sink(capfd: pytest.CaptureFixture) -> None:
    """Ray's C++ lines written on file descriptor 2 go to the log; vitviz's own lines and a progress bar redrawn
    without a newline reach the terminal as written."""
    from vitviz.batch.ray_engine import NativeLines

    sink: list[bytes] = []
    native = NativeLines(sink.append)
    native.start()
    try:
        os.write(2, b"[2026-12-06 11:49:07,171 E 30590 30590] core_worker.cc:2465: Actor with class name: 'X'\n")
        os.write(2, b"vitviz: a line of its own\n")
        os.write(2, b"\r[####      ] 2/5")    # sys.stderr writes to fd 2 (under capfd it would bypass it)
    finally:
        native.stop()
    assert capfd.readouterr().err == "vitviz: a line of its own\n\r[####      ] 2/5"
    assert [line.decode() for line in sink] == [
        "[2026-12-06 11:49:07,171 E 30590 30590] core_worker.cc:2465: Actor with class name: 'X'\n"]


class _SilentPort:
    """A port on 127.0.0.1 that accepts connections and never answers (a GCS that will not let this computer
    join: another service, a token it refuses)."""

    def __enter__(self) -> int:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()
        return self.sock.getsockname()[1]

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                continue

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


def test_a_cluster_that_accepts_but_does_not_answer_is_named_in_bounded_time(
        tiny_ckpt: Path, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    """--address of a port that accepts connections but never answers as Ray (as a cluster with token
    authentication that refuses this computer): vitviz's message naming it and the token, exit 2, `ray.init`
    never reached (it would try for about a quarter of an hour); a token at ~/.ray/auth_token is said."""
    ray = pytest.importorskip("ray")
    import vitviz.batch.ray_engine as ray_engine

    if ray.is_initialized():
        pytest.skip("a Ray of this process is running (the module's Ray tests); the address would not be used")

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("ray.init was reached: the join was not bounded")

    monkeypatch.setattr(ray, "init", never)
    monkeypatch.setattr(ray_engine, "JOIN_TIMEOUT", 1.0)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("not the cluster's")
    with _SilentPort() as port:
        code = _export(tiny_ckpt, [str(folder / "img1.png")], tmp_path / "o", "--engine", "ray",
                       "--address", f"127.0.0.1:{port}", "--quiet")
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"cannot join the Ray cluster at 127.0.0.1:{port}: it accepts connections but did not answer" in err
    assert "within 1 s" in err and "RAY_AUTH_MODE=token" in err
    assert f"this computer has one in {tmp_path / '.ray' / 'auth_token'}" in err and "Traceback" not in err


# --------------------------------------------------------------- hostile inputs and manifests (issue 34; no Ray needed)

def test_a_list_that_is_a_fifo_or_dev_zero_is_refused(tmp_path: Path) -> None:
    from vitviz.batch.ray_engine import collect_sources

    pipe = fifo(tmp_path / "list.txt")
    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    for listed, what in ((pipe, "named pipe"), (zero, "character device")):
        with pytest.raises(InputError, match=what):
            collect_sources([str(listed)], tmp_path / "out", None)
        with pytest.raises(InputError, match=what):
            collect_sources([listed.as_uri()], tmp_path / "out", None)


def test_a_file_uri_of_a_fifo_or_dev_zero_fails_as_that_image(tmp_path: Path) -> None:
    from vitviz.batch.ray_engine import collect_sources, fetch

    pipe = fifo(tmp_path / "fifo.png")
    with pytest.raises(InputError, match="named pipe"):
        fetch(pipe.as_uri())
    with pytest.raises(InputError, match="character device"):
        fetch("file:///dev/zero")
    with pytest.raises(InputError, match="character device"):   # a URI naming no image: looked at, refused
        collect_sources(["file:///dev/zero"], tmp_path / "out", None)


def test_a_manifest_that_is_a_fifo_dev_zero_or_deeply_nested_is_refused_on_resume(tmp_path: Path) -> None:
    from vitviz.batch.ray_engine import Destination

    dest = Destination(tmp_path)
    assert dest.read_json("manifest.json") is None      # none: a first run
    fifo(tmp_path / "manifest.json")
    with pytest.raises(InputError, match="named pipe"):
        dest.read_json("manifest.json")
    os.unlink(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").symlink_to("/dev/zero")
    with pytest.raises(InputError, match="character device"):
        dest.read_json("manifest.json")
    os.unlink(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(InputError, match="nested too deeply"):
        dest.read_json("manifest.json")
    remote = Destination(tmp_path.as_uri())
    with pytest.raises(InputError, match="nested too deeply"):
        remote.read_json("manifest.json")


@pytest.mark.parametrize("uri", ["ftp://host/a.png", "http://host/a.png", "https://host/a.png", "FILE:///tmp/a.png",
                                 "file://otherhost/tmp/a.png", "hdfs://localhost:1/a.png", "ftp://host/folder"])
def test_uris_pyarrow_cannot_open_are_refused_at_collection(uri: str, tmp_path: Path) -> None:
    from vitviz.batch.ray_engine import collect_sources, fetch

    with pytest.raises(InputError, match="pyarrow.fs cannot open"):
        collect_sources([uri + "/*.png" if uri.endswith("folder") else uri.replace("a.png", "")],
                        tmp_path / "out", None)
    if uri.endswith(".png"):
        with pytest.raises(InputError, match="pyarrow.fs cannot open"):
            fetch(uri)


def test_an_unopenable_uri_in_a_list_fails_only_that_image(tmp_ckpt_plan, tmp_path: Path) -> None:
    """read_row (a decoding task) reports the URI as that image's failure; the other listed image is read."""
    from vitviz.batch.ray_engine import Destination, collect_sources, read_row

    spec, plan = tmp_ckpt_plan
    good = random_png(tmp_path / "good.png")
    listing = tmp_path / "list.txt"
    listing.write_text(f"ftp://host/a.png\n{good}\nhttps://host/b.png\n")
    sources = collect_sources([str(listing)], tmp_path / "out", None)
    assert [s.read for s in sources] == ["ftp://host/a.png", str(good), "https://host/b.png"]
    dest = Destination(tmp_path / "out")
    statuses = []
    for i, s in enumerate(sources):
        row = {"source": str(s.path), "read": s.read, "sub": str(s.sub), "stem": f"s{i}", "index": i,
               "remote": s.remote}
        out = read_row(row, spec, plan, dest)
        statuses.append(out["status"])
        if out["status"] == "failed":
            assert "pyarrow.fs cannot open" in out["error"]
    assert statuses == ["failed", "ready", "failed"]


def test_a_long_list_is_read_a_line_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The list is decoded in chunks (a UTF-8 character split between chunks included), never read whole."""
    import vitviz.batch.ray_engine as ray_engine

    names = [f"d/\u00e9t\u00e9_{i}.png" for i in range(3000)]
    listing = tmp_path / "list.txt"
    listing.write_text("\n".join(names) + "\n", encoding="utf-8")
    reads = []
    real_open = open

    class Spy:
        def __init__(self, handle):
            self.handle = handle

        def read(self, n=-1):
            assert n > 0, "the whole list was read at once"
            reads.append(n)
            return self.handle.read(7)   # tiny chunks: characters split between them

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(ray_engine, "open", lambda p, m="r": Spy(real_open(p, m)), raising=False)
    got = [s.path for s in ray_engine.collect_sources([str(listing)], tmp_path / "out", None)]
    assert got == [tmp_path / n for n in names]
    assert len(reads) > 1000


@pytest.fixture()
def tmp_ckpt_plan(tiny_ckpt: Path):
    from _tiny import HEADS

    from vitviz.batch.plan import Plan, parse_maps
    from vitviz.core.drawing.render import RenderOptions

    model = vitviz.load(tiny_ckpt, heads=HEADS)
    plan = Plan(parse_maps("cls"), [0], ["mean"], RenderOptions())
    return model.spec, plan
