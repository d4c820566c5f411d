"""Reading checkpoints (`vitviz.core.reading.checkpoint`) from hostile and broken files: no hang, no memory
blow-up, no code run, and a clear `VitvizError` naming the file (issue 13).

Every input is generated here (no binary fixtures): the cheap parity formats (timm state dict as .pth, legacy .pth
and .safetensors, a torchvision state dict, a Hugging Face folder, a timm hub folder) truncated and bytes flipped,
asserting each time: a model, or a VitvizError that names the file. Memory cases run in a subprocess whose peak RSS
is read; payloads write marker files that must never appear."""
from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from _hostile import HUB_CONFIG, _copy, _hub_with, outcome, refused, run_script
from _tiny import tiny_state_dict, write_tiny_checkpoint
from PIL import Image
from safetensors.torch import save_file

import vitviz
import vitviz.core.running.images
from vitviz.errors import CorruptCheckpointError, NoWeightsError, UnsafeCheckpointError

pytestmark = [pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning"),
              pytest.mark.filterwarnings("ignore:.*not a mapping of settings:UserWarning")]


def test_every_format_loads_as_generated(formats: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    for name, (path, kw) in formats.items():
        assert vitviz.load(path, **kw).spec.depth == 2, name


def _weights(path: Path) -> Path:
    return next(p for p in sorted(path.iterdir()) if p.suffix in (".safetensors", ".bin", ".pth")) \
        if path.is_dir() else path


@pytest.mark.parametrize("fmt", ["timm.pth", "legacy.pth", "timm.safetensors", "torchvision", "hf", "hub"])
def test_truncated_and_flipped_files_of_every_format(fmt: str, formats: dict[str, tuple[Path, dict[str, Any]]],
                                                     tmp_path: Path) -> None:
    """Truncations and single-byte flips of each format load or fail with a VitvizError naming the file -- never
    an IndexError, a UnicodeDecodeError or a hang -- and a damaged pickle is corrupt, not unsafe."""
    source, kw = formats[fmt]
    data = _weights(source).read_bytes()
    rng = random.Random(fmt)
    cuts = sorted({1, 8, 9, 64, 200, len(data) // 3, len(data) // 2, len(data) - 1})
    flips = [rng.randrange(min(len(data), 4096)) for _ in range(10)] + [rng.randrange(len(data)) for _ in range(6)]
    seen: dict[str, int] = {}
    for i, mutation in enumerate([("cut", c) for c in cuts] + [("flip", f) for f in flips]):
        copy = _copy(source, tmp_path / f"m{i}{source.suffix}")
        target = _weights(copy)
        kind, at = mutation
        target.write_bytes(data[:at] if kind == "cut" else data[:at] + bytes([data[at] ^ 0xA5]) + data[at + 1:])
        start = time.perf_counter()
        result = outcome(lambda: vitviz.load(copy, **kw), copy.name)
        assert time.perf_counter() - start < 10, (fmt, mutation)
        assert not (kind == "cut" and result == "loaded"), (fmt, mutation)
        assert result != "UnsafeCheckpointError", (fmt, mutation)  # damage is never called an attack
        seen[result] = seen.get(result, 0) + 1
    assert "CorruptCheckpointError" in seen or "MetadataError" in seen, seen


MEMORY_SCRIPT = """
import json, os, resource, sys, time
root = sys.argv[1]
import numpy as np
import vitviz
import vitviz.core.running.images
from vitviz.cli import main
j = lambda *parts: os.path.join(root, *parts)
model = vitviz.load(j("tiny.pth"), heads=2)
model.run(np.zeros((40, 40, 3), np.uint8))
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
results = {"baseline": peak()}
def case(name, fn):
    start = time.perf_counter()
    try:
        value = fn()
        results[name] = ["returned", repr(value)[:200]]
    except vitviz.VitvizError as e:
        results[name] = [type(e).__name__, str(e)]
    except BaseException as e:
        results[name] = ["NOT A VitvizError: " + type(e).__name__, str(e)]
    results[name] += [time.perf_counter() - start, peak()]
    print(name, flush=True)
case("expand", lambda: vitviz.load(j("expand.pth"), heads=2))
case("overlapping", lambda: vitviz.load(j("overlap.pth"), heads=2))
case("zip_bomb", lambda: vitviz.load(j("bomb.pth"), heads=2))
case("shared_metadata", lambda: vitviz.load(j("shared_meta.pth"), heads=2).spec.depth)
case("deep_model", lambda: vitviz.load(j("deep.pth"), heads=2))
case("image_size", lambda: vitviz.load(j("tiny.pth"), heads=2, image_size=100000))
case("run_image_size", lambda: model.run(np.zeros((40, 40, 3), np.uint8), image_size=(100000, 100000)))
case("cli", lambda: main(["export", "--model", j("tiny.pth"), "--heads", "2", "--image-size", "100000",
                          j("a.png"), "--out", j("out"), "--quiet"]))
json.dump(results, open(j("results.json"), "w"))
"""


def _zip_bomb(good: Path, bomb: Path, inflated: int) -> None:
    """`good` with its data.pkl padded to `inflated` bytes of zeros, deflated (written in chunks: ~1 MB a GiB)."""
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bomb, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if not info.filename.endswith("data.pkl"):
                zout.writestr(info, data)
                continue
            entry = zipfile.ZipInfo(info.filename)
            entry.compress_type = zipfile.ZIP_DEFLATED
            with zout.open(entry, "w", force_zip64=True) as out:
                out.write(data)
                chunk = bytes(16 << 20)
                for _ in range(inflated // len(chunk)):
                    out.write(chunk)


def test_memory_stays_bounded(tmp_path: Path) -> None:
    """Small files that would take gigabytes -- a broadcast (expand) or overlapping (as_strided) tensor, a zip bomb
    declaring 1 GiB, metadata sharing one list a billion times, 1100 blocks, image_size=100000 in load, run and the
    CLI -- are refused fast and the subprocess's peak RSS grows by less than 300 MB."""
    sd = tiny_state_dict()
    torch.save(sd, tmp_path / "tiny.pth")
    torch.save({**sd, "head.weight": torch.zeros(1).expand(20_000_000, 32),
                "head.bias": torch.zeros(1).expand(20_000_000)}, tmp_path / "expand.pth")
    torch.save({**sd, "head.weight": torch.zeros(2_000_040).as_strided((2_000_000, 32), (1, 1))},
               tmp_path / "overlap.pth")
    _zip_bomb(tmp_path / "tiny.pth", tmp_path / "bomb.pth", 1 << 30)
    shared: Any = [0] * 1000
    for _ in range(3):
        shared = [shared] * 1000
    torch.save({"model": sd, "args": {"notes": shared}}, tmp_path / "shared_meta.pth")
    torch.save({**sd, **{f"blocks.{i}.norm1.weight": torch.ones(32) for i in range(2, 1100)}}, tmp_path / "deep.pth")
    Image.new("RGB", (40, 40), "red").save(tmp_path / "a.png")
    assert (tmp_path / "bomb.pth").stat().st_size < 3 << 20 and (tmp_path / "expand.pth").stat().st_size < 1 << 20
    proc = run_script(MEMORY_SCRIPT, str(tmp_path), timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    baseline = results.pop("baseline")
    expected = {"expand": ("CorruptCheckpointError", "broadcast view"),
                "overlapping": ("CorruptCheckpointError", "head.weight"),
                "zip_bomb": ("CorruptCheckpointError", "zip bomb"),
                "deep_model": ("InconsistentCheckpointError", "1100 transformer blocks; expected at most"),
                "image_size": ("DeviceError", "image_size 100000x100000"),
                "run_image_size": ("ImageError", "resizing its 40x40 px to 109375x109375 px"),   # > 200 MP
                "shared_metadata": ("returned", "2"), "cli": ("returned", "2")}
    for name, (kind, needle) in expected.items():
        got, message, seconds, rss = results[name]
        assert got == kind and needle in message, (name, got, message)
        assert seconds < 10, (name, seconds)
    peak = max(r[3] for r in results.values())
    assert peak - baseline < 300 << 20, f"peak RSS grew by {(peak - baseline) >> 20} MB"
    assert "image_size 100000x100000" in proc.stderr and "Traceback" not in proc.stderr


def test_storage_smaller_than_its_tensor_is_named(tmp_path: Path) -> None:
    torch.save({**tiny_state_dict(), "pos_embed": torch.zeros(1, 1, 1).expand(1, 400_000, 32)}, tmp_path / "e.pth")
    refused(lambda: vitviz.load(tmp_path / "e.pth", heads=2), CorruptCheckpointError,
            "e.pth", "'pos_embed' (1, 400000, 32)", "48.8 MiB", "4 bytes", "expected a tensor with its own data")


@pytest.mark.parametrize("make,needle", [
    (lambda t: t.to("meta"), "meta tensor"), (lambda t: t.to_sparse(), "sparse"),
    (lambda t: torch.quantize_per_tensor(t, 0.1, 0, torch.qint8), "quantized")])
def test_meta_sparse_and_quantized_tensors(tmp_path: Path, make: Callable[[torch.Tensor], torch.Tensor],
                                           needle: str) -> None:
    sd = tiny_state_dict()
    torch.save({**sd, "head.weight": make(sd["head.weight"])}, tmp_path / "q.pth")
    refused(lambda: vitviz.load(tmp_path / "q.pth", heads=2), CorruptCheckpointError, "q.pth", "'head.weight'", needle)


def test_truncated_legacy_file_at_every_early_offset(tmp_path: Path) -> None:
    """The legacy stream's first pickles (magic number, protocol, system info) cut anywhere: corrupt, named,
    never an IndexError from an empty message."""
    full = tmp_path / "legacy.pth"
    torch.save(tiny_state_dict(), full, _use_new_zipfile_serialization=False)
    data = full.read_bytes()
    for cut in list(range(1, 300, 7)) + [len(data) // 2, len(data) - 3]:
        path = tmp_path / f"cut{cut}.pth"
        path.write_bytes(data[:cut])
        refused(lambda: vitviz.load(path, heads=2), CorruptCheckpointError, f"cut{cut}.pth",
                "could not be read as a PyTorch checkpoint")


def test_zip_entry_flagged_utf8_that_is_not(tmp_path: Path) -> None:
    good = write_tiny_checkpoint(tmp_path / "good.pth")
    bad = tmp_path / "bad.pth"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            name = info.filename.replace("/data.pkl", "/é.pkl") if info.filename.endswith("data.pkl") else info.filename
            zout.writestr(name, zin.read(info.filename))  # a non-ASCII name: zipfile sets the UTF-8 flag
    bad.write_bytes(bad.read_bytes().replace("é".encode(), b"\xff\xfe"))
    refused(lambda: vitviz.load(bad, heads=2), CorruptCheckpointError, "bad.pth", "not valid UTF-8")


def test_deeply_nested_files(tmp_path: Path) -> None:
    """100 000-deep JSON in a preprocessor config, a safetensors header and a text config beside the weights:
    named errors (or a skipped side-car with a warning), never a RecursionError."""
    deep = "[" * 100_000 + "]" * 100_000
    folder = _hub_with(tmp_path / "hub", HUB_CONFIG)
    (folder / "preprocessor_config.json").write_text(deep)
    refused(lambda: vitviz.load(folder), CorruptCheckpointError, "preprocessor_config.json", "nested too deeply")
    header = ('{"__metadata__": ' + deep + "}").encode()
    path = tmp_path / "deep.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    refused(lambda: vitviz.load(path), CorruptCheckpointError, "deep.safetensors", "nested too deeply")
    (tmp_path / "side").mkdir()
    weights = write_tiny_checkpoint(tmp_path / "side" / "model.pth")
    (tmp_path / "side" / "args.json").write_text(deep)
    with pytest.warns(UserWarning, match="args.json: skipped, nested too deeply"):
        assert vitviz.load(weights, heads=2).spec.depth == 2


def test_nest_key_is_honoured_for_safetensors(tmp_path: Path) -> None:
    """A flat file's nest_key picks the tensors under that prefix, and a prefix that is not there is refused
    (it was silently ignored)."""
    sd = tiny_state_dict()
    path = tmp_path / "two.safetensors"
    save_file({**{f"teacher.{k}": v for k, v in sd.items()},
               **{f"student.{k}": torch.zeros_like(v) for k, v in sd.items()}}, str(path))
    vm = vitviz.load(path, heads=2, nest_key="teacher")
    assert torch.equal(vm.net.blocks[0].attn.qkv.weight.detach(), sd["blocks.0.attn.qkv.weight"])
    refused(lambda: vitviz.load(path, heads=2, nest_key="ema"), CorruptCheckpointError,
            "two.safetensors", "nest_key='ema'", "student, teacher")


class Payload:
    """Pickles to a call of `func(*args)`: a malicious checkpoint's payload."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.func, self.args)


def _payloads(marker: Path) -> dict[str, Any]:
    return {"os.system": Payload(os.system, f"touch {marker}"),
            "subprocess.Popen": Payload(subprocess.Popen, ["touch", str(marker)]),
            "builtins.exec": Payload(exec, f"open({str(marker)!r}, 'w').close()"),
            "builtins.eval": Payload(eval, f"open({str(marker)!r}, 'w').close()")}


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("where", ["top", "args", "state_dict"])
def test_no_payload_runs_and_each_is_named(tmp_path: Path, legacy: bool, where: str) -> None:
    """Every payload, in the zip and the legacy format, at the top, inside training args or inside the state dict:
    refused naming what it would call; the marker file never appears."""
    marker = tmp_path / "pwned"
    expected = {"os.system": "posix.system", "subprocess.Popen": "subprocess.Popen", "builtins.exec": "builtins.exec",
                "builtins.eval": "builtins.eval"}
    for name, payload in _payloads(marker).items():
        sd = tiny_state_dict()
        obj: dict[str, Any] = {"model": sd, "x": payload} if where == "top" else \
            {"model": sd, "args": {"lr": 0.1, "hook": payload}} if where == "args" else {**sd, "extra": payload}
        path = tmp_path / f"{name}.pth"
        torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
        text = refused(lambda: vitviz.load(path, heads=2), UnsafeCheckpointError, path.name,
                       f"would call {expected[name] if name != 'os.system' or os.name != 'nt' else 'nt.system'}",
                       "never runs code")
        assert "whole pickled model object" not in text
        assert not marker.exists(), name


def test_whole_model_objects_and_numpy_are_told_apart(tmp_path: Path) -> None:
    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 2)), tmp_path / "m.pth")
    refused(lambda: vitviz.load(tmp_path / "m.pth"), UnsafeCheckpointError, "whole pickled model object",
            "torch.nn.modules.container.Sequential", "state_dict()")
    torch.save({"model": tiny_state_dict(), "best": np.float64(0.5)}, tmp_path / "np.pth")
    refused(lambda: vitviz.load(tmp_path / "np.pth"), UnsafeCheckpointError, "NumPy objects", "float(x)")


def test_corrupt_pickle_is_not_called_unsafe(tmp_path: Path) -> None:
    good = write_tiny_checkpoint(tmp_path / "good.pth")
    for i, damage in enumerate((lambda d: d[: len(d) // 2] + b"\xff\xfe" + d[len(d) // 2:],
                                lambda d: d.replace(b"_rebuild_tensor_v2", b"_rebuild_tensor_v3"),
                                lambda d: d[:-6] + b"\x00" * 6)):
        bad = tmp_path / f"bad{i}.pth"
        with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
            for info in zin.infolist():
                data = zin.read(info.filename)
                zout.writestr(info, damage(data) if info.filename.endswith("data.pkl") else data)
        refused(lambda: vitviz.load(bad, heads=2), CorruptCheckpointError, bad.name, "could not be read")


def test_a_folder_of_3000_weights_files_lists_a_few(tmp_path: Path) -> None:
    for i in range(3000):
        (tmp_path / f"m{i:04d}.pth").touch()
    text = refused(lambda: vitviz.load(tmp_path), NoWeightsError, "3000 weights files",
                   "m0000.pth, m0001.pth", "and 2992 more")
    assert len(text) < 400


def test_peak_memory_of_this_process_is_reported() -> None:
    """(Sanity: ru_maxrss is in KiB on Linux, which the memory test relies on.)"""
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 > 50 << 20
