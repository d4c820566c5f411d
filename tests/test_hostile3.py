"""Hostile inputs, round three (issue 34): the surfaces added in the round before -- the Ray engine's inputs and
manifest, head matching and timelines, verify's arguments, the answers store, user code's torch state. Every bad
input is a `VitvizError` naming what was wrong and what was expected; nothing blocks on a FIFO or reads
/dev/zero; nothing grows without bound.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from _windowed import save_tiny_timm_swin

import vitviz
from vitviz.batch.jobs import InputError
from vitviz.errors import VitvizError

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo"


def _png(path: Path, seed: int = 0, size: int = 32) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)
    return path


def _cli(*argv: str) -> int:
    """`vitviz ARGV...`'s exit code, whether argparse exits or the command returns it."""
    from vitviz.cli import main

    try:
        return main(list(argv))
    except SystemExit as e:
        return int(e.code)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


# ------------------------------------------------------------------------------------ Ray inputs and manifest

def test_a_list_that_is_a_fifo_or_dev_zero_is_refused(tmp_path: Path) -> None:
    from vitviz.batch.ray_engine import collect_sources

    fifo = _fifo(tmp_path / "list.txt")
    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    for listed, what in ((fifo, "named pipe"), (zero, "character device")):
        with pytest.raises(InputError, match=what):
            collect_sources([str(listed)], tmp_path / "out", None)
        with pytest.raises(InputError, match=what):
            collect_sources([listed.as_uri()], tmp_path / "out", None)


def test_a_file_uri_of_a_fifo_or_dev_zero_fails_as_that_image(tmp_path: Path) -> None:
    from vitviz.batch.ray_engine import collect_sources, fetch

    fifo = _fifo(tmp_path / "fifo.png")
    with pytest.raises(InputError, match="named pipe"):
        fetch(fifo.as_uri())
    with pytest.raises(InputError, match="character device"):
        fetch("file:///dev/zero")
    with pytest.raises(InputError, match="character device"):   # a URI naming no image: looked at, refused
        collect_sources(["file:///dev/zero"], tmp_path / "out", None)


def test_a_manifest_that_is_a_fifo_dev_zero_or_deeply_nested_is_refused_on_resume(tmp_path: Path) -> None:
    from vitviz.batch.ray_engine import Destination

    dest = Destination(tmp_path)
    assert dest.read_json("manifest.json") is None      # none: a first run
    _fifo(tmp_path / "manifest.json")
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
    good = _png(tmp_path / "good.png")
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


# ------------------------------------------------------------------------------ a torch-hub name's hash, bounded

