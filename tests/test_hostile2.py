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
        start = time.monotonic()
        with pytest.raises(hub.HubError) as info:
            hub.resolve_hub("hf:acme/tiny", timeout=0.3)
        took = time.monotonic() - start
        text = str(info.value)
        assert took < 3 and "did not answer" in text and "waited 0.3 s" in text and hub.TIMEOUT_ENV in text
        assert "acme/tiny" in text and "could not be reached" not in text
        monkeypatch.setenv(hub.TIMEOUT_ENV, "0.2")      # the setting
        start = time.monotonic()
        with pytest.raises(hub.HubError, match="waited 0.2 s"):
            resolve_named("hf:acme/tiny")
        assert time.monotonic() - start < 3
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
    start = time.monotonic()

    def cancel_soon(done: int, total: int | None) -> None:
        calls.append((done, total))
        if time.monotonic() - start > 0.3:
            raise Cancelled

    with SilentHub() as silent:
        monkeypatch.setenv("HF_ENDPOINT", silent.url)
        with pytest.raises(Cancelled):
            hub.resolve_hub("hf:acme/tiny", progress=cancel_soon, timeout=60)
    assert time.monotonic() - start < 2 and len(calls) > 2 and calls[0] == (0, None)


def test_server_error_and_unreachable_host_are_told_apart(hub_env: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub_env.status = 500
    start = time.monotonic()
    with pytest.raises(hub.HubError) as info:
        hub.resolve_hub("hf:acme/tiny")
    assert time.monotonic() - start < 3            # not huggingface_hub's ~23 s of retries
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
