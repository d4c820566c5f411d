"""Models by name from the Hugging Face Hub (`hf:` / `timm:`), against a fake hub on 127.0.0.1 (no internet).

The fake hub answers like huggingface.co's `resolve` endpoint: HEAD/GET with X-Repo-Commit, ETag and
Content-Length, Range requests for resumed downloads, and X-Error-Code on 404s.
"""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

import vitviz
from vitviz.catalog import hub
from vitviz.catalog.named import cached_named, is_named_model, resolve_model_arg, resolve_named
from vitviz.cli import main as cli_main

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _timm_repo() -> dict[str, bytes]:
    from safetensors.torch import save
    from _tiny import tiny_state_dict

    sd = tiny_state_dict(embed_dim=32, num_classes=5)
    config = {"architecture": "vit_tiny_patch8_32", "num_classes": 5, "num_features": 32,
              "model_args": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2,
                             "mlp_ratio": 2.0},
              "pretrained_cfg": {"input_size": [3, 32, 32], "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5],
                                 "crop_pct": 1.0, "interpolation": "bicubic"}}
    return {"model.safetensors": save({k: v.contiguous() for k, v in sd.items()}),
            "config.json": json.dumps(config).encode(), "README.md": b"not fetched",
            "modeling_evil.py": b"raise SystemExit('code was fetched')"}


def _hf_repo(tmp_path: Path) -> dict[str, bytes]:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
                    patch_size=8, num_labels=3)
    model = ViTForImageClassification(cfg).eval()
    out = tmp_path / "hf_src"
    model.save_pretrained(out)
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}


class FakeHub:
    """A thread serving `{repo}/resolve/{revision}/{file}` from dicts of bytes, counting the requests."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: tuple[str, ...] = ()) -> None:
        self.repos, self.gated, self.gets, self.cut_after = repos, gated, [], None
        self.ranges: list[tuple[str, int]] = []
        hub_self = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    return self._error(404, "RepoNotFound")
                repo, revision, file = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                if repo in hub_self.gated:
                    return self._error(403, "GatedRepo")
                if repo not in hub_self.repos:
                    return self._error(404, "RepoNotFound")
                if revision not in ("main", COMMIT):
                    return self._error(404, "RevisionNotFound")
                data = hub_self.repos[repo].get(file)
                if data is None:
                    return self._error(404, "EntryNotFound")
                start = 0
                if self.headers.get("Range", "").startswith("bytes="):
                    start = int(self.headers["Range"][6:].split("-")[0])
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if body:
                    hub_self.gets.append(file)
                    hub_self.ranges.append((file, start))
                    chunk = data[start:]
                    if hub_self.cut_after and hub_self.cut_after[1] > 0 and file == "model.safetensors":
                        size, times = hub_self.cut_after
                        chunk, hub_self.cut_after = chunk[:size], (size, times - 1)
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        self.connection.close()
                        return
                    self.wfile.write(chunk)

            def _error(self, code: int, kind: str) -> None:
                self.send_response(code)
                self.send_header("X-Error-Code", kind)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    repos = {"timm/vit_tiny_patch8_32.test": _timm_repo(), "acme/tiny-vit": _hf_repo(tmp_path)}
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
