"""The catalog of checkpoints already on this computer, and named torchvision models (no network)."""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import urllib.request
from pathlib import Path

import pytest

from vitviz import catalog, cli
from vitviz.cli import models as cli_models
from vitviz.catalog import CatalogEntry, DownloadError
from vitviz.errors import VitvizError


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Empty torch hub and HF hub caches under tmp_path, selected through the environment."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    torch_dir = tmp_path / "torch" / "hub" / "checkpoints"
    hf_dir = tmp_path / "hf" / "hub"
    torch_dir.mkdir(parents=True)
    hf_dir.mkdir(parents=True)
    return torch_dir, hf_dir


def _hf_snapshot(hf_dir: Path, repo: str, config: dict, weights: str = "model.safetensors",
                 nbytes: int = 1000) -> Path:
    root = hf_dir / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text(json.dumps(config))
    (snap / weights).write_bytes(b"\0" * nbytes)
    return snap


def test_locations_follow_the_environment(caches: tuple[Path, Path]) -> None:
    torch_dir, hf_dir = caches
    assert catalog.torch_hub_dir() == torch_dir
    assert catalog.hf_hub_dir() == hf_dir


def test_default_locations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("TORCH_HOME", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert catalog.torch_hub_dir() == tmp_path / ".cache" / "torch" / "hub" / "checkpoints"
    assert catalog.hf_hub_dir() == tmp_path / ".cache" / "huggingface" / "hub"


def test_torch_hub_files_are_named_and_sized(caches: tuple[Path, Path]) -> None:
    torch_dir, _ = caches
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"\0" * 2048)
    (torch_dir / "vit_b_16_swag-9ac1b537.pth").write_bytes(b"\0" * 10)
    (torch_dir / "dinov2_vits14_pretrain.pth").write_bytes(b"\0" * 10)
    (torch_dir / "deit_small_patch16_224-cd65a155.pth").write_bytes(b"\0" * 10)
    (torch_dir / "resnet50-11ad3fa6.pth").write_bytes(b"\0" * 10)      # not a ViT: skipped
    entries = {e.path.name: e for e in catalog.scan_torch_hub()}
    assert set(entries) == {"vit_b_16-c867db91.pth", "vit_b_16_swag-9ac1b537.pth", "dinov2_vits14_pretrain.pth",
                            "deit_small_patch16_224-cd65a155.pth"}
    tv = entries["vit_b_16-c867db91.pth"]
    assert (tv.family, tv.size, tv.source) == ("torchvision", 2048, "torch hub")
    assert tv.name == "vit_b_16 · IMAGENET1K_V1" and tv.named == "torchvision:vit_b_16:IMAGENET1K_V1"
    assert "1000 classes" in tv.detail and "224 px" in tv.detail
    swag = entries["vit_b_16_swag-9ac1b537.pth"]
    assert swag.named == "torchvision:vit_b_16:IMAGENET1K_SWAG_E2E_V1" and "384 px" in swag.detail
    assert entries["dinov2_vits14_pretrain.pth"].family == "dinov2"
    assert entries["deit_small_patch16_224-cd65a155.pth"].family == "deit"


def test_hf_snapshots(caches: tuple[Path, Path]) -> None:
    _, hf_dir = caches
    _hf_snapshot(hf_dir, "google/vit-base-patch16-224",
                 {"model_type": "vit", "id2label": {str(i): f"c{i}" for i in range(1000)}}, nbytes=4000)
    _hf_snapshot(hf_dir, "facebook/dinov2-small", {"model_type": "dinov2"}, weights="pytorch_model.bin")
    _hf_snapshot(hf_dir, "timm/vit_small_patch16_224.augreg_in21k",
                 {"architecture": "vit_small_patch16_224", "num_classes": 21843})
    _hf_snapshot(hf_dir, "bert-base-uncased", {"model_type": "bert"})          # not a ViT: skipped
    (hf_dir / "models--org--empty" / "snapshots" / "r1").mkdir(parents=True)  # no weights: skipped
    entries = {e.name: e for e in catalog.scan_hf_hub()}
    assert set(entries) == {"google/vit-base-patch16-224", "facebook/dinov2-small",
                            "timm/vit_small_patch16_224.augreg_in21k"}
    g = entries["google/vit-base-patch16-224"]
    assert (g.family, g.size, g.source) == ("hf-vit", 4000, "hugging face")
    assert g.path.name == "abc123" and (g.path / "config.json").is_file()
    assert "1000 classes" in g.detail
    assert entries["facebook/dinov2-small"].family == "hf-dinov2"
    assert entries["timm/vit_small_patch16_224.augreg_in21k"].family == "timm"


