"""Hostile inputs, round two (issue 20): hub names and revisions against a misbehaving hub on 127.0.0.1
(`tests/_fakehub.py`), real Hugging Face cache layouts, config readers of the newer families, text prompts,
export map names and `vitviz.show`. Every bad input is a `VitvizError` naming what was wrong and what was
expected; nothing is written outside the folders chosen; nothing waits without bound.
"""
from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import pytest
from PIL import Image
from _fakehub import COMMIT, FakeHub, SilentHub, timm_repo

import vitviz
from vitviz.catalog import hub
from vitviz.catalog.named import check_model_name, resolve_named
from vitviz.cli import main as cli_main
from vitviz.errors import MetadataError

# ------------------------------------------------------------------------------------------------ hub names

HOSTILE_REVISIONS = [
    "../../../x", "..", "../x", "a/../../b", "refs/pr/../../../x", "/etc/evil", "//evil", "a//b", "a/",
    "..\\..\\x", "C:\\evil", "main\n", "main\r\nX-Evil: 1", "ma\x00in", "x" * 300, ".hidden", "refs/.git/x",
    "main.lock", "m\u00e4in", " main", "%2e%2e/x", "a b", "~/x", "$HOME", "a:b", "*",
]


@pytest.fixture()
def hub_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fake hub whose repositories accept any revision (a 404 carries X-Repo-Commit, which makes huggingface_hub
    write refs/<revision>), its cache two folders below tmp_path so that a write outside it shows."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "home" / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv(hub.TIMEOUT_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with FakeHub({"acme/tiny": timm_repo()}) as server:
        server.any_revision = True
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def _written_outside(root: Path, cache: Path) -> list[Path]:
    return [p for p in root.rglob("*") if not p.is_dir() and cache not in p.parents and p.suffix != ".png"]


@pytest.mark.parametrize("revision", HOSTILE_REVISIONS, ids=range(len(HOSTILE_REVISIONS)))
def test_hostile_revisions_are_refused_before_the_hub_is_asked(hub_env: FakeHub, tmp_path: Path,
                                                               revision: str) -> None:
    name = f"hf:acme/tiny@{revision}"
    with pytest.raises(hub.HubError, match="revision .*expected a branch, tag or commit"):
        hub.resolve_hub(name)
    if name.strip() == name:              # (the window strips what was typed: 'main\n' is 'main' there)
        with pytest.raises(hub.HubError, match="revision"):
            check_model_name(name)        # what the window asks before loading
    with pytest.raises(hub.HubError, match="revision"):
        resolve_named(f"timm:vit_tiny_patch8_32.test@{revision}")
    assert hub_env.requests == []
    assert _written_outside(tmp_path, tmp_path / "home" / "cache") == []
    assert not (tmp_path / "x").exists() and not (tmp_path.parent / "x").exists()


