"""Hostile and broken inputs: no hang, no memory blow-up, no code run, and a clear `VitvizError` for every bad file,
config and override (issue 13).

Every input is generated here (no binary fixtures). Each category of the issue has a test, and the cheap parity
formats (timm state dict as .pth, legacy .pth and .safetensors, a torchvision state dict, a Hugging Face folder, a
timm hub folder) are mutated wholesale -- truncated, bytes flipped, every config field given every wrong JSON
type -- asserting the same promise each time: a model, or a VitvizError that names the file. Hang cases run in a
subprocess with a timeout; memory cases in a subprocess whose peak RSS is read; payloads write marker files
that must never appear.
"""
from __future__ import annotations

import errno
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from _tiny import tiny_state_dict, write_tiny_checkpoint
from PIL import Image
from safetensors.torch import save_file

import vitviz
import vitviz.core.running.images
from vitviz.cli import main
from vitviz.errors import (CheckpointNotFoundError, CorruptCheckpointError, DeviceError, ImageError,
                           InconsistentCheckpointError, MetadataError, NoWeightsError, OverrideError,
                           UnsafeCheckpointError, VitvizError)

pytestmark = [pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning"),
              pytest.mark.filterwarnings("ignore:.*not a mapping of settings:UserWarning")]

REPO = Path(__file__).resolve().parents[1]
NET = "please report"   # the loader's last-resort message: no mutation here may need it


def refused(fn: Callable[[], Any], error: type[VitvizError] = VitvizError, *needles: str) -> str:
    """Run `fn`, expect `error` whose message holds every needle; return the message."""
    with pytest.raises(error) as caught:
        fn()
    text = str(caught.value)
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"
    assert NET not in text, text
    return text


def outcome(fn: Callable[[], Any], name: str) -> str:
    """'loaded', or the VitvizError's class; anything else fails, as does an error that does not name `name`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except VitvizError as e:
        assert name in str(e), f"the error does not name {name!r}: {e}"
        assert NET not in str(e), f"only the loader's safety net caught it: {e}"
        return type(e).__name__
    return "loaded"


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_script(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `script` in a fresh Python; a hang fails the test with what was printed so far."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                              timeout=timeout, env=subprocess_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout} s; last output: {(e.stdout or b'')[-500:]!r} {(e.stderr or b'')[-500:]!r}")


# ------------------------------------------------------------------------------------------ generated formats


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """One small checkpoint per cheap parity format: name -> (path, load() overrides it needs)."""
    root = tmp_path_factory.mktemp("formats")
    sd = tiny_state_dict()
    torch.save(sd, root / "timm.pth")
    torch.save(sd, root / "legacy.pth", _use_new_zipfile_serialization=False)
    save_file(sd, str(root / "timm.safetensors"))
    from torchvision.models import VisionTransformer

    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                           num_classes=5)
    torch.save(tv.state_dict(), root / "torchvision_vit.pth")
    from transformers import ViTConfig, ViTForImageClassification

    hf = ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                             intermediate_size=64, image_size=32, patch_size=8, num_labels=3))
    hf.save_pretrained(root / "hf")
    (root / "hf" / "preprocessor_config.json").write_text(json.dumps({
        "do_normalize": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "resample": 2, "size": {"height": 32, "width": 32}}))
    hub = root / "hub"
    hub.mkdir()
    save_file(sd, str(hub / "model.safetensors"))
    (hub / "config.json").write_text(json.dumps(HUB_CONFIG))
    return {"timm.pth": (root / "timm.pth", {"heads": 2}), "legacy.pth": (root / "legacy.pth", {"heads": 2}),
            "timm.safetensors": (root / "timm.safetensors", {"heads": 2}),
            "torchvision": (root / "torchvision_vit.pth", {"heads": 2}), "hf": (root / "hf", {}),
            "hub": (hub, {})}


HUB_CONFIG = {"architecture": "vit_tiny_patch8_32", "num_classes": 5,
              "model_args": {"num_heads": 2, "img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2},
              "pretrained_cfg": {"input_size": [3, 32, 32], "crop_pct": 0.9, "interpolation": "bicubic",
                                 "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "num_classes": 5}}
WRONG_VALUES = [None, "x", [1], {}, -1, 1e30]


def test_every_format_loads_as_generated(formats: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    for name, (path, kw) in formats.items():
        assert vitviz.load(path, **kw).spec.depth == 2, name


def _copy(path: Path, dest: Path) -> Path:
    if path.is_dir():
        shutil.copytree(path, dest)
    else:
        shutil.copy(path, dest)
    return dest


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


# ---------------------------------------------------------------------------------------------------- hangs

HANG_SCRIPT = """
import json, os, sys, time
root = sys.argv[1]
import vitviz
import vitviz.core.running.images
from vitviz.cli import main
from vitviz.core.running.images import load_image
results = {}
def case(name, fn):
    start = time.perf_counter()
    try:
        value = fn()
        results[name] = ["returned", repr(value)]
    except vitviz.VitvizError as e:
        results[name] = [type(e).__name__, str(e)]
    except BaseException as e:
        results[name] = ["NOT A VitvizError: " + type(e).__name__, str(e)]
    results[name].append(time.perf_counter() - start)
    print(name, flush=True)
