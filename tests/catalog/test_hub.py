"""Models by name from the Hugging Face Hub (`hf:` / `timm:`), against a fake hub on 127.0.0.1 (no internet).

The fake hub (`tests/_fakehub.py`) answers like huggingface.co's `resolve` endpoint: HEAD/GET with X-Repo-Commit,
ETag and Content-Length, Range requests for resumed downloads, and X-Error-Code on 404s. Hostile names and
revisions, a hub that misbehaves or stays silent, and real HF cache layouts (issue 20) are refused or read without a
write outside the cache.
"""
from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from _fakehub import COMMIT, FakeHub, SilentHub, hf_repo, timm_repo
from PIL import Image

import vitviz
from vitviz.catalog import hub
from vitviz.catalog.named import cached_named, check_model_name, is_named_model, resolve_model_arg, resolve_named
from vitviz.cli import main as cli_main
from vitviz.errors import MetadataError


@pytest.fixture()
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    repos = {"timm/vit_tiny_patch8_32.test": timm_repo(), "acme/tiny-vit": hf_repo(tmp_path)}
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with FakeHub(repos, gated=("acme/gated",)) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def test_names_are_parsed_and_refused_clearly() -> None:
    assert hub.parse_hub_name("hf:facebook/dinov2-small").repo_id == "facebook/dinov2-small"
    name = hub.parse_hub_name("hf:google/vit-base-patch16-224@refs/pr/1".replace("refs/pr/1", "v1.0"))
    assert (name.repo_id, name.revision) == ("google/vit-base-patch16-224", "v1.0")
    assert hub.parse_hub_name("timm:vit_small_patch14_reg4_dinov2.lvd142m").repo_id == \
        "timm/vit_small_patch14_reg4_dinov2.lvd142m"
    assert is_named_model("hf:a/b") and is_named_model("timm:x.y") and not is_named_model("hf_model.pth")
    for bad in ("hf:noslash", "hf:a/../b", "hf:a/b@", "timm:a/b", "hf:"):
        with pytest.raises(hub.HubError, match="expected"):
            hub.parse_hub_name(bad)


def test_timm_default_tag_from_timm() -> None:
    pytest.importorskip("timm")
    name = hub.parse_hub_name("timm:vit_small_patch14_reg4_dinov2")
    assert name.repo_id == "timm/vit_small_patch14_reg4_dinov2.lvd142m"
    with pytest.raises(hub.HubError, match="no pretrained weights"):
        hub.parse_hub_name("timm:not_a_real_model_xyz")


def test_download_then_cache_hit_timm_layout(fake_hub: FakeHub) -> None:
    seen: list[tuple[int, int | None]] = []
    folder = resolve_named("timm:vit_tiny_patch8_32.test", progress=lambda d, t: seen.append((d, t)))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]  # never code or docs
    assert "modeling_evil.py" not in fake_hub.gets and seen and seen[-1][0] == seen[-1][1]
    model = vitviz.load(folder)
    assert model.spec.num_heads == 2 and model.spec.image_size == (32, 32)
    fake_hub.gets.clear()
    assert resolve_named("timm:vit_tiny_patch8_32.test") == folder and fake_hub.gets == []   # cache hit
    assert cached_named("timm:vit_tiny_patch8_32.test") == folder