def test_scan_merges_recent_first_and_skips_missing(caches: tuple[Path, Path], tmp_path: Path) -> None:
    torch_dir, _ = caches
    cached = torch_dir / "vit_b_32-d86f8d99.pth"
    cached.write_bytes(b"\0" * 10)
    own = tmp_path / "runs" / "checkpoint-best.pth"
    own.parent.mkdir()
    own.write_bytes(b"\0" * 30)
    entries = catalog.scan(recent=[own, tmp_path / "gone.pth", cached])
    assert [e.path for e in entries] == [own, cached]
    assert entries[0].source == "recent" and entries[0].family == "unknown" and entries[0].size == 30
    assert entries[1].source == "recent" and entries[1].named == "torchvision:vit_b_32:IMAGENET1K_V1"


def test_hf_snapshot_with_safetensors_and_bin_counts_one(caches: tuple[Path, Path]) -> None:
    """Older transformers fetched pytorch_model.bin, newer ones model.safetensors: vitviz.load reads only the
    latter, so the size is that file's, not the sum."""
    _, hf_dir = caches
    snap = _hf_snapshot(hf_dir, "google/vit-base-patch16-224", {"model_type": "vit"}, nbytes=4000)
    (snap / "pytorch_model.bin").write_bytes(b"\0" * 3000)
    (entry,) = catalog.scan_hf_hub()
    assert entry.size == 4000


def test_recent_folder_uses_its_config(tmp_path: Path) -> None:
    folder = tmp_path / "my-vit"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "deit"}))
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (entry,) = catalog.scan_recent([folder])
    assert (entry.family, entry.size, entry.path) == ("hf-deit", 64, folder)


def test_demo_checkpoint_reads_as_a_recent_timm_folder() -> None:
    from vitviz.demo import demo_checkpoint

    (entry,) = catalog.scan_recent([demo_checkpoint()])
    assert entry.family == "timm" and 0 < entry.size < 5_000_000


def test_empty_or_missing_caches(tmp_path: Path) -> None:
    assert catalog.scan(torch_dir=tmp_path / "nope", hf_dir=tmp_path / "nope2") == []


def test_named_models_cover_every_torchvision_vit() -> None:
    from torchvision.models import vision_transformer as tv

    names = catalog.named_models()
    expected = sum(len(list(getattr(tv, e))) for e in ("ViT_B_16_Weights", "ViT_B_32_Weights", "ViT_L_16_Weights",
                                                       "ViT_L_32_Weights", "ViT_H_14_Weights"))
    assert len(names) == expected and "torchvision:vit_h_14:IMAGENET1K_SWAG_E2E_V1" in names
    assert all(catalog.lookup_named(n).name == n for n in names)


def test_lookup_defaults_and_errors() -> None:
    nw = catalog.lookup_named("torchvision:vit_b_16")
    assert nw.name == "torchvision:vit_b_16:IMAGENET1K_V1" and nw.file_name == "vit_b_16-c867db91.pth"
    assert catalog.lookup_named("torchvision:vit_b_16:imagenet1k_swag_linear_v1").file_name.startswith("vit_b_16_lc")
    with pytest.raises(VitvizError, match="vit_b_16, vit_b_32"):
        catalog.lookup_named("torchvision:resnet50")
    with pytest.raises(VitvizError, match="IMAGENET1K_V1"):
        catalog.lookup_named("torchvision:vit_b_16:NOPE")
    assert catalog.is_named_model("torchvision:vit_b_16") and not catalog.is_named_model("/tmp/vit.pth")


def test_cached_named_model_is_used_without_download(caches: tuple[Path, Path]) -> None:
    torch_dir, _ = caches
    f = torch_dir / "vit_b_16-c867db91.pth"
    f.write_bytes(b"cached")
    assert catalog.cached_named("torchvision:vit_b_16") == f
    assert catalog.resolve_named("torchvision:vit_b_16", url="file:///definitely/not/there") == f