j = lambda *parts: os.path.join(root, *parts)
model = vitviz.load(j("tiny.pth"), heads=2)
case("load_image", lambda: load_image(j("fifo.png")))
case("run", lambda: model.run(j("fifo.png")))
case("checkpoint", lambda: vitviz.load(j("fifo.pth")))
case("dev_zero", lambda: vitviz.load("/dev/zero"))
case("weights_in_folder", lambda: vitviz.load(j("fifo_weights")))
case("config_in_folder", lambda: vitviz.load(j("fifo_config")))
case("export_folder", lambda: main(["export", "--model", j("tiny.pth"), "--heads", "2", j("images"),
                                    "--out", j("out1"), "--quiet"]))
case("export_input", lambda: main(["export", "--model", j("tiny.pth"), "--heads", "2", j("fifo.png"),
                                   "--out", j("out2"), "--quiet"]))
case("info", lambda: main(["info", j("fifo.pth")]))
json.dump(results, open(j("results.json"), "w"))
"""


def test_fifos_and_devices_are_refused_before_opening(tmp_path: Path) -> None:
    """A FIFO named x.png / x.pth, /dev/zero, a FIFO among a folder's weights or configs or images: each refused as
    'not a regular file' at once (the subprocess would hang for good on any open())."""
    write_tiny_checkpoint(tmp_path / "tiny.pth")
    os.mkfifo(tmp_path / "fifo.png")
    os.mkfifo(tmp_path / "fifo.pth")
    (tmp_path / "fifo_weights").mkdir()
    os.mkfifo(tmp_path / "fifo_weights" / "model.safetensors")
    (tmp_path / "fifo_config").mkdir()
    write_tiny_checkpoint(tmp_path / "fifo_config" / "model.safetensors")
    os.mkfifo(tmp_path / "fifo_config" / "config.json")
    (tmp_path / "images").mkdir()
    Image.new("RGB", (40, 40), "red").save(tmp_path / "images" / "a.png")
    os.mkfifo(tmp_path / "images" / "b.png")
    proc = run_script(HANG_SCRIPT, str(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for name in ("load_image", "run", "checkpoint", "weights_in_folder", "config_in_folder"):
        kind, message, seconds = results[name]
        assert kind in ("ImageError", "CorruptCheckpointError"), (name, kind, message)
        assert "a named pipe (FIFO), not a regular file" in message and "fifo" in message, (name, message)
        assert seconds < 2, (name, seconds)
    assert results["dev_zero"][0] == "CorruptCheckpointError"
    assert "a character device, not a regular file" in results["dev_zero"][1]
    assert "empty" not in results["dev_zero"][1]
    assert "config.json" in results["config_in_folder"][1]
    assert results["export_folder"][:2] == ["returned", "1"]     # a.png done, b.png failed: exit 1
    assert json.loads((tmp_path / "out1" / "manifest.json").read_text())["summary"]["done"] == 1
    assert results["export_input"][:2] == ["returned", "2"] and results["info"][:2] == ["returned", "2"]
    assert "named pipe" in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------------------- memory

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


# ------------------------------------------------------------------------------ not a VitvizError, before


def _hf_with(formats: dict[str, tuple[Path, dict[str, Any]]], dest: Path, **fields: Any) -> Path:
    folder = _copy(formats["hf"][0], dest)
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _hub_with(dest: Path, config: Any) -> Path:
    dest.mkdir()
    save_file(tiny_state_dict(), str(dest / "model.safetensors"))
    (dest / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return dest


@pytest.mark.parametrize("field,value,needle", [
    ("num_attention_heads", "four", "'num_attention_heads' is 'four' (a string); expected a positive whole number"),
    ("num_attention_heads", [4], "'num_attention_heads' is [4] (a list)"),
    ("num_attention_heads", None, "'num_attention_heads' is null"),
    ("layer_norm_eps", "tiny", "'layer_norm_eps' is 'tiny' (a string); expected a finite number in (0, 1]"),
    ("image_size", {}, "'image_size' is {} (an object)"),
    ("id2label", {"a": "x", "b": "y", "c": "z"}, "'id2label'"),
    ("hidden_act", "no_such_act", "'hidden_act' is 'no_such_act'"),
])
def test_hf_config_fields_of_the_wrong_type(formats: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path,
                                            field: str, value: Any, needle: str) -> None:
    folder = _hf_with(formats, tmp_path / "hf", **{field: value})
    refused(lambda: vitviz.load(folder), MetadataError, str(folder / "config.json"), needle)


@pytest.mark.parametrize("field,value,check", [
    ("hidden_act", "relu", lambda s: s.mlp_kind == "relu"), ("hidden_act", "silu", lambda s: s.mlp_kind == "silu"),
    ("image_size", "32", lambda s: s.image_size == (32, 32)), ("image_size", 32.0, lambda s: s.image_size == (32, 32)),
])
def test_hf_config_values_that_are_valid_load(formats: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path,
                                              field: str, value: Any, check: Callable[[Any], bool]) -> None:
    """relu and silu are activations the reference ViT has; '32' and 32.0 are 32 (never ('3', '2'))."""
    assert check(vitviz.load(_hf_with(formats, tmp_path / "hf", **{field: value})).spec)


@pytest.mark.parametrize("config,needle", [
    ([1, 2], "holds [1, 2] (a list); expected a JSON object"),
    ({**HUB_CONFIG, "model_args": [1]}, "'model_args' is [1] (a list); expected a JSON object"),
    ({**HUB_CONFIG, "pretrained_cfg": "x"}, "'pretrained_cfg' is 'x' (a string)"),
    ({**HUB_CONFIG, "model_args": {**HUB_CONFIG["model_args"], "num_heads": "four"}}, "'model_args.num_heads'"),
    ({**HUB_CONFIG, "model_args": {**HUB_CONFIG["model_args"], "img_size": {}}}, "'model_args.img_size' is {}"),
    ({**HUB_CONFIG, "pretrained_cfg": {**HUB_CONFIG["pretrained_cfg"], "crop_pct": 0}},
     "'pretrained_cfg.crop_pct' is 0 (a number); expected a finite number in (0, 1]"),
    ({**HUB_CONFIG, "pretrained_cfg": {**HUB_CONFIG["pretrained_cfg"], "crop_pct": "x"}}, "'pretrained_cfg.crop_pct'"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_timm_hub_config_of_the_wrong_type(tmp_path: Path, config: Any, needle: str) -> None:
    folder = _hub_with(tmp_path / "hub", config)
    refused(lambda: vitviz.load(folder), CorruptCheckpointError, str(folder / "config.json"), needle)


@pytest.mark.parametrize("value,size", [("32", (32, 32)), (32.0, (32, 32)), ([32, 32], (32, 32))])
def test_timm_hub_sizes_as_strings_and_floats_are_numbers(tmp_path: Path, value: Any, size: tuple[int, int]) -> None:
    config = {**HUB_CONFIG, "model_args": {**HUB_CONFIG["model_args"], "img_size": value}}
    assert vitviz.load(_hub_with(tmp_path / "hub", config)).spec.image_size == size


def test_every_config_field_with_every_wrong_type(formats: dict[str, tuple[Path, dict[str, Any]]],
                                                  tmp_path: Path) -> None:
    """Every field of the HF config.json and preprocessor_config.json and of the timm hub config (model_args,
    pretrained_cfg) set to null, a string, a list, an object, -1 and 1e30: a model or a VitvizError naming the
    folder, each time."""
    hf = formats["hf"][0]
    cases: list[tuple[str, str, Any]] = []
    for file in ("config.json", "preprocessor_config.json"):
        for key in json.loads((hf / file).read_text()):
            cases += [(file, key, v) for v in WRONG_VALUES]
    hub_keys = [("model_args", k) for k in HUB_CONFIG["model_args"]] + \
        [("pretrained_cfg", k) for k in HUB_CONFIG["pretrained_cfg"]] + [("", k) for k in HUB_CONFIG]
    loaded, refusals = 0, 0
    for i, (file, key, value) in enumerate(cases):
        folder = _copy(hf, tmp_path / f"hf{i}")
        data = json.loads((folder / file).read_text())
        data[key] = value
        (folder / file).write_text(json.dumps(data))
        result = outcome(lambda: vitviz.load(folder), str(folder))
        loaded, refusals = loaded + (result == "loaded"), refusals + (result != "loaded")
    for i, (section, key) in enumerate(hub_keys):
        for value in WRONG_VALUES:
            config = json.loads(json.dumps(HUB_CONFIG))
            (config[section] if section else config)[key] = value
            folder = _hub_with(tmp_path / f"hub{i}_{WRONG_VALUES.index(value)}", config)
            result = outcome(lambda: vitviz.load(folder), str(folder))
            loaded, refusals = loaded + (result == "loaded"), refusals + (result != "loaded")
    assert refusals > 100 and loaded > 10, (loaded, refusals)


@pytest.mark.parametrize("index,needle", [
    ([1], "shard index holds [1] (a list)"), ({"weight_map": []}, "weight_map [] (a list)"),
    ({"weight_map": {"a": 5}}, "weight_map value 5 (a number)"),
    ({"weight_map": {"a": "../../etc/passwd"}}, "shard '../../etc/passwd' lies outside the model folder"),
    ({"weight_map": {"a": "/etc/passwd"}}, "shard '/etc/passwd' lies outside the model folder"),
    ({"weight_map": {"a": "link.safetensors"}}, "shard 'link.safetensors' lies outside the model folder"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_shard_index_of_the_wrong_type_or_outside_the_folder(tmp_path: Path, index: Any, needle: str) -> None:
    """Shards are confined to the model folder: '..', absolute names and symbolic links out of it are refused
    before anything is read."""
    folder = tmp_path / "sharded"
    folder.mkdir()
    outside = write_tiny_checkpoint(tmp_path / "outside.safetensors")
    (folder / "link.safetensors").symlink_to(outside)
    (folder / "model.safetensors.index.json").write_text(index if isinstance(index, str) else json.dumps(index))
    refused(lambda: vitviz.load(folder, heads=2), CorruptCheckpointError, "model.safetensors.index.json", needle)


def test_shards_inside_the_folder_load(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    sd = tiny_state_dict()
    names = sorted(sd)
    save_file({k: sd[k] for k in names[:10]}, str(folder / "a.safetensors"))
    save_file({k: sd[k] for k in names[10:]}, str(folder / "b.safetensors"))
    index = {"weight_map": {k: "a.safetensors" if i < 10 else "b.safetensors" for i, k in enumerate(names)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert vitviz.load(folder, heads=2).spec.depth == 2


@pytest.mark.parametrize("args", [[1, 2], "hello", torch.zeros(3), 7, None])
def test_training_args_of_any_type(tmp_path: Path, args: Any) -> None:
    """`args` that is a list, a string, a tensor or a number is not a mapping of settings: ignored (with a warning
    naming the file), never `.get()` on a list."""
    path = tmp_path / "run.pth"
    torch.save({"model": tiny_state_dict(), "args": args, "arch": "vit_tiny"}, path)
    assert vitviz.load(path, heads=2).spec.depth == 2


@pytest.mark.parametrize("args", [{"input_size": ["a"]}, {"img_size": -5}, {"patch_size": "x"}, {"model": 5},
                                  {"img_size": {}}])
def test_training_args_with_wrong_field_types(tmp_path: Path, args: dict[str, Any]) -> None:
    path = tmp_path / "run.pth"
    torch.save({"model": tiny_state_dict(), "args": args}, path)
    assert vitviz.load(path, heads=2).spec.image_size == (32, 32)


@pytest.mark.parametrize("key,value,needle", [
    ("reg_token", torch.zeros(32), "reg_token has shape (32,); expected 3 dimensions (1, tokens, embed_dim)"),
    ("cls_token", torch.zeros(2, 1, 32), "cls_token has shape (2, 1, 32)"),
    ("blocks.0.attn.qkv.weight", torch.zeros(96), "blocks.0.attn.qkv.weight has shape (96,)"),
    ("head.weight", torch.zeros(5, 32, 1), "head.weight has shape (5, 32, 1)"),
])
def test_tensors_of_the_wrong_rank(tmp_path: Path, key: str, value: torch.Tensor, needle: str) -> None:
    torch.save({**tiny_state_dict(reg_tokens=1 if key == "reg_token" else 0), key: value}, tmp_path / "r.pth")
    refused(lambda: vitviz.load(tmp_path / "r.pth", heads=2), InconsistentCheckpointError, "r.pth", needle)


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


# --------------------------------------------------------------------------------------------------- overrides


@pytest.mark.parametrize("override,needle", [
    ({"heads": "four"}, "override heads 'four'; expected a positive whole number (found a string)"),
    ({"heads": 2.5}, "override heads 2.5; expected a positive whole number (found a number)"),
    ({"heads": 0}, "override heads 0;"), ({"heads": True}, "override heads True; expected a positive whole number (found a boolean)"),
    ({"mean": "abc"}, "override mean 'abc'; expected 1 or 3 finite numbers"),
    ({"std": [0, 0, 0]}, "expected values > 0"), ({"std": [1, 2]}, "expected 1 or 3 finite numbers"),
    ({"family": 3}, "override family 3; expected a string (found a number)"),
    ({"family": "nonesuch"}, "expected one of"),
    ({"act": "swish!"}, "override act 'swish!'; expected one of"), ({"eps": "x"}, "override eps 'x'"),
    ({"eps": -1}, "override eps -1; expected a finite number in (0, 1]"),
    ({"eps": float("nan")}, "override eps nan"),
    ({"labels": 5}, "override labels 5; expected a list of class names"),
    ({"image_size": 0}, "override image_size 0;"), ({"image_size": "abc"}, "override image_size 'abc'"),
    ({"image_size": [1, 2, 3]}, "override image_size [1, 2, 3]"), ({"resize": -3}, "override resize -3"),
    ({"interpolation": "cubic"}, "override interpolation 'cubic'"), ({"pooling": 1}, "override pooling 1"),
    ({"attn_scale": -1}, "override attn_scale -1"), ({"nest_key": 3}, "override nest_key 3"),
    ({"device": 3}, "override device 3"), ({"pos_interp": "x"}, "override pos_interp 'x'"),
])
def test_bad_overrides_are_refused(tmp_path: Path, override: dict[str, Any], needle: str) -> None:
    path = write_tiny_checkpoint(tmp_path / "m.pth")
    refused(lambda: vitviz.load(path, **{"heads": 2, **override}), OverrideError, needle)


@pytest.mark.parametrize("override,check", [
    ({"image_size": "64"}, lambda s: s.image_size == (64, 64)),
    ({"image_size": "40x48"}, lambda s: s.image_size == (40, 48)),
    ({"heads": "2"}, lambda s: s.num_heads == 2), ({"heads": 2.0}, lambda s: s.num_heads == 2),
    ({"std": 5}, lambda s: s.preprocess.std == (5.0,)), ({"act": "relu"}, lambda s: s.mlp_kind == "relu"),
    ({"act": "silu"}, lambda s: s.mlp_kind == "silu"), ({"labels": {"0": "a", "1": "b", "2": "c", "3": "d", "4": "e"}},
                                                      lambda s: s.labels == ("a", "b", "c", "d", "e")),
])
def test_valid_overrides_mean_what_they_say(tmp_path: Path, override: dict[str, Any],
                                            check: Callable[[Any], bool]) -> None:
    path = write_tiny_checkpoint(tmp_path / "m.pth")
    assert check(vitviz.load(path, **{"heads": 2, **override}).spec)


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


def test_cli_overrides_are_validated_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_tiny_checkpoint(tmp_path / "m.pth")
    assert main(["info", str(path), "--heads", "0"]) == 2
    assert "override heads 0; expected a positive whole number" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ wrong blame


@pytest.mark.parametrize("section,field,value,needle", [
    ("pretrained_cfg", "std", [0, 0, 0], "'pretrained_cfg.std' is [0, 0, 0] (a list); expected values > 0"),
    ("pretrained_cfg", "mean", [0.5, 0.5], "'pretrained_cfg.mean' is [0.5, 0.5] (a list); expected 1 or 3"),
    ("pretrained_cfg", "crop_pct", -1, "'pretrained_cfg.crop_pct' is -1"),
    ("model_args", "img_size", -64, "'model_args.img_size' is -64 (a number); expected a positive whole number"),
    ("pretrained_cfg", "interpolation", "fancy", "'pretrained_cfg.interpolation' is 'fancy'"),
])
def test_bad_preprocessing_metadata_fails_at_load_naming_the_field(tmp_path: Path, section: str, field: str,
                                                                    value: Any, needle: str) -> None:
    """Bad preprocessing metadata fails at load, naming the config file and field -- not at every image."""
    config = json.loads(json.dumps(HUB_CONFIG))
    config[section][field] = value
    folder = _hub_with(tmp_path / "hub", config)
    refused(lambda: vitviz.load(folder), MetadataError, str(folder / "config.json"), needle)


def test_bad_preprocessor_config_fails_at_load(formats: dict[str, tuple[Path, dict[str, Any]]],
                                               tmp_path: Path) -> None:
    folder = _copy(formats["hf"][0], tmp_path / "hf")
    pp = json.loads((folder / "preprocessor_config.json").read_text())
    for field, value, needle in (("image_std", [0, 0, 0], "expected values > 0"),
                                 ("size", [32], "expected a positive whole number"),
                                 ("resample", 9, "expected a PIL resampling code 0-5")):
        (folder / "preprocessor_config.json").write_text(json.dumps({**pp, field: value}))
        refused(lambda: vitviz.load(folder), MetadataError, "preprocessor_config.json", f"'{field}'", needle)


def test_valid_preprocessor_variants_load(formats: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path) -> None:
    """What transformers' processors write in their many forms is accepted: int sizes, shortest/longest edge,
    crop sizes, a rescale factor."""
    folder = _copy(formats["hf"][0], tmp_path / "hf")
    pp = json.loads((folder / "preprocessor_config.json").read_text())
    for extra in ({"size": 32}, {"size": {"longest_edge": 64}}, {"size": {"shortest_edge": 36}, "crop_size": 32,
                                                                  "do_center_crop": True},
                  {"rescale_factor": 1 / 255, "resample": 3, "do_convert_rgb": True}):
        (folder / "preprocessor_config.json").write_text(json.dumps({**pp, **extra}))
        assert vitviz.load(folder).spec.depth == 2, extra


def test_bad_statistics_in_training_args_fail_at_load(tmp_path: Path) -> None:
    """std 0 in args.json beside the weights: refused at load naming where it came from."""
    path = write_tiny_checkpoint(tmp_path / "m.pth")
    (tmp_path / "args.json").write_text(json.dumps({"mean": 0.5, "std": 0}))
    refused(lambda: vitviz.load(path, heads=2), MetadataError, "m.pth", "std (0.0,)", "args.json")


# ------------------------------------------------------------------------------------------------------ silent


@pytest.mark.parametrize("poison", ["nan", "inf", "one"])
def test_non_finite_weights_are_refused_naming_the_tensors(tmp_path: Path, poison: str) -> None:
    sd = tiny_state_dict()
    if poison == "one":
        sd["blocks.1.mlp.fc1.weight"][3, 4] = float("nan")
    else:
        sd = {k: torch.full_like(v, float(poison)) for k, v in sd.items()}
    torch.save(sd, tmp_path / "n.pth")
    text = refused(lambda: vitviz.load(tmp_path / "n.pth", heads=2), InconsistentCheckpointError, "n.pth",
                   "NaN or infinite weights in", "expected finite weights")
    assert ("blocks.1.mlp.fc1.weight (1 of 2048 values)" in text) if poison == "one" else \
        "patch_embed.proj.weight (6144 of 6144 values)" in text


def test_non_finite_head_only_is_a_warning(tmp_path: Path) -> None:
    sd = tiny_state_dict()
    sd["head.weight"][0, 0] = float("inf")
    torch.save(sd, tmp_path / "h.pth")
    with pytest.warns(UserWarning, match=r"h.pth: NaN or infinite weights in head.weight \(1 of 160 values\); "
                                         "the attention maps are unaffected"):
        vm = vitviz.load(tmp_path / "h.pth", heads=2)
    assert np.isfinite(vm.run(np.zeros((32, 32, 3), np.uint8)).attentions).all()


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bool, torch.int8, torch.int64])
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_non_float_weights_are_refused(tmp_path: Path, dtype: torch.dtype, suffix: str) -> None:
    if suffix == ".safetensors" and dtype == torch.complex64:
        pytest.skip("safetensors has no complex dtype")
    sd = {k: v.to(dtype) for k, v in tiny_state_dict().items()}
    path = tmp_path / f"w{suffix}"
    torch.save(sd, path) if suffix == ".pth" else save_file(sd, str(path))
    name = str(dtype).replace("torch.", "")
    refused(lambda: vitviz.load(path, heads=2), InconsistentCheckpointError, path.name,
            "not floating point", f".weight ({name})")


# ---------------------------------------------------------------------------------------------------- messages


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


def test_paths_are_described_for_what_they_are(tmp_path: Path) -> None:
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    refused(lambda: vitviz.load(tmp_path / "loop_a"), CheckpointNotFoundError, "loop_a", "a symbolic link loop")
    (tmp_path / "dangling.pth").symlink_to(tmp_path / "gone.pth")
    refused(lambda: vitviz.load(tmp_path / "dangling.pth"), CheckpointNotFoundError, "a broken symbolic link")
    refused(lambda: vitviz.load(tmp_path / "nothing.pth"), CheckpointNotFoundError, "not found")
    refused(lambda: vitviz.load("/dev/zero"), CorruptCheckpointError, "/dev/zero: a character device")
    refused(lambda: vitviz.core.running.images.load_image("/dev/zero"), ImageError, "a character device")
    refused(lambda: vitviz.core.running.images.load_image(tmp_path / "loop_a"), ImageError, "a symbolic link loop")


def test_a_folder_of_3000_weights_files_lists_a_few(tmp_path: Path) -> None:
    for i in range(3000):
        (tmp_path / f"m{i:04d}.pth").touch()
    text = refused(lambda: vitviz.load(tmp_path), NoWeightsError, "3000 weights files",
                   "m0000.pth, m0001.pth", "and 2992 more")
    assert len(text) < 400


# ------------------------------------------------------------------------------------------------------ export


@pytest.fixture
def export_inputs(tmp_path: Path) -> tuple[Path, Path]:
    model = write_tiny_checkpoint(tmp_path / "tiny.pth")
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(4):
        Image.new("RGB", (40, 40), (60 * i, 0, 0)).save(folder / f"img{i}.png")
    return model, folder


@pytest.mark.parametrize("manifest_fails", [False, True])
def test_export_on_a_full_disk(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               export_inputs: tuple[Path, Path], manifest_fails: bool) -> None:
    """ENOSPC: the run stops once, says the disk is full naming the output folder (not an input), exit 2, no
    traceback -- also when manifest.json cannot be written; the manifest, when written, records what is on disk."""
    from vitviz.core import files
    real = files._atomic_write
    writes = [0]

    def full_after_three(path: Any, write: Any, overwrite: bool) -> Path:
        writes[0] += 1
        if writes[0] > 3 and (manifest_fails or not str(path).endswith("manifest.json")):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, overwrite)

    monkeypatch.setattr(files, "_atomic_write", full_after_three)
    model, folder = export_inputs
    out = tmp_path / "out"
    rc = main(["export", "--model", str(model), "--heads", "2", str(folder), "--out", str(out), "--layers", "all",
               "--batch-size", "1", "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"vitviz: error: {out}" in err and "the disk is full" in err, err
    assert "vitviz: skipped" not in err and "Traceback" not in err and "img0.png: " not in err
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 3
    if manifest_fails:
        assert "manifest.json could not be written" in err and not (out / "manifest.json").exists()
        return
    manifest = json.loads((out / "manifest.json").read_text())
    listed = sorted(Path(o).name for image in manifest["images"] for o in image["outputs"])
    assert listed == pngs and manifest["summary"]["files"] == 3 and manifest["summary"]["interrupted"]
    for image in manifest["images"]:
        assert image["status"] != "done" or all((out / o).exists() for o in image["outputs"])


SLOW_EXPORT = """
import sys, time
from vitviz.core import files
real = files.write_png_atomic
def slow(*args, **kwargs):
    time.sleep(0.05)
    return real(*args, **kwargs)