def test_transformers_repo_matches_the_original(fake_hub: FakeHub, tmp_path: Path) -> None:
    from transformers import ViTForImageClassification

    folder = Path(resolve_model_arg("hf:acme/tiny-vit"))
    model = vitviz.load(folder)
    ref = ViTForImageClassification.from_pretrained(folder, attn_implementation="eager").eval()
    x = torch.randn(1, 3, 32, 32)
    result = model.run(x)
    with torch.no_grad():
        out = ref(pixel_values=x, output_attentions=True)
    np.testing.assert_allclose(result.logits, out.logits[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(result.attentions, torch.cat(out.attentions).numpy(), atol=1e-5)


def test_interrupted_download_is_retried_and_never_left_half_written(fake_hub: FakeHub) -> None:
    """The connection drops after 100 bytes: huggingface_hub tries again and the file is complete; when every try
    drops, the call fails and nothing is left under the file's final name."""
    fake_hub.cut_after = (100, 1)   # (bytes, how many GETs to cut)
    folder = resolve_named("timm:vit_tiny_patch8_32.test")
    assert [f for f, _ in fake_hub.ranges].count("model.safetensors") == 2
    assert (folder / "model.safetensors").read_bytes() == fake_hub.repos["timm/vit_tiny_patch8_32.test"][
        "model.safetensors"]
    assert vitviz.load(folder).spec.depth == 2


def test_download_cut_every_time_leaves_nothing(fake_hub: FakeHub) -> None:
    fake_hub.cut_after = (100, 1000)
    with pytest.raises(Exception):
        resolve_named("timm:vit_tiny_patch8_32.test")
    assert cached_named("timm:vit_tiny_patch8_32.test") is None


def test_cancel_through_progress(fake_hub: FakeHub) -> None:
    class Cancelled(Exception):
        pass

    def cancel(done: int, total: int | None) -> None:
        raise Cancelled

    with pytest.raises(Cancelled):
        resolve_named("timm:vit_tiny_patch8_32.test", progress=cancel)
    assert cached_named("timm:vit_tiny_patch8_32.test") is None


def test_missing_gated_and_wrong_revision(fake_hub: FakeHub) -> None:
    with pytest.raises(hub.HubError, match="no repository acme/missing"):
        resolve_named("hf:acme/missing")
    with pytest.raises(hub.HubError, match="gated"):
        resolve_named("hf:acme/gated")
    with pytest.raises(hub.HubError, match="no revision 'v9'"):
        resolve_named("hf:acme/tiny-vit@v9")


def test_offline_names_repository_files_and_cache(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubError) as info:
        resolve_named("hf:acme/tiny-vit")
    text = str(info.value)
    assert "acme/tiny-vit" in text and "model.safetensors" in text and str(tmp_path / "hf-cache") in text
    assert fake_hub.gets == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    folder = resolve_named("hf:acme/tiny-vit")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_named("hf:acme/tiny-vit") == folder                   # offline, from the cache


def test_unreachable_hub_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.utils._http as hf_http

    monkeypatch.setattr(hf_http.time, "sleep", lambda _s: None)   # huggingface_hub's retry back-off
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # discard port: nothing listens
    with pytest.raises(hub.HubError, match="could not be reached"):
        resolve_named("hf:acme/tiny-vit")


def test_cli_info_by_hub_name(fake_hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["info", "timm:vit_tiny_patch8_32.test", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["num_heads"] == 2 and "downloading timm:vit_tiny_patch8_32.test" in err
    assert cli_main(["info", "hf:acme/missing"]) == 2
    assert "no repository acme/missing" in capsys.readouterr().err


def test_huggingface_hubs_own_messages_stay_out_of_the_terminal_unless_verbose(monkeypatch) -> None:  # noqa: ANN001
    """vitviz says what the hub does with its own lines; huggingface_hub's log lines and progress bars are shown
    only with --verbose ($VITVIZ_VERBOSE)."""
    from huggingface_hub.utils import (are_progress_bars_disabled, disable_progress_bars, enable_progress_bars,
                                       logging as hub_logging)

    from vitviz.catalog.hub import quiet_hub_library
    from vitviz.cli import build_parser
    from vitviz.cli.options import overrides_from

    level, bars = hub_logging.get_verbosity(), are_progress_bars_disabled()
    try:
        hub_logging.set_verbosity_warning()
        enable_progress_bars()
        monkeypatch.setenv("VITVIZ_VERBOSE", "1")
        quiet_hub_library()
        assert hub_logging.get_verbosity() == hub_logging.WARNING and not are_progress_bars_disabled()
        monkeypatch.delenv("VITVIZ_VERBOSE")
        quiet_hub_library()
        assert hub_logging.get_verbosity() == hub_logging.ERROR and are_progress_bars_disabled()
        overrides_from(build_parser().parse_args(["info", "hf:a/b", "--verbose"]))
        import os

        assert os.environ.get("VITVIZ_VERBOSE") == "1"
    finally:
        hub_logging.set_verbosity(level)
        (disable_progress_bars if bars else enable_progress_bars)()


MOVED = "fedcba9876543210fedcba9876543210fedcba98"


def test_a_cached_branch_follows_the_repository_online(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """As huggingface_hub does: online, `main` is asked of the hub again and a repository that moved on brings
    its new commit (only the changed file is downloaded); a commit hash and offline mode use the cache without a
    request."""
    first = resolve_named("hf:acme/tiny-vit")
    assert first.name == COMMIT
    repo = fake_hub.repos["acme/tiny-vit"]
    config = json.loads(repo["config.json"])
    repo["config.json"] = json.dumps({**config, "id2label": {"0": "cat", "1": "dog", "2": "bird"}}).encode()
    fake_hub.commit, fake_hub.gets = MOVED, []
    moved = resolve_named("hf:acme/tiny-vit")
    assert moved.name == MOVED and json.loads((moved / "config.json").read_text())["id2label"]["0"] == "cat"
    assert fake_hub.gets == ["config.json"]    # the weights' blob is the same: not downloaded again
    fake_hub.requests.clear()
    assert resolve_named(f"hf:acme/tiny-vit@{COMMIT}") == first and fake_hub.requests == []   # a commit never moves
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_named("hf:acme/tiny-vit") == moved and fake_hub.requests == []   # refs/main was updated


def test_a_cached_branch_is_used_when_the_hub_cannot_be_reached(fake_hub: FakeHub,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    folder = resolve_named("hf:acme/tiny-vit")
    import huggingface_hub.utils._http as hf_http

    monkeypatch.setattr(hf_http.time, "sleep", lambda _s: None)   # huggingface_hub's retry back-off
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # discard port: nothing listens
    assert resolve_named("hf:acme/tiny-vit") == folder


def test_the_legacy_cache_variable_is_read_as_huggingface_hub_reads_it(fake_hub: FakeHub, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import subprocess
    import sys

    from vitviz.catalog.dirs import hf_hub_dir

    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "legacy"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    for env in ({}, {"HUGGINGFACE_HUB_CACHE": ""}, {"HF_HUB_CACHE": "~/elsewhere"}):
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value) if value else patch.delenv(key)
            theirs = subprocess.run([sys.executable, "-c", "import huggingface_hub.constants as c; "
                                     "print(c.HF_HUB_CACHE)"], capture_output=True, text=True, env=dict(os.environ),
                                    check=True).stdout.strip()
            assert hf_hub_dir() == Path(theirs), env
    folder = resolve_named("hf:acme/tiny-vit")
    assert (tmp_path / "legacy") in folder.parents


def test_a_missing_revision_is_named_offline(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Offline, a repository in the cache without the revision asked for is said so (with the revisions it has),
    not as a repository missing from the cache; nothing says 'downloading'. TRANSFORMERS_OFFLINE counts, as in
    huggingface_hub."""
    resolve_named("hf:acme/tiny-vit")
    fake_hub.requests.clear()
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    with pytest.raises(hub.HubError) as info:
        resolve_named("hf:acme/tiny-vit@v9")
    assert "holds acme/tiny-vit but not its revision 'v9'" in str(info.value)
    assert f"cached: main, {COMMIT}" in str(info.value)
    assert cli_main(["info", "hf:acme/other"]) == 2
    err = capsys.readouterr().err
    assert "downloading" not in err and "acme/other is not in the cache" in err
    assert fake_hub.requests == []


def test_models_lists_names_the_commands_take(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`vitviz models` names each cached snapshot as `vitviz.load` and the commands take it, with its commit:
    `hf:ORG/NAME` for the one main points to, `@COMMIT` for an older one."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    resolve_named("hf:acme/tiny-vit")
    resolve_named("timm:vit_tiny_patch8_32.test")
    capsys.readouterr()
    assert cli_main(["models", "--json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)["models"]}
    assert entries["acme/tiny-vit"]["named"] == "hf:acme/tiny-vit" and entries["acme/tiny-vit"]["revision"] == COMMIT
    assert entries["timm/vit_tiny_patch8_32.test"]["named"] == "hf:timm/vit_tiny_patch8_32.test"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for entry in entries.values():    # usable as they are
        assert vitviz.load(entry["named"], heads=2 if "timm" in entry["name"] else None).spec.depth == 2
    assert cli_main(["models"]) == 0
    table = capsys.readouterr().out
    assert "hf:acme/tiny-vit " in table and COMMIT[:12] in table
    (Path(entries["acme/tiny-vit"]["path"]).parents[1] / "refs" / "main").write_text(MOVED)  # main moved on
    assert cli_main(["models", "--json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)["models"]}
    assert entries["acme/tiny-vit"]["named"] == f"hf:acme/tiny-vit@{COMMIT}"


# ------------------------------------------------------------ hostile names and revisions, a misbehaving hub (issue 20)

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


# ------------------------------------------------------------------------------------------------------- real HF caches

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