def test_download_from_file_url_with_progress(caches: tuple[Path, Path], tmp_path: Path) -> None:
    torch_dir, _ = caches
    source = tmp_path / "mirror.pth"
    data = bytes(range(256)) * 9000  # > 2 chunks
    source.write_bytes(data)
    calls: list[tuple[int, int | None]] = []
    path = catalog.resolve_named("torchvision:vit_b_32", progress=lambda d, t: calls.append((d, t)),
                                 url=source.as_uri(), check_hash=False)
    assert path == torch_dir / "vit_b_32-d86f8d99.pth" and path.read_bytes() == data
    assert calls[0][0] == 0 and calls[-1] == (len(data), len(data))
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert not list(torch_dir.glob("*.partial"))


def test_download_hash_mismatch_leaves_nothing(caches: tuple[Path, Path], tmp_path: Path) -> None:
    torch_dir, _ = caches
    source = tmp_path / "wrong.pth"
    source.write_bytes(b"not the real weights")
    assert not hashlib.sha256(source.read_bytes()).hexdigest().startswith("c867db91")
    with pytest.raises(DownloadError, match="SHA-256"):
        catalog.resolve_named("torchvision:vit_b_16", url=source.as_uri())
    assert list(torch_dir.iterdir()) == []


def test_offline_error_names_file_and_folder(caches: tuple[Path, Path], tmp_path: Path) -> None:
    torch_dir, _ = caches
    missing = (tmp_path / "offline" / "vit_l_16.pth").as_uri()
    with pytest.raises(DownloadError) as info:
        catalog.resolve_named("torchvision:vit_l_16", url=missing)
    message = str(info.value)
    assert "vit_l_16-852ce7e3.pth" in message and str(torch_dir) in message
    assert list(torch_dir.iterdir()) == []


class _Response(io.BytesIO):
    """What urllib.request.urlopen returns: `data`, announced with a Content-Length (None: no header)."""

    def __init__(self, data: bytes, length: int | None) -> None:
        super().__init__(data)
        self.headers = {} if length is None else {"Content-Length": str(length)}


def _serve(monkeypatch: pytest.MonkeyPatch, data: bytes, length: int | None) -> None:
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: _Response(data, length))


def test_download_cut_short_is_not_kept(caches: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """http.client returns a short body without an error when the connection drops: the Content-Length is the
    only sign, also when the hash is not checked."""
    torch_dir, _ = caches
    _serve(monkeypatch, b"x" * 10, 1000)
    with pytest.raises(DownloadError, match="after 10 of 1,000 bytes") as info:
        catalog.resolve_named("torchvision:vit_b_16", url="https://mirror.example/vit_b_16.pth", check_hash=False)
    assert "vit_b_16-c867db91.pth" in str(info.value) and "https://mirror.example/vit_b_16.pth" in str(info.value)
    assert list(torch_dir.iterdir()) == []


def test_ctrl_c_during_download_leaves_nothing(caches: tuple[Path, Path], tmp_path: Path) -> None:
    torch_dir, _ = caches
    source = tmp_path / "mirror.pth"
    source.write_bytes(b"\0" * (3 << 20))

    def interrupt(done: int, total: int | None) -> None:
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        catalog.resolve_named("torchvision:vit_b_32", progress=interrupt, url=source.as_uri(), check_hash=False)
    assert list(torch_dir.iterdir()) == []


def test_unverified_data_never_has_the_final_name(caches: tuple[Path, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or a crash) while the data is being checked must not leave it where `cached_named` would take it
    for a good download next time."""
    torch_dir, _ = caches
    source = tmp_path / "wrong.pth"
    source.write_bytes(b"not the real weights")

    class Interrupted:
        def update(self, data: bytes) -> None:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(hashlib, "sha256", Interrupted)
        with pytest.raises(KeyboardInterrupt):
            catalog.resolve_named("torchvision:vit_b_16", url=source.as_uri())
    assert catalog.cached_named("torchvision:vit_b_16") is None
    assert list(torch_dir.iterdir()) == []


def test_two_downloads_of_one_model_do_not_share_a_file(caches: tuple[Path, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A second download of the same model that starts (and fails) while the first is running must neither
    truncate nor delete the first one's temporary file (e.g. two exports sharing one TORCH_HOME)."""
    data = bytes(range(256)) * (4 << 12)  # 4 MiB: several chunks
    opened: list[str] = []

    class Response(io.BytesIO):
        def __init__(self, fail: bool) -> None:
            super().__init__(data)
            self.headers, self.fail, self.reads = {"Content-Length": str(len(data))}, fail, 0

        def read(self, n: int = -1) -> bytes:
            self.reads += 1
            if self.fail:
                raise urllib.error.URLError("connection reset")
            if self.reads == 2:  # meanwhile, another download of the same model starts and fails
                with pytest.raises(DownloadError, match="connection reset"):
                    catalog.resolve_named("torchvision:vit_b_16", url="https://mirror.example/b", check_hash=False)
            return super().read(n)

    def urlopen(url: str, timeout: float | None = None) -> Response:
        opened.append(url)
        return Response(fail=len(opened) > 1)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    path = catalog.resolve_named("torchvision:vit_b_16", url="https://mirror.example/a", check_hash=False)
    assert len(opened) == 2 and Path(path).read_bytes() == data
    assert [p.name for p in Path(path).parent.iterdir()] == [Path(path).name]


def test_resolve_model_arg_passes_paths_through(caches: tuple[Path, Path]) -> None:
    torch_dir, _ = caches
    assert catalog.resolve_model_arg("some/file.pth") == "some/file.pth"
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"x")
    assert catalog.resolve_model_arg("torchvision:vit_b_16") == str(torch_dir / "vit_b_16-c867db91.pth")


def _models_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_models.add_models_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["models", *argv])