files.write_png_atomic = slow
from vitviz.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_stops_an_export_promptly_and_records_what_was_written(tmp_path: Path) -> None:
    """SIGTERM mid-export: exit 130 within 10 s; the summary counts the files on disk and the manifest lists each
    of them, images whose files are all there as done."""
    model = write_tiny_checkpoint(tmp_path / "tiny.pth")
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(80):
        Image.new("RGB", (40, 40), (i, 0, 0)).save(folder / f"img{i:02d}.png")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, "export", "--model", str(model), "--heads", "2",
                             str(folder), "--out", str(out), "--layers", "all", "--which-heads", "all"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("*.png"))) < 10:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _stdout, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("SIGTERM did not stop the export within 30 s")
    took = time.monotonic() - sent
    assert proc.returncode == 130 and took < 10, (proc.returncode, took, stderr[-1000:])
    assert "Traceback" not in stderr and "vitviz export interrupted" in stderr
    pngs = {p.name for p in out.glob("*.png")}
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {Path(o).name for image in manifest["images"] for o in image["outputs"]}
    assert listed == pngs and manifest["summary"]["files"] == len(pngs) and manifest["summary"]["interrupted"]
    done = [image for image in manifest["images"] if image["status"] == "done"]
    assert done and all(len(image["outputs"]) == 4 for image in done)   # 2 layers x 2 heads
    assert f"{manifest['summary']['done']} done" in stderr and f"{len(pngs)} files written" in stderr
    assert not list(out.glob(".*.tmp"))    # no half-written file left behind


def test_peak_memory_of_this_process_is_reported() -> None:
    """(Sanity: ru_maxrss is in KiB on Linux, which the memory test relies on.)"""
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 > 50 << 20
