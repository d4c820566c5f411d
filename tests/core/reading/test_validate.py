"""Checking what comes in at the door (`vitviz.core.reading.validate`): paths that are no regular files, config
fields of every wrong JSON type, shard names out of their folder, bad overrides (library and CLI), bad preprocessing
metadata and training args, tensors of the wrong rank, dtype or value -- each a clear `VitvizError` naming what was
wrong, never a traceback or a hang (issue 13). Hang cases run in a subprocess with a timeout."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from _hostile import HUB_CONFIG, _copy, _hub_with, outcome, quiet_load, refused, run_script
from _tiny import tiny_state_dict, write_tiny_checkpoint
from PIL import Image
from safetensors.torch import save_file

import vitviz
import vitviz.core.running.images
from vitviz.cli import main
from vitviz.errors import (CheckpointNotFoundError, CorruptCheckpointError, ImageError, InconsistentCheckpointError,
                           MetadataError, OverrideError)

pytestmark = [pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning"),
              pytest.mark.filterwarnings("ignore:.*not a mapping of settings:UserWarning")]


WRONG_VALUES = [None, "x", [1], {}, -1, 1e30]


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


def _hf_with(formats: dict[str, tuple[Path, dict[str, Any]]], dest: Path, **fields: Any) -> Path:
    folder = _copy(formats["hf"][0], dest)
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


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


def test_cli_overrides_are_validated_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_tiny_checkpoint(tmp_path / "m.pth")
    assert main(["info", str(path), "--heads", "0"]) == 2
    assert "override heads 0; expected a positive whole number" in capsys.readouterr().err


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


# ------------------------------------------------------------------------------------------------ silent NaN (issue 20)

@pytest.mark.parametrize("fill, needle", [(1e30, "values reach 1e+30"), (float("nan"), "holds NaN or infinity")])
def test_non_finite_attention_is_refused_naming_the_input(tiny_model, fill: float, needle: str) -> None:
    import torch

    with pytest.raises(vitviz.VitvizError) as info:
        tiny_model.run(torch.full((1, 3, 32, 32), fill))
    text = str(info.value)
    assert "NaN or infinite attention" in text and needle in text and "nothing was drawn or written" in text
    assert type(info.value).__name__ == "NonFiniteError"
    assert tiny_model.run(torch.zeros(1, 3, 32, 32)).attentions.shape[0] == 2   # the model still works


def test_non_finite_attention_names_a_bad_rope_setting(family_folders: dict[str, Path]) -> None:
    import dataclasses

    import numpy as np

    from vitviz.core.reading.validate import check_finite_forward
    from vitviz.errors import NonFiniteError

    spec = quiet_load(family_folders["dinov3"]).spec
    attn = np.full((1, 2, 4, 5, 5), np.nan, np.float32)
    for field, value, needle in (("rope_theta", -100.0, "RoPE base rope_theta -100.0"),
                                 ("rope_offset", float("inf"), "RoPE grid offset inf")):
        with pytest.raises(NonFiniteError, match=needle):
            check_finite_forward(attn, np.zeros((1, 3, 8, 8)), dataclasses.replace(spec, **{field: value}))
    with pytest.raises(NonFiniteError, match="no setting is out of range.*please report"):
        check_finite_forward(attn, np.zeros((1, 3, 8, 8)), spec)
    check_finite_forward(np.full((1, 2, 4, 5, 5), 0.2, np.float32), np.zeros((1, 3, 8, 8)), spec)


@pytest.mark.parametrize("option", [["--std", "1e-30"], ["--mean", "1e30"], ["--mean", "1e39"]])
def test_normalisation_that_overflows_is_refused_at_load(tiny_ckpt: Path, photo: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         option: list[str]) -> None:
    out = tmp_path / "out"
    assert main(["export", "--model", str(tiny_ckpt), "--heads", "2", str(photo), "--out", str(out), "--npz",
                     "--quiet", *option]) == 2
    err = capsys.readouterr().err
    assert "preprocessing" in err and "expected" in err and ("std" in err or "mean" in err)
    assert not out.exists() or not list(out.glob("*.np[yz]"))


def test_export_refuses_non_finite_maps(tiny_ckpt: Path, photo: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Past the load check (disabled here), the forward pass itself refuses NaN maps: exit 1, nothing written."""
    from vitviz.core.reading import validate
    monkeypatch.setattr(validate, "normalized_reach", lambda _m, _s: 0.0)
    out = tmp_path / "out"
    assert main(["export", "--model", str(tiny_ckpt), "--heads", "2", str(photo), "--out", str(out), "--npz",
                     "--quiet", "--std", "1e-30"]) == 1
    err = capsys.readouterr().err
    assert "NaN or infinite attention" in err and "std (1e-30,)" in err
    assert list(out.glob("*.png")) == [] and list(out.glob("*.npz")) == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["images"][0]["status"] == "failed" and "NaN" in manifest["images"][0]["error"]