def test_models_command_lists_json(caches: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    torch_dir, _ = caches
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"\0" * 5)
    assert cli_models.run_models_command(_models_args("--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["models"]
    assert doc["schema"] == "vitviz.models/1" and rows[0]["family"] == "torchvision" and rows[0]["size"] == 5


def test_models_command_text_and_named(caches: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_models.run_models_command(_models_args()) == 0
    assert "no ViT checkpoints found" in capsys.readouterr().out
    assert cli_models.run_models_command(_models_args("--named")) == 0
    out = capsys.readouterr().out
    assert "torchvision:vit_b_16:IMAGENET1K_V1" in out and "not downloaded" in out
    assert out.startswith("NAME") and "346 MB" in out            # header; float32 size of vit_b_16
    torch_dir, _ = caches
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"\0" * 5)
    assert cli_models.run_models_command(_models_args()) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "FAMILY", "SIZE", "SOURCE", "REVISION", "PATH"]
    assert row.startswith("torchvision:vit_b_16:IMAGENET1K_V1 ")     # the name the commands take


def test_models_get_prints_the_cached_path(caches: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    torch_dir, _ = caches
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"\0" * 5)
    assert cli.main(["models", "--get", "torchvision:vit_b_16"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{torch_dir / 'vit_b_16-c867db91.pth'}\n" and err == ""


def test_models_get_error_starts_on_its_own_line(caches: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Without a Content-Length the progress is a bare byte count, which no 100% ends: the error after it
    must not be glued onto that line."""
    _serve(monkeypatch, b"not the real weights", None)
    assert cli.main(["models", "--get", "torchvision:vit_b_16"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("downloading vit_b_16-c867db91.pth (346 MB) from https://")
    assert "\nvitviz: downloaded 20 B\nvitviz: error: vit_b_16-c867db91.pth: the data downloaded from https://" in err
    assert "SHA-256" in err


def test_format_size() -> None:
    assert catalog.format_size(999) == "999 B"
    assert catalog.format_size(12_400) == "12.4 kB"
    assert catalog.format_size(346_000_000) == "346 MB"
    assert isinstance(CatalogEntry("a", Path("a"), "recent", "timm", 1).to_dict()["path"], str)


# ------------------------------------------------------------------------- unreadable folders do not fail a scan
def _deny(monkeypatch: pytest.MonkeyPatch, *folders: Path) -> None:
    """Make `folders` behave like folders with mode 000 for a non-root user (tests run as root, where chmod does
    not block reads): listing one, or looking at anything inside it, raises PermissionError."""
    import os

    denied = [str(f) for f in folders]

    def check(path: object, listing: bool) -> None:
        p = os.fsdecode(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
        if any(p.startswith(d + os.sep) or (listing and p == d) for d in denied):
            raise PermissionError(13, "Permission denied", p)

    def wrap(real, listing: bool):
        def fake(path=".", *args, **kwargs):
            check(path, listing)
            return real(path, *args, **kwargs)
        return fake

    monkeypatch.setattr(os, "stat", wrap(os.stat, False))
    monkeypatch.setattr(os, "lstat", wrap(os.lstat, False))
    monkeypatch.setattr(os, "listdir", wrap(os.listdir, True))
    monkeypatch.setattr(os, "scandir", wrap(os.scandir, True))


def test_unreadable_torch_hub_folder_is_skipped_not_fatal(caches: tuple[Path, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    torch_dir, hf_dir = caches
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"\0" * 5)
    _hf_snapshot(hf_dir, "google/vit-base-patch16-224", {"model_type": "vit"})
    own = tmp_path / "mine.pth"
    own.write_bytes(b"\0" * 3)
    _deny(monkeypatch, torch_dir)
    entries = catalog.scan(recent=[own])
    assert [e.name for e in entries] == ["mine.pth", "google/vit-base-patch16-224"]
    assert [(s.path, s.reason) for s in entries.skipped] == [(torch_dir, "Permission denied")]
    assert entries == list(entries)   # still compares as the plain list it always was
    # the window asks for the named models' cached files too: an unreadable cache means "not downloaded"
    assert catalog.cached_named("torchvision:vit_b_16") is None


def test_unreadable_hf_repo_snapshot_and_recent_folder_are_skipped(caches: tuple[Path, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    _, hf_dir = caches
    _hf_snapshot(hf_dir, "google/vit-base-patch16-224", {"model_type": "vit"})
    locked = _hf_snapshot(hf_dir, "facebook/dinov2-small", {"model_type": "dinov2"})
    # a repository whose refs/main snapshot cannot be read, but an older one can: the older one is listed
    two = _hf_snapshot(hf_dir, "facebook/deit-tiny-patch16-224", {"model_type": "deit"})
    older = two.parent / "old456"
    older.mkdir()
    (older / "config.json").write_text(json.dumps({"model_type": "deit"}))
    (older / "model.safetensors").write_bytes(b"\0" * 7)
    runs = tmp_path / "runs"
    (runs / "secret").mkdir(parents=True)
    (runs / "secret" / "vit.pth").write_bytes(b"\0")
    (runs / "open.pth").write_bytes(b"\0" * 2)
    repo = locked.parent.parent
    _deny(monkeypatch, repo, two, runs / "secret")
    entries = catalog.scan(recent=[runs / "secret" / "vit.pth", runs / "open.pth"])
    google = hf_dir / "models--google--vit-base-patch16-224" / "snapshots" / "abc123"
    assert {e.name: e.path for e in entries} == {"open.pth": runs / "open.pth", "google/vit-base-patch16-224": google,
                                                 "facebook/deit-tiny-patch16-224": older}
    assert {s.path for s in entries.skipped} == {runs / "secret" / "vit.pth", repo, two}
    assert all(s.reason.startswith("Permission denied") for s in entries.skipped)


def test_unreadable_file_in_torch_hub_is_skipped(caches: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    torch_dir, _ = caches
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"\0" * 5)
    bad = torch_dir / "vit_b_32-d86f8d99.pth"
    bad.write_bytes(b"\0" * 5)
    real = os.stat

    def stat(path, *args, **kwargs):
        if os.fspath(path) == str(bad):
            raise OSError(5, "Input/output error", str(bad))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    entries = catalog.scan_torch_hub()
    assert [e.path.name for e in entries] == ["vit_b_16-c867db91.pth"]
    assert [str(s) for s in entries.skipped] == [f"{bad}: Input/output error"]


def test_models_command_names_skipped_folders(caches: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    torch_dir, hf_dir = caches
    _hf_snapshot(hf_dir, "google/vit-base-patch16-224", {"model_type": "vit"})
    _deny(monkeypatch, torch_dir)
    assert cli.main(["models", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [row["name"] for row in json.loads(out)["models"]] == ["google/vit-base-patch16-224"]
    assert f"vitviz: skipped {torch_dir}: Permission denied" in err


# ------------------------------------------------------------------- saving a download fails on this computer
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def urlopen(url, timeout=None):
        raise AssertionError(f"the network was asked for {url}")
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)


def test_cache_folder_that_cannot_be_made_is_a_local_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TORCH_HOME under a file: the folder cannot be created. Not a network problem, and found before any."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("TORCH_HOME", str(blocker))
    _no_network(monkeypatch)
    with pytest.raises(DownloadError) as info:
        catalog.resolve_named("torchvision:vit_b_16")
    message = str(info.value)
    assert "vit_b_16-c867db91.pth could not be saved in " + str(blocker / "hub" / "checkpoints") in message
    assert "Not a directory" in message and "TORCH_HOME" in message
    assert "internet" not in message and "could not be downloaded" not in message


def test_disk_full_while_downloading_is_a_local_error(caches: tuple[Path, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from vitviz.catalog import named as catalog_named

    torch_dir, _ = caches
    source = tmp_path / "mirror.pth"
    source.write_bytes(b"\0" * (3 << 20))

    class Full(io.FileIO):
        def write(self, data: bytes) -> int:
            if self.tell() >= 1 << 20:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    monkeypatch.setattr(catalog_named, "open", lambda path, mode: Full(path, "wb"), raising=False)
    with pytest.raises(DownloadError) as info:
        catalog.resolve_named("torchvision:vit_b_32", url=source.as_uri(), check_hash=False)
    message = str(info.value)
    assert f"vit_b_32-d86f8d99.pth could not be saved in {torch_dir}" in message
    assert "No space left on device" in message and "Free space" in message and "TORCH_HOME" in message
    assert "internet" not in message and "could not be downloaded" not in message
    assert list(torch_dir.iterdir()) == []


def test_cache_folder_without_permission_is_a_local_error(caches: tuple[Path, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.catalog import named as catalog_named

    torch_dir, _ = caches

    def denied(path, mode):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(catalog_named, "open", denied, raising=False)
    _no_network(monkeypatch)
    with pytest.raises(DownloadError) as info:
        catalog.resolve_named("torchvision:vit_b_16")
    message = str(info.value)
    assert f"could not be saved in {torch_dir}" in message and "Permission denied" in message
    assert f"Make {torch_dir} writable" in message and "TORCH_HOME" in message
    assert "internet" not in message


def test_network_errors_still_say_download_elsewhere(caches: tuple[Path, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import http.client

    torch_dir, _ = caches

    class Cut(_Response):
        def read(self, n: int = -1) -> bytes:
            raise http.client.IncompleteRead(b"abc", 10)   # a chunked response cut off: not an OSError

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: Cut(b"", None))
    with pytest.raises(DownloadError, match="could not be downloaded from https://.*internet access"):
        catalog.resolve_named("torchvision:vit_b_16")
    assert list(torch_dir.iterdir()) == []


# ------------------------------------------------------------------------------- info takes named models too
def _tiny_torchvision(path: Path) -> bytes:
    """A small torchvision ViT (224 px, patch 16, 12 heads like vit_b_16, but 1 layer of width 48) saved under
    `path`; returns the file's bytes."""
    import torch
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    net = VisionTransformer(image_size=224, patch_size=16, num_layers=1, num_heads=12, hidden_dim=48, mlp_dim=64)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), path)
    return path.read_bytes()


def test_info_accepts_a_cached_named_model(caches: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    torch_dir, _ = caches
    _tiny_torchvision(torch_dir / "vit_b_16-c867db91.pth")
    _no_network(monkeypatch)
    assert cli.main(["info", "torchvision:vit_b_16", "--json"]) == 0
    out, err = capsys.readouterr()
    spec = json.loads(out)
    assert spec["family"] == "torchvision" and spec["source"] == str(torch_dir / "vit_b_16-c867db91.pth")
    assert spec["num_heads"] == 12 and spec["labels"] == 1000 and err == ""


def test_info_downloads_a_named_model_with_progress(caches: tuple[Path, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from vitviz.catalog import named as catalog_named

    torch_dir, _ = caches
    data = _tiny_torchvision(tmp_path / "mirror" / "weights.pth")
    _serve(monkeypatch, data, len(data))
    monkeypatch.setattr(catalog_named, "_sha256_prefix", lambda name: "")   # not torchvision's real file
    assert cli.main(["info", "torchvision:vit_b_16"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(str(torch_dir / "vit_b_16-c867db91.pth")) and "family: torchvision" in out
    assert err.startswith("downloading vit_b_16-c867db91.pth (346 MB) from https://") and f"to {torch_dir}" in err
    assert "100%" in err and err.endswith("\n")
    assert (torch_dir / "vit_b_16-c867db91.pth").read_bytes() == data


def test_info_offline_names_the_file_and_the_folder(caches: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    torch_dir, _ = caches

    def offline(url, timeout=None):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    import urllib.error

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert cli.main(["info", "torchvision:vit_l_16"]) == 2
    err = capsys.readouterr().err
    assert "vitviz: error: vit_l_16-852ce7e3.pth is not in " + str(torch_dir) in err
    assert f"put it in {torch_dir}" in err and "No such file" not in err
    assert list(torch_dir.iterdir()) == []


def test_info_unknown_name_is_refused(caches: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info", "torchvision:vit_x_99"]) == 2
    assert "unknown model name" in capsys.readouterr().err


# ---------------------------------------------------------------------------- models --get with other options
def test_models_get_refuses_named_and_recent(caches: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    torch_dir, _ = caches
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"\0" * 5)
    for other in (["--named"], ["--recent", "x.pth"]):
        with pytest.raises(SystemExit) as info:
            cli.main(["models", "--get", "torchvision:vit_b_16", *other])
        assert info.value.code == 2
        out, err = capsys.readouterr()
        assert out == "" and f"argument {other[0]}: not allowed with argument --get" in err
    with pytest.raises(VitvizError, match="cannot be combined"):   # a Namespace made by hand
        cli_models.run_models_command(argparse.Namespace(get="torchvision:vit_b_16", named=True, recent=[],
                                                      json=False))


def test_models_get_json(caches: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    torch_dir, _ = caches
    (torch_dir / "vit_b_16-c867db91.pth").write_bytes(b"\0" * 5)
    assert cli.main(["models", "--get", "torchvision:vit_b_16", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"schema": "vitviz.get/1", "name": "torchvision:vit_b_16:IMAGENET1K_V1",
                               "path": str(torch_dir / "vit_b_16-c867db91.pth"), "size": 5}
    assert err == ""


def test_hf_cache_lists_timm_transformers_and_open_clip_repositories(caches: tuple[Path, Path]) -> None:
    """The three kinds of hub repository people have: a timm one, a transformers one and an open_clip one (found by
    its open_clip_config.json, whatever the repository is called)."""
    _, hf_dir = caches
    _hf_snapshot(hf_dir, "timm/vit_small_patch16_224.augreg_in21k", {"architecture": "vit_small_patch16_224",
                                                                      "num_classes": 1000})
    _hf_snapshot(hf_dir, "acme/vit-small", {"model_type": "vit", "id2label": {"0": "a", "1": "b", "2": "c"}})
    oc = _hf_snapshot(hf_dir, "someone/my-model", {}, weights="open_clip_model.safetensors", nbytes=3000)
    (oc / "config.json").unlink()
    (oc / "open_clip_config.json").write_text(json.dumps({"model_cfg": {"vision_cfg": {"width": 768}}}))
    found = {e.name: e for e in catalog.scan_hf_hub()}
    assert found["timm/vit_small_patch16_224.augreg_in21k"].family == "timm"
    assert found["acme/vit-small"].family.startswith("hf")
    assert (found["someone/my-model"].family, found["someone/my-model"].detail) == ("clip", "open_clip, vision width 768")
    assert found["someone/my-model"].size == 3000


def test_a_family_guessed_from_the_name_is_marked_as_a_guess(tmp_path: Path) -> None:
    """Round five: the Models menu listed a hand-written `vit_tiny.pth` as 'timm · 576 kB · recent'; it loads as a
    structural (hand-written) ViT. A family read from nothing but the name is printed with a question mark."""
    from vitviz.catalog.scan import scan_recent

    f = tmp_path / "vit_tiny_patch16_224.pth"
    f.write_bytes(b"0" * 10)
    (entry,) = scan_recent([f])
    assert entry.family == "timm" and entry.by_name and entry.family_text == "timm?"
    assert "guessed from the file name" in entry.detail
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "config.json").write_text('{"architecture": "vit_tiny_patch16_224", "num_classes": 10}')
    (folder / "model.safetensors").write_bytes(b"0" * 10)
    (entry,) = scan_recent([folder])
    assert not entry.by_name and entry.family_text == entry.family       # read from its config: no mark