def test_hostile_revision_on_the_command_line(hub_env: FakeHub, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    image = tmp_path / "home" / "photo.png"
    image.parent.mkdir()
    Image.new("RGB", (32, 32)).save(image)
    for revision in ("../../../x", "../../../../escaped", "main\n"):
        for argv in (["info", f"hf:acme/tiny@{revision}"], ["models", "--get", f"hf:acme/tiny@{revision}"],
                     ["export", "--model", f"hf:acme/tiny@{revision}", str(image),
                      "--out", str(tmp_path / "home" / "out")]):
            assert cli_main(argv) == 2
            err = capsys.readouterr().err
            assert "revision" in err and "expected a branch, tag or commit" in err and "Traceback" not in err
    assert hub_env.requests == []
    assert _written_outside(tmp_path, tmp_path / "home" / "cache") == []
    assert not (tmp_path.parent / "escaped").exists()


def test_good_revisions_still_resolve_inside_the_cache(hub_env: FakeHub, tmp_path: Path) -> None:
    for revision in ("main", COMMIT, "refs/pr/1", "v1.0", "feature/x-2_b"):
        hub.parse_hub_name(f"hf:acme/tiny@{revision}")
    folder = hub.resolve_hub("hf:acme/tiny@v1.0")
    assert (folder / "model.safetensors").is_file()
    cache = tmp_path / "home" / "cache"
    assert (cache / "models--acme--tiny" / "refs" / "v1.0").read_text() == COMMIT
    assert _written_outside(tmp_path, cache) == []


@pytest.mark.parametrize("text, needle", [
    ("hf:a--b/c", "'--'"), ("hf:org/name.git", ".git"), ("hf:org/na.me.", "starting or ending"),
    ("hf:org\u00e9/name", "non-ASCII"), ("hf:org/n\u0663", "non-ASCII"), ("hf:org/name\n", "line break"),
    ("hf:-org/name", "starting or ending"), ("hf:org/" + "n" * 97, "at most 96"), ("hf:a/b/c", "one '/'"),
    ("timm:vit_x.tag\n", "line break"), ("timm:vit\u00e9.tag", "non-ASCII"), ("timm:vit--x.tag", "'--'"),
])
def test_names_huggingface_hub_would_refuse_are_hub_errors(hub_env: FakeHub, text: str, needle: str) -> None:
    with pytest.raises(hub.HubError, match="expected") as info:
        resolve_named(text)
    assert needle in str(info.value)
    assert hub_env.requests == []


def test_huggingface_hubs_own_validation_error_is_a_hub_error(hub_env: FakeHub,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Were a name to pass vitviz's check and not huggingface_hub's, its HFValidationError is a HubError too."""
    monkeypatch.setattr(hub, "repo_problem", lambda _repo: "")
    with pytest.raises(hub.HubError, match="huggingface_hub refuses .*'a--b/c'"):
        hub.resolve_hub("hf:a--b/c")


def _quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's retries of a broken download sleep 1 s each; in its module only, they do not."""
    import huggingface_hub.file_download as fd

    stub = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    stub.sleep = lambda _s: None
    monkeypatch.setattr(fd, "time", stub)


def test_redirect_loop_and_a_body_cut_short_are_hub_errors(hub_env: FakeHub,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _quick_retries(monkeypatch)
    hub_env.redirect_loop = True
    with pytest.raises(hub.HubError, match=r"acme/tiny.*redirect.*too many times \(a redirect loop\)"):
        hub.resolve_hub("hf:acme/tiny")
    hub_env.redirect_loop, hub_env.short_body = False, True
    with pytest.raises(hub.HubError) as info:
        hub.resolve_hub("hf:acme/tiny", timeout=60)
    text = str(info.value)
    assert "acme/tiny" in text and "RemoteProtocolError" in text and "cut short" in text
    hub_env.short_body = False
    assert (hub.resolve_hub("hf:acme/tiny") / "model.safetensors").is_file()   # the next try completes it


def test_a_silent_hub_is_waited_for_a_bounded_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with SilentHub() as silent:
        monkeypatch.setenv("HF_ENDPOINT", silent.url)
        with pytest.raises(hub.HubError) as info:
            hub.resolve_hub("hf:acme/tiny", timeout=0.3)   # the hub never answers: only the timeout ends this
        text = str(info.value)
        assert "did not answer" in text and "waited 0.3 s" in text and hub.TIMEOUT_ENV in text
        assert "acme/tiny" in text and "could not be reached" not in text
        assert len(silent.accepted) == 1                  # one request waited for, not huggingface_hub's retries
        monkeypatch.setenv(hub.TIMEOUT_ENV, "0.2")      # the setting
        with pytest.raises(hub.HubError, match="waited 0.2 s"):
            resolve_named("hf:acme/tiny")
        assert len(silent.accepted) == 2
        monkeypatch.setenv(hub.TIMEOUT_ENV, "soon")
        with pytest.raises(hub.HubError, match=f"{hub.TIMEOUT_ENV} 'soon': expected a number of seconds > 0"):
            resolve_named("hf:acme/tiny")
        with pytest.raises(hub.HubError, match="timeout -1: expected a number of seconds"):
            hub.resolve_hub("hf:acme/tiny", timeout=-1)


def test_cancel_stops_the_metadata_phase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress callback is called while the hub is silent, so raising from it cancels at once."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    class Cancelled(Exception):
        pass

    calls: list[tuple[int, int | None]] = []

    def cancel_soon(done: int, total: int | None) -> None:
        calls.append((done, total))
        if len(calls) == 3:     # the third call, while the hub has not answered: the user cancels
            raise Cancelled

    with SilentHub() as silent:
        monkeypatch.setenv("HF_ENDPOINT", silent.url)
        with pytest.raises(Cancelled):   # a HubError instead: the callback was not called while the hub was silent
            hub.resolve_hub("hf:acme/tiny", progress=cancel_soon, timeout=60)
    assert len(calls) == 3 and calls[0] == (0, None)


def test_server_error_and_unreachable_host_are_told_apart(hub_env: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub_env.status = 500
    with pytest.raises(hub.HubError) as info:
        hub.resolve_hub("hf:acme/tiny")
    assert len(hub_env.requests) == 1              # asked once, not huggingface_hub's ~23 s of retries
    text = str(info.value)
    assert "answered HTTP 500" in text and "up but failing" in text and "could not be reached" not in text
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # discard port: nothing listens
    with pytest.raises(hub.HubError) as info:
        hub.resolve_hub("hf:acme/tiny")
    text = str(info.value)
    assert "could not be reached" in text and "Connection refused" in text and "HTTP 500" not in text


# ----------------------------------------------------------------------------------------- real HF caches


def _sharded_repo() -> dict[str, bytes]:
    from safetensors.torch import load, save

    repo = timm_repo()
    sd = load(repo.pop("model.safetensors"))
    keys = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": keys[:len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for file, names in shards.items():
        repo[file] = save({k: sd[k] for k in names})
    repo["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, names in shards.items() for k in names}}).encode()
    return repo


def test_sharded_model_in_a_real_hf_cache_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub lays the cache out itself (snapshot files are links into blobs/); the shards are inside."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub({"acme/sharded": _sharded_repo()}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        folder = hub.resolve_hub("hf:acme/sharded")
    shard = folder / "model-00001-of-00002.safetensors"
    assert shard.is_symlink() and shard.resolve().parent.name == "blobs"
    model = vitviz.load(folder)
    assert model.spec.depth == 2 and model.spec.num_heads == 2


def test_links_out_of_a_snapshot_elsewhere_stay_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub({"acme/sharded": _sharded_repo()}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        folder = hub.resolve_hub("hf:acme/sharded")
    shard = folder / "model-00002-of-00002.safetensors"
    outside = tmp_path / "elsewhere.safetensors"
    outside.write_bytes(shard.read_bytes())
    other_blobs = tmp_path / "cache" / "models--acme--other" / "blobs"
    other_blobs.mkdir(parents=True)
    for target in (outside, other_blobs / "x"):
        if target != outside:
            target.write_bytes(shard.read_bytes())
        shard.unlink()
        shard.symlink_to(os.path.relpath(target, folder))
        with pytest.raises(MetadataError, match="outside the model folder"):
            vitviz.load(folder)


# ------------------------------------------------------------------------------- configs of the newer families
# Built once: a timm DINOv3 and a Perception Encoder hub folder (config.json model_args), a transformers DINOv3
# folder (rope_theta) and open_clip's whole CLIP with its open_clip_config.json.
TINY = dict(embed_dim=64, num_heads=4, depth=2)


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import open_clip
    import timm
    import torch
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    root = tmp_path_factory.mktemp("families")
    folders = {}
    torch.manual_seed(0)
    for key, arch, extra in (("dinov3", "vit_small_patch16_dinov3", {}),
                             ("pe", "vit_pe_core_base_patch16_224", dict(img_size=64, attn_pool_num_heads=2))):
        args = dict(TINY, **extra)
        model = timm.create_model(arch, pretrained=False, num_classes=0, **args)
        folders[key] = root / key
        timm.models._hub.save_for_hf(model, str(folders[key]), model_args=args, safe_serialization=True)
    hf = DINOv3ViTModel(DINOv3ViTConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, image_size=32, patch_size=8, num_register_tokens=2))
    folders["hf-dinov3"] = root / "hf-dinov3"
    hf.save_pretrained(folders["hf-dinov3"])
    clip = open_clip.CLIP(embed_dim=16, vision_cfg=dict(layers=2, width=64, head_width=16, patch_size=8,
                                                        image_size=32),
                          text_cfg=dict(context_length=8, vocab_size=49408, width=32, heads=2, layers=1))
    folders["open_clip"] = root / "open_clip"
    folders["open_clip"].mkdir()
    torch.save(clip.state_dict(), folders["open_clip"] / "open_clip_pytorch_model.bin")
    (folders["open_clip"] / "open_clip_config.json").write_text(json.dumps({"model_cfg": {
        "embed_dim": 16, "vision_cfg": dict(layers=2, width=64, head_width=16, patch_size=8, image_size=32),
        "text_cfg": dict(context_length=8, vocab_size=49408, width=32, heads=2, layers=1)}}))
    return folders


def _quiet_load(path: Path, **kw: object) -> "vitviz.core.running.model.VitModel":
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(path, device="cpu", **kw)


def _variant(src: Path, dest: Path, file: str, section: str, field: str, value: object) -> Path:
    """A copy of the folder `src` whose `file` has `section.field` (section '' = the top level) set to `value`."""
    import shutil

    shutil.copytree(src, dest)
    data = json.loads((dest / file).read_text())
    target = data
    for part in [p for p in section.split(".") if p]:
        target = target.setdefault(part, {})
    target[field] = value
    (dest / file).write_text(json.dumps(data))
    return dest


BAD_FAMILY_CONFIGS = [
    # (folder, file, section, field, value, expected)
    ("dinov3", "config.json", "model_args", "rope_temperature", "hot", "finite number"),
    ("dinov3", "config.json", "model_args", "rope_temperature", [100], "finite number"),
    ("dinov3", "config.json", "model_args", "rope_temperature", 0, "finite number in (0"),
    ("dinov3", "config.json", "model_args", "rope_temperature", -100.0, "finite number in (0"),
    ("dinov3", "config.json", "model_args", "rope_temperature", float("nan"), "finite number"),
    ("dinov3", "config.json", "model_args", "rope_grid_offset", "1", None),      # a numeric string is a number
    ("dinov3", "config.json", "model_args", "rope_grid_offset", {"x": 1}, "finite number"),
    ("dinov3", "config.json", "model_args", "rope_grid_offset", float("nan"), "finite number"),
    ("dinov3", "config.json", "model_args", "rope_grid_offset", float("inf"), "finite number"),
    ("dinov3", "config.json", "model_args", "ref_feat_shape", "big", "grid of patches"),
    ("dinov3", "config.json", "model_args", "ref_feat_shape", [16, -16], "grid of patches"),
    ("dinov3", "config.json", "model_args", "ref_feat_shape", [1, 2, 3, 4], "grid of patches"),
    ("dinov3", "config.json", "model_args", "rope_rotate_half", "yes", "true or false"),
    ("pe", "config.json", "model_args", "attn_pool_num_heads", -2, "whole number"),
    ("pe", "config.json", "model_args", "attn_pool_num_heads", "two", "whole number"),
    ("pe", "config.json", "model_args", "attn_pool_num_heads", 2.5, "whole number"),
    ("hf-dinov3", "config.json", "", "rope_theta", "100", None),
    ("hf-dinov3", "config.json", "", "rope_theta", "a lot", "finite number"),
    ("hf-dinov3", "config.json", "", "rope_theta", 0, "finite number in (0"),
    ("hf-dinov3", "config.json", "", "rope_theta", -1.0, "finite number in (0"),
    ("hf-dinov3", "config.json", "", "rope_theta", None, "finite number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "head_width", "16", None),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "head_width", 0, "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "head_width", [16], "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "head_width", 24, "divisor of the width"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "image_size", "large", "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "image_size", -32, "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "width", "wide", "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "width", 64.5, "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg", "vision_cfg", "ViT-B", "JSON object"),
    ("open_clip", "open_clip_config.json", "model_cfg.text_cfg", "layers", -1, "whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.text_cfg", "context_length", 33000, "from 1 to 8192"),
    ("open_clip", "open_clip_config.json", "model_cfg.text_cfg", "heads", 3, "divides the width"),
]


@pytest.mark.parametrize("folder, file, section, field, value, expected", BAD_FAMILY_CONFIGS,
                         ids=[f"{c[0]}-{c[3]}-{c[4]!r}"[:60] for c in BAD_FAMILY_CONFIGS])
def test_config_fields_of_the_newer_families(family_folders: dict[str, Path], tmp_path: Path, folder: str,
                                             file: str, section: str, field: str, value: object,
                                             expected: str | None) -> None:
    path = _variant(family_folders[folder], tmp_path / folder, file, section, field, value)
    target = path / "open_clip_pytorch_model.bin" if folder == "open_clip" else path
    if expected is None:   # a value of another JSON type that still means what it says
        assert _quiet_load(target).spec.depth == 2
        return
    with pytest.raises(MetadataError) as info:
        _quiet_load(target)
    text = str(info.value)
    where = f"{section}.{field}" if section else field
    assert str(path / file) in text and f"field '{where}'" in text and expected in text
    assert "please report" not in text


def test_the_newer_families_load_as_generated(family_folders: dict[str, Path]) -> None:
    for key, folder in family_folders.items():
        target = folder / "open_clip_pytorch_model.bin" if key == "open_clip" else folder
        assert _quiet_load(target).spec.depth == 2, key


# ---------------------------------------------------------------------------------------- silent NaN, memory


@pytest.fixture(scope="module")
def tiny_model(tiny_ckpt: Path) -> "vitviz.core.running.model.VitModel":
    from _tiny import HEADS

    return _quiet_load(tiny_ckpt, heads=HEADS)


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

    spec = _quiet_load(family_folders["dinov3"]).spec
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
    assert cli_main(["export", "--model", str(tiny_ckpt), "--heads", "2", str(photo), "--out", str(out), "--npz",
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
    assert cli_main(["export", "--model", str(tiny_ckpt), "--heads", "2", str(photo), "--out", str(out), "--npz",
                     "--quiet", "--std", "1e-30"]) == 1
    err = capsys.readouterr().err
    assert "NaN or infinite attention" in err and "std (1e-30,)" in err
    assert list(out.glob("*.png")) == [] and list(out.glob("*.npz")) == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["images"][0]["status"] == "failed" and "NaN" in manifest["images"][0]["error"]


def test_resize_target_is_checked_like_a_source(tiny_ckpt: Path, tmp_path: Path, photo: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.errors import ImageError, OverrideError

    with pytest.raises(OverrideError, match="resize 60000; expected at most 14142"):
        vitviz.load(tiny_ckpt, heads=2, resize=60000)
    assert cli_main(["export", "--model", str(tiny_ckpt), "--heads", "2", str(photo), "--out", str(tmp_path / "o"),
                     "--resize", "60000", "--quiet"]) == 2
    assert "expected at most 14142" in capsys.readouterr().err
    strip = tmp_path / "strip.png"
    Image.new("RGB", (2000, 8)).save(strip)     # shorter side 8 -> 14000 px: 14000 x 3.5 million
    model = _quiet_load(tiny_ckpt, heads=2, resize=14000)
    resized: list[tuple[int, int]] = []
    original = Image.Image.resize
    monkeypatch.setattr(Image.Image, "resize", lambda img, size, *a, **k: resized.append(size) or original(img, size,
                                                                                                              *a, **k))
    with pytest.raises(ImageError, match=r"resizing its 2000x8 px to .* MP\) is refused.*200 MP"):
        model.run(strip)
    assert not [size for size in resized if size[0] * size[1] > 200_000_000]   # refused before resizing


# ------------------------------------------------------------------------------------------------- JAX .npz


def _npz(path: Path, members: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _npy(array: "np.ndarray") -> bytes:
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_npz_members_that_are_no_float_arrays(tmp_path: Path) -> None:
    import pickle

    import numpy as np

    from vitviz.errors import CorruptCheckpointError, UnsafeCheckpointError

    kernel = _npy(np.zeros((4, 4), np.float32))
    cases = [
        ({"Transformer/kernel.npy": kernel, "evil.npy": pickle.dumps({"a": 1})}, UnsafeCheckpointError,
         "member 'evil' of the .npz is a pickle"),
        ({"Transformer/kernel.npy": kernel, "notes.npy": b"just some text"}, CorruptCheckpointError,
         "member 'notes' of the .npz is not a NumPy array"),
        ({"embedding/kernel.npy": _npy(np.zeros((4, 4), np.int8))}, CorruptCheckpointError,
         "array 'embedding/kernel' \\(4, 4\\) holds integers \\(int8\\)"),
        ({"embedding/kernel.npy": _npy(np.zeros((4,), bool))}, CorruptCheckpointError, "holds booleans"),
        ({"embedding/kernel.npy": _npy(np.zeros((4,), [("a", "i1"), ("b", "i1")]))}, CorruptCheckpointError,
         "holds structured records"),
    ]
    for i, (members, error, needle) in enumerate(cases):
        with pytest.raises(error, match=needle):
            vitviz.load(_npz(tmp_path / f"case{i}.npz", members))


def test_npz_header_declaring_absurd_sizes_is_corrupt(tmp_path: Path) -> None:
    import io

    import numpy as np

    from vitviz.errors import CorruptCheckpointError

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (100000, 100000)})
    absurd = buffer.getvalue() + b"\0" * 64            # declaring 40 GB over 64 bytes
    path = _npz(tmp_path / "absurd.npz", {"head/bias.npy": _npy(np.zeros((1,), np.float32)),
                                          "embedding/kernel.npy": absurd})
    with pytest.raises(CorruptCheckpointError) as info:
        vitviz.load(path)
    text = str(info.value)
    assert "declares shape (100000, 100000) float32 (40,000,000,000 bytes) but holds 64 bytes" in text
    assert "memory" not in text


# --------------------------------------------------------------------------------------- text prompts, names

NEAR_PROMPTS = ["一只猫", "一只狗", "a cat", "A CAT!", "a cat?", "???", "!!!", "a" * 60 + " one", "a" * 60 + " two",
                "a photo of a cat", "a photo of a cat.", "A photo of a cat"]


def test_near_identical_prompts_each_get_a_file_of_their_own(family_folders: dict[str, Path], photo: Path,
                                                            tmp_path: Path) -> None:
    import warnings

    import numpy as np

    from vitviz.core.analyses.text import prompt_label

    labels = [prompt_label(p) for p in NEAR_PROMPTS]
    assert len(set(labels)) == len(NEAR_PROMPTS)
    assert labels == [prompt_label(p) for p in NEAR_PROMPTS]          # stable
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cli_main(["export", "--model", str(family_folders["open_clip"] / "open_clip_pytorch_model.bin"),
                         str(photo), "--out", str(out), "--maps", ",".join(f"text:{p}" for p in NEAR_PROMPTS),
                         "--npz", "--quiet", "--no-verify"]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(f"photo_{label}_Lall.png" for label in labels)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parameters"]["prompts"] == dict(zip(labels, NEAR_PROMPTS))
    assert sorted(manifest["images"][0]["outputs"]) == sorted(pngs + ["photo.npz"])
    keys = set(np.load(out / "photo.npz").files)
    assert all(label.replace("-", "_") in keys for label in labels)


def test_two_maps_under_one_name_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.batch.plan import check_unique_names, combos, parse_maps
    from vitviz.core.analyses import text
    from vitviz.core.analyses.maps import SelectionError

    maps = parse_maps("text:a cat,text:A CAT!")
    check_unique_names(combos(maps, ["all"], ["mean"]))
    monkeypatch.setattr(text, "prompt_label", lambda _p: "text-a_cat")   # as names were made before
    with pytest.raises(SelectionError, match="maps text:'a cat' and text:'A CAT!' would both be written as "
                                             "text-a_cat_Lall.png"):
        check_unique_names(combos(maps, ["all"], ["mean"]))


def test_text_tower_memory_is_checked_before_it_is_built(family_folders: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.core.running import runtime
    from vitviz.core.analyses.text import text_embedding
    from vitviz.errors import DeviceError

    folder = _variant(family_folders["open_clip"], tmp_path / "big", "open_clip_config.json",
                      "model_cfg.text_cfg", "context_length", 8192)
    monkeypatch.setattr(runtime, "available_memory", lambda: 100 << 20)
    with pytest.raises(DeviceError, match=r"context_length 8,192\) needs .* causal mask, but only 100.0 MiB"):
        text_embedding(folder / "open_clip_pytorch_model.bin", ["a cat"])


# ------------------------------------------------------------------------------------------------ vitviz.show


@pytest.fixture(scope="module")
def shown(tiny_model, photo: Path) -> "vitviz.core.spec.AttentionResult":
    return tiny_model.run(photo)


BAD_SHOW = [
    (dict(layer="x"), "layer is 'x'"), (dict(head="min"), "head is 'min'"), (dict(map=5), "map is 5"),
    (dict(cmap=None), "cmap is None"), (dict(opacity=5), "opacity is 5"), (dict(opacity="0.5"), "opacity is '0.5'"),
    (dict(opacity=float("nan")), "opacity is nan"), (dict(layer=99), "layer 99 is out of range: the model has 2"),
    (dict(layer=-3), "layer -3 is out of range"), (dict(head=2.5), "head is 2.5"), (dict(head=7), "head 7 is out"),
    (dict(layer=True), "layer is True"), (dict(style="bogus"), "style is 'bogus'"), (dict(scale="mine"), "scale"),
    (dict(smooth="no"), "smooth is 'no'"), (dict(colorbar="yes"), "colorbar is 'yes'"), (dict(original=1), "original"),
    (dict(map="token:999"), "token:999 out of range: the model has 17 tokens"),
    (dict(map="rollout:999"), "rollout:999 out of range"), (dict(map="pca"), "needs a pass of its own"),
    (dict(map="relevance"), "needs a pass of its own"), (dict(map="nonsense"), "expected one of cls"),
    (dict(cmap="rainbowish"), "cmap is 'rainbowish'"), (dict(size="input"), "unknown argument size='input'"),
    (dict(bogus=1), "unknown argument bogus=1"),
]


@pytest.mark.parametrize("kwargs, needle", BAD_SHOW, ids=[str(k) for k, _ in BAD_SHOW])
def test_show_refuses_wrong_arguments_naming_them(shown, kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(vitviz.VitvizError, match="expected|unknown argument") as info:
        vitviz.show(shown, **kwargs)
    assert needle in str(info.value) and str(info.value).startswith("show: ")


def test_show_refuses_what_is_not_a_result(tiny_model) -> None:
    with pytest.raises(vitviz.VitvizError, match="result is None .*expected an AttentionResult"):
        vitviz.show(None)
    with pytest.raises(vitviz.VitvizError, match="result is a model, not a result; expected model.run"):
        vitviz.show(tiny_model)


def test_show_accepts_what_export_accepts(shown) -> None:
    import numpy as np

    for kwargs in (dict(layer="last"), dict(layer="mean"), dict(head=-1), dict(head="max"), dict(cmap="magma_r"),
                   dict(map="rollout:3"), dict(map="token:16"), dict(layer=np.int64(1)), dict(opacity=0),
                   dict(style="heatmap", scale="own", smooth=False, colorbar_label=True)):
        assert vitviz.show(shown, **kwargs).size[0] > 0
    np.testing.assert_array_equal(np.asarray(vitviz.show(shown, layer="last")), np.asarray(vitviz.show(shown)))