def test_a_hub_named_file_far_larger_than_its_tensors_is_not_hashed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """'NAME-HASH.pth' padded to 40 GiB (sparse): the name is not checked by reading 40 GiB (open is never
    called); one within the slack but over HASH_LIMIT says in its provenance that it was not hashed."""
    import types

    import torch

    from vitviz.core.reading import hyperparams as hp

    big = tmp_path / "vit_b_16-c867db91.pth"
    with open(big, "wb") as f:
        f.truncate(40 << 30)
    raw = types.SimpleNamespace(weights_file=big, tensors={"w": torch.zeros(10)}, tower=None)

    def no_open(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the file was opened to hash it")

    monkeypatch.setattr(hp, "open", no_open, raising=False)
    assert hp._published_file(raw) == ""
    raw.tensors = {"w": torch.zeros((40 << 30) // 4 // 2, dtype=torch.float32, device="meta")}   # 20 GiB held
    said = hp._published_file(raw)
    assert said.startswith("derived") and "not hashed" in said and "40.0 GiB" in said


# ------------------------------------------------------------------------------------- layer and head ranges

@pytest.mark.parametrize("option, value", [("--layers", "0-9999999"), ("--which-heads", "0-9999999"),
                                           ("--layers", "0-99999999999"), ("--which-heads", "3,0-99999999999")])
def test_huge_layer_and_head_ranges_are_refused_before_expanding(option: str, value: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    image = _png(tmp_path / "a.png")
    assert _cli("export", "--model", str(DEMO), str(image), "--out", str(tmp_path / "out"), option, value) == 2
    err = capsys.readouterr().err
    assert "no model has" in err and "Traceback" not in err and "MemoryError" not in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ head matching

@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (6, 6), (2, 6), (6, 3)])
def test_head_matching_without_scipy_is_exact(shape) -> None:
    from vitviz.core.analyses import compare as cmp

    rng = np.random.default_rng(sum(shape))
    for _ in range(6):
        s = rng.normal(size=shape)
        s = np.round(s, 1) if rng.random() < 0.5 else s   # ties
        got, want = cmp.assign_numpy(s), cmp.brute_force_assign(s)
        assert sum(s[i, j] for i, j in got) == pytest.approx(sum(s[i, j] for i, j in want), abs=1e-12)
        assert len(got) == min(shape) and len({j for _, j in got}) == len(got)


def test_head_matching_uses_scipy_when_there_and_numpy_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from vitviz.core.analyses import compare as cmp

    pytest.importorskip("scipy")
    s = np.random.default_rng(3).normal(size=(96, 130))
    with_scipy = cmp.assign(s)
    real_import = builtins.__import__

    def no_scipy(name, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name.startswith("scipy"):
            raise ImportError("no scipy here")
        return real_import(name, *a, **k)

    calls = []
    monkeypatch.setattr(builtins, "__import__", no_scipy)
    monkeypatch.setattr(cmp, "assign_numpy", lambda x, real=cmp.assign_numpy: calls.append(1) or real(x))
    without = cmp.assign(s)
    assert calls and sum(s[i, j] for i, j in without) == pytest.approx(sum(s[i, j] for i, j in with_scipy))


# ------------------------------------------------------------------------------------ compare and timeline inputs

@pytest.fixture(scope="module")
def swin_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny timm Swin v1 hub folder (64 px, 4x4 windows, 2 stages)."""
    pytest.importorskip("timm")
    return save_tiny_timm_swin(tmp_path_factory.mktemp("swin"))


@pytest.fixture(scope="module")
def demo():
    return vitviz.load(DEMO)


def test_compare_refuses_what_is_not_a_loaded_global_attention_model(demo, swin_folder: Path,
                                                                     tmp_path: Path) -> None:
    from vitviz.core.analyses.compare import CompareError

    image = _png(tmp_path / "a.png", size=64)
    for b, match in ((None, "model B is NoneType"), ("b.pth", "load it first"), (str(DEMO), "load it first")):
        with pytest.raises(CompareError, match=match):
            vitviz.compare(demo, b, [image])
    with pytest.raises(CompareError, match="model A is NoneType"):
        vitviz.compare(None, demo, [image])
    swin = vitviz.load(swin_folder)
    for a, b, side in ((demo, swin, "model B"), (swin, demo, "model A")):
        with pytest.raises(CompareError, match=f"{side} .*attends inside windows"):
            vitviz.compare(a, b, [image])
    with pytest.raises(CompareError, match="kind=None"):
        vitviz.compare(demo, demo, [image], kind=None)
    with pytest.raises(CompareError, match="heads=None"):
        vitviz.compare(demo, demo, [image], heads=None)
    with pytest.raises(CompareError, match="list of images"):
        vitviz.compare(demo, demo, image)


@pytest.mark.parametrize("order", ["AB", "BA"])
def test_export_compare_with_a_windowed_model_is_refused(order: str, swin_folder: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    image = _png(tmp_path / "a.png", size=64)
    a, b = (DEMO, swin_folder) if order == "AB" else (swin_folder, DEMO)
    code = _cli("export", "--model", str(a), "--compare", str(b), str(image), "--out", str(tmp_path / "out"),
                "--quiet", "--no-verify")
    err = capsys.readouterr().err
    assert code == 2 and "attends inside windows" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", ["--compare", "--timeline"])
def test_an_empty_compare_or_timeline_is_refused(option: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    image = _png(tmp_path / "a.png")
    code = _cli("export", "--model", str(DEMO), option, "", str(image), "--out", str(tmp_path / "out"))
    assert code == 2 and "empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _run_folder(tmp_path: Path, source: Path, count: int = 2) -> Path:
    import shutil

    run = tmp_path / "run"
    for k in range(count):
        shutil.copytree(source, run / f"checkpoint-{k + 1}")
    return run


def test_a_windowed_run_is_refused_by_the_timeline(swin_folder: Path, tmp_path: Path) -> None:
    from vitviz.core.analyses.timeline import TimelineError, TimelineStore, open_run

    run = _run_folder(tmp_path, swin_folder)
    with pytest.raises(TimelineError, match="windowed model"):
        open_run(run).model(0)
    store = TimelineStore(open_run(run))       # the window's store: the checkpoint is recorded as failed
    store.add_image("a", str(_png(tmp_path / "a.png", size=64)))
    with pytest.raises(TimelineError, match="windowed model"):
        store.result(0, "a")
    assert 0 in store.failed and "windowed model" in store.failed[0]


def test_unreadable_run_folders_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint folder at mode 000 (and a run folder that can be entered but not listed): a TimelineError
    naming it. Permissions are simulated (the tests may run as root, whom mode 000 does not stop)."""
    from vitviz.core.analyses.timeline import TimelineError, open_run

    run = _run_folder(tmp_path, DEMO)
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
    run = _run_folder(tmp_path, DEMO)
    image = _png(tmp_path / "a.png", size=64)
    os.chmod(run / "checkpoint-2", 0)
    try:
        if os.access(run / "checkpoint-2", os.R_OK):
            pytest.skip("running as root: mode 000 does not stop reading")
        code = _cli("export", "--timeline", str(run), str(image), "--out", str(tmp_path / "out"), "--quiet")
    finally:
        os.chmod(run / "checkpoint-2", 0o755)
    err = capsys.readouterr().err
    assert code == 2 and "checkpoint-2: cannot be read" in err and "Traceback" not in err


@pytest.mark.parametrize("side, at", [("compare", 4), ("compare", 5), ("timeline", 4)])
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_an_interrupted_compare_or_timeline_leaves_a_manifest_equal_to_the_disk(
        side: str, at: int, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal arrives as the `at`-th picture is written (for a comparison: A's, B's and the difference's
    pictures in turn; B's and the difference's names are known only once the heads are matched): exit 130, and
    manifest.json records exactly the files on disk (as the plain export's does), the interrupted image's
    finished files included."""
    import signal

    from vitviz.batch import compare as side_export

    images = [_png(tmp_path / "in" / f"{n}.png", seed=n, size=64) for n in range(3)]
    out = tmp_path / "out"
    real = side_export.files.write_png_atomic
    count = [0]

    def write(*a, **k):  # noqa: ANN002, ANN003, ANN202
        path = real(*a, **k)
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), getattr(signal, how))
        return path

    monkeypatch.setattr(side_export.files, "write_png_atomic", write)
    given = ["--compare", str(DEMO), "--model", str(DEMO)] if side == "compare" else \
        ["--timeline", str(_run_folder(tmp_path, DEMO, 3)), "--no-animation"]
    code = _cli("export", *given, *map(str, images), "--out", str(out), "--quiet", "--no-verify",
                "--layers", "all")
    assert code == 130
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["summary"]["interrupted"] is True
    recorded = {o for e in manifest["images"] for o in e["outputs"]}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    assert recorded == on_disk and len(on_disk) >= 4
    assert manifest["summary"]["files"] == len(on_disk)


# -------------------------------------------------------------------------------------- Swin smaller than a patch

@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_swin_input_smaller_than_one_patch_is_refused(size: int, swin_folder: Path, tmp_path: Path) -> None:
    from vitviz.errors import InconsistentCheckpointError, OverrideError

    image = np.zeros((64, 64, 3), np.uint8)
    with pytest.raises(OverrideError, match="smaller than one 4 px patch"):
        vitviz.load(swin_folder, image_size=size)
    with pytest.raises(VitvizError, match="smaller than one patch"):
        vitviz.load(swin_folder).run(image, image_size=size)
    if size != 2:      # img_size 1 or 3 in its config
        import shutil

        folder = tmp_path / "swin"
        shutil.copytree(swin_folder, folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg.setdefault("model_args", {})["img_size"] = size
        cfg.setdefault("pretrained_cfg", {})["input_size"] = [3, size, size]
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(InconsistentCheckpointError, match=f"image size {size}x{size} .*config.json"):
            vitviz.load(folder)
    assert vitviz.load(swin_folder).run(image, image_size=4).spec.image_size == (4, 4)   # one patch runs


# ------------------------------------------------------------------------------------------- verify's arguments

@pytest.mark.parametrize("options, match", [
    (dict(device="bogus"), "unknown device 'bogus'"), (dict(device="cuda:9"), "cuda:9"),
    (dict(sizes="x"), "sizes='x'"), (dict(sizes=5), "sizes=5"), (dict(sizes=[2.5]), "size 2.5"),
    (dict(sizes=[True]), "size True"), (dict(sizes=[(64,)]), r"size \(64,\)"),
    (dict(sizes=[100000]), r"needs .*expected a smaller size"), (dict(sizes=[]), "at least one")])
def test_verify_refuses_bad_devices_and_sizes(options: dict, match: str, demo) -> None:
    with pytest.raises(VitvizError, match=match):
        vitviz.verify(demo, **options)


def test_verify_with_a_timm_whose_import_raises_says_so(tmp_path: Path, tiny_ckpt: Path) -> None:
    """A broken install (a torchvision that does not match torch makes `import timm` raise RuntimeError): the
    verdict is 'not verified', naming the error, for a named model and for a file nothing names."""
    import subprocess
    import sys

    (tmp_path / "timm").mkdir()
    (tmp_path / "timm" / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    script = ("import sys, warnings, vitviz; warnings.simplefilter('ignore'); from _tiny import HEADS\n"
              "for path, kw in ((sys.argv[1], {}), (sys.argv[2], {'heads': HEADS})):\n"
              "    print(vitviz.verify(vitviz.load(path, **kw)).summary())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parent),
                                                        str(DEMO.parents[1])])}
    done = subprocess.run([sys.executable, "-c", script, str(DEMO), str(tiny_ckpt)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("Not verified") for line in lines), done.stdout
    assert "operator torchvision::nms does not exist" in lines[0]


# --------------------------------------------------------------------------------------------- the answers store

def test_an_answers_store_nested_too_deeply_is_no_store_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    from vitviz.catalog import answers

    store = tmp_path / "answers.json"
    store.write_text("[" * 200_000 + "]" * 200_000)
    monkeypatch.setenv("VITVIZ_ANSWERS", str(store))
    with pytest.warns(RuntimeWarning, match="answers.json: JSON nested too deeply"):
        assert answers.read_all() == {}
    assert _cli("info", str(DEMO)) == 0
    err = capsys.readouterr().err
    assert "RecursionError" not in err and "Traceback" not in err


def test_remember_refuses_what_loading_would_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.catalog import answers
    from vitviz.errors import OverrideError

    store = tmp_path / "answers.json"
    monkeypatch.setenv("VITVIZ_ANSWERS", str(store))
    for values in ({"attn_scale": float("inf")}, {"heads": 10**30}, {"heads": 2.5}, {"attn_scale": float("nan")},
                   {"block_norm": "sideways"}):
        with pytest.raises(OverrideError, match=f"{store.name}: not remembered for"):
            answers.remember(str(DEMO), values)
    assert not store.exists()
    answers.remember(str(DEMO), {"heads": 4, "attn_scale": 0.25})
    assert answers.answers_for(str(DEMO)) == {"heads": 4, "attn_scale": 0.25}
    # a store written by hand (or by an older vitviz) with such values: they are dropped when read, never applied
    store.write_text(json.dumps({str(DEMO.absolute()): {"heads": 10**30, "attn_scale": 1e999, "act": "gelu"}})
                     .replace("Infinity", "1e999"))
    assert answers.answers_for(str(DEMO)) == {"act": "gelu"}


# ------------------------------------------------------------------------------------ user code's global state

def _probe_env() -> str | None:
    return os.environ.get("VITVIZ_ANSWERS")


LEAKS = {   # what the user's code runs -> what reads the state it changes (equal before and after)
    "device": ("torch.set_default_device('meta')", lambda: __import__("torch").get_default_device().type),
    "dtype": ("torch.set_default_dtype(torch.float64)", lambda: __import__("torch").get_default_dtype()),
    "grad": ("torch.set_grad_enabled(False)", lambda: __import__("torch").is_grad_enabled()),
    "seed": ("torch.manual_seed(1234)", lambda: __import__("torch").get_rng_state().sum().item()),
    "threads": ("torch.set_num_threads(1)", lambda: __import__("torch").get_num_threads()),
    "deterministic": ("torch.use_deterministic_algorithms(True)",
                      lambda: __import__("torch").are_deterministic_algorithms_enabled()),
    "precision": ("torch.set_float32_matmul_precision('medium')",
                  lambda: __import__("torch").get_float32_matmul_precision()),
    "anomaly": ("torch.autograd.set_detect_anomaly(True)", lambda: __import__("torch").is_anomaly_enabled()),
    "warnings": ("import warnings; warnings.simplefilter('ignore')", lambda: list(__import__("warnings").filters)),
    "cwd": ("import os; os.chdir('/')", os.getcwd),
    "recursion": ("import sys; sys.setrecursionlimit(200)", lambda: __import__("sys").getrecursionlimit()),
    "numpy": ("import numpy; numpy.seterr(all='raise')", lambda: np.geterr()),
    "sigint": ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)",
               lambda: __import__("signal").getsignal(__import__("signal").SIGINT)),
    "stderr": ("import sys, io; sys.stderr = io.StringIO()", lambda: id(__import__("sys").stderr)),
    "env": ("import os; os.environ['VITVIZ_ANSWERS'] = '/dev/zero'", _probe_env),
}


@pytest.mark.parametrize("leak", sorted(LEAKS))
@pytest.mark.parametrize("where", ["module", "factory", "forward"])
def test_user_code_does_not_leak_process_state_into_vitviz(leak: str, where: str, tmp_path: Path, demo) -> None:
    """A --code file that changes torch's or Python's process-wide state at import, in its factory or in its
    forward: after vitviz ran it, the state is what it was (so the demo runs and verifies as before: a float64
    default made the verification differ, a meta default device made the next load fail)."""
    import sys
    import warnings

    statement, probe = LEAKS[leak]
    code = tmp_path / f"leaky_{where}.py"
    body = {"module": f"{statement}\n", "factory": "", "forward": ""}[where]
    code.write_text(
        "import torch\nimport sys\nsys.path.insert(0, %r)\nfrom misbehaving_code import TinyViT\n%s\n"
        "class Leaky(TinyViT):\n"
        "    def forward(self, x):\n"
        "        %s\n"
        "        return super().forward(x)\n\n"
        "def make():\n"
        "    %s\n"
        "    return Leaky()\n" % (str(Path(__file__).parent), body,
                                  statement if where == "forward" else "pass",
                                  statement if where == "factory" else "pass"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        before = probe()
        try:
            model = vitviz.load(None, code=f"{code}:make", device="cpu")
            model.run(np.zeros((32, 32, 3), np.uint8))
        except VitvizError as e:   # a model built on 'meta' by its factory, or a forward making meta tensors
            assert leak == "device" and where != "module", e
            assert "meta" in str(e)
        assert probe() == before, leak
    sys.modules.pop("misbehaving_code", None)
    result = demo.run(np.zeros((64, 64, 3), np.uint8))
    assert result.attentions.dtype == np.float32 and np.isfinite(result.attentions).all()


def test_a_float64_default_from_user_code_does_not_make_verify_differ(tmp_path: Path, demo) -> None:
    import warnings

    code = tmp_path / "f64.py"
    code.write_text("import sys, torch\nsys.path.insert(0, %r)\nfrom misbehaving_code import TinyViT\n\n"
                    "def make():\n    torch.set_default_dtype(torch.float64)\n    return TinyViT()\n"
                    % str(Path(__file__).parent))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vitviz.load(None, code=f"{code}:make", device="cpu")
    check = vitviz.verify(demo)
    assert check.verdict == "verified", check.summary()


def test_a_name_with_a_nul_character_is_refused_by_the_path_check(tmp_path: Path) -> None:
    """Found by scripts/hostile3/fuzz.py: os.stat's ValueError ('embedded null byte') escaped the one check."""
    from vitviz.batch.ray_engine import fetch
    from vitviz.core.files import check_path

    fetch(_png(tmp_path / "a.png").as_uri())       # file:// known: a NUL then reaches the path check
    with pytest.raises(InputError, match="NUL character"):
        fetch("file:///tmp/a\x00.png")
    with pytest.raises(InputError, match="NUL character"):
        check_path(str(tmp_path / "a\x00b"), "a file", missing=InputError, bad=InputError)
    with pytest.raises(VitvizError, match="NUL character"):
        vitviz.load(str(tmp_path / "m\x00.pth"))


def test_cache_scans_and_text_configs_read_only_regular_json(tmp_path: Path) -> None:
    """`vitviz models` scanning a cache and the text tower's config read a config.json by name through the one
    check: a FIFO is skipped (it hung the scan's read), nesting 200,000 deep is no config (RecursionError)."""
    import importlib

    scan = importlib.import_module("vitviz.catalog.scan")
    text = importlib.import_module("vitviz.core.analyses.text")
    fifo = _fifo(tmp_path / "config.json")
    assert scan._read_json(fifo) is None
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text('{"model_type": "clip", "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert scan._read_json(deep / "config.json") is None
    assert text._hf_config(deep) is None and text._hf_config(tmp_path) is None


# ------------------------------------------------------------------- attacked again: the answers store (round two)

def test_remembering_into_an_unreadable_store_leaves_it_as_it_is(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A store the user may still want (a typo in a hand edit, a JSON list) is never overwritten: `remember` says
    why it cannot, naming it; the window's `write_all` leaves it too."""
    from vitviz.catalog import answers

    store = tmp_path / "answers.json"
    monkeypatch.setenv("VITVIZ_ANSWERS", str(store))
    for text in ('{"/m": {"heads": 4}, oops', "[1, 2]"):
        store.write_text(text)
        with pytest.raises(answers.AnswersStoreError, match=f"{store}.*nothing remembered, the store is left"):
            answers.remember("/other", {"heads": 2})
        answers.write_all({"/other": {"heads": 2}})     # the window's write, after its read said the store
        assert store.read_text() == text
        with pytest.warns(answers.UnreadableStoreWarning):
            assert answers.forget("/m") == {} and store.read_text() == text


def test_remembering_at_once_loses_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads remember at once (as the window and a command line may): each read-change-write holds the
    store's lock, so none overwrites another's answer."""
    import threading
    import time

    from vitviz.catalog import answers

    monkeypatch.setenv("VITVIZ_ANSWERS", str(tmp_path / "answers.json"))
    real = answers._stored

    def slow_read():  # noqa: ANN202 - a slow disk: without the lock the others read the same old content meanwhile
        found = real()
        time.sleep(0.05)
        return found

    monkeypatch.setattr(answers, "_stored", slow_read)
    threads = [threading.Thread(target=answers.remember, args=(f"/m{i}", {"heads": 4})) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers.read_all()) == [f"/m{i}" for i in range(8)]
