"""A fake Hugging Face Hub on 127.0.0.1 (no internet), for the hub tests (`tests/catalog/test_hub.py`, the hostile
ones).

`FakeHub` answers like huggingface.co's `resolve` endpoint: HEAD/GET with X-Repo-Commit, ETag and Content-Length,
Range requests for resumed downloads, and X-Error-Code on 404s. Its hostile modes (attributes set by a test):

- `cut_after = (bytes, times)`: the next `times` GETs of model.safetensors stop after `bytes` (the connection drops);
- `any_revision`: every revision exists (a 404 for a missing file still carries X-Repo-Commit, which makes
  huggingface_hub write `refs/<revision>` -- the write a hostile revision must never reach);
- `status`: every request is answered with this HTTP status (500: a hub that is up but failing);
- `redirect_loop`: every request is redirected to itself;
- `short_body`: a GET announces the whole file but sends half of it, then closes the connection;
- `commit`: the commit `main` points to (change it and the files: the repository moved on).

`SilentHub` accepts connections and never answers (a hung hub); `requests` counts what reached either.
"""
from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def timm_repo() -> dict[str, bytes]:
    """A tiny timm hub repository: model.safetensors + config.json (and files vitviz must never fetch)."""
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


def hf_repo(tmp_path: Path) -> dict[str, bytes]:
    """A tiny transformers ViT repository, as `save_pretrained` writes it."""
    import torch
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
        self.requests: list[str] = []   # every path asked for (HEAD and GET)
        self.any_revision = False
        self.status: int | None = None
        self.redirect_loop = False
        self.short_body = False
        self.commit = COMMIT
        hub_self = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                hub_self.requests.append(self.path)
                if hub_self.status is not None:
                    return self._error(hub_self.status, "ServerError")
                if hub_self.redirect_loop:
                    self.send_response(302)
                    self.send_header("Location", self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) < 5 or parts[2] != "resolve":
                    return self._error(404, "RepoNotFound")
                repo, revision, file = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                if repo in hub_self.gated:
                    return self._error(403, "GatedRepo")
                if repo not in hub_self.repos:
                    return self._error(404, "RepoNotFound")
                if revision not in ("main", hub_self.commit) and not hub_self.any_revision:
                    return self._error(404, "RevisionNotFound")
                data = hub_self.repos[repo].get(file)
                if data is None:
                    return self._error(404, "EntryNotFound")
                start = 0
                if self.headers.get("Range", "").startswith("bytes="):
                    start = int(self.headers["Range"][6:].split("-")[0])
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", hub_self.commit)
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if body:
                    hub_self.gets.append(file)
                    hub_self.ranges.append((file, start))
                    chunk = data[start:]
                    if hub_self.short_body:
                        chunk = chunk[:len(chunk) // 2]
                    elif hub_self.cut_after and hub_self.cut_after[1] > 0 and file == "model.safetensors":
                        size, times = hub_self.cut_after
                        chunk, hub_self.cut_after = chunk[:size], (size, times - 1)
                    else:
                        self.wfile.write(chunk)
                        return None
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    self.connection.close()
                return None

            def _error(self, code: int, kind: str) -> None:
                self.send_response(code)
                self.send_header("X-Error-Code", kind)
                self.send_header("X-Repo-Commit", hub_self.commit)   # the real hub sends it with an EntryNotFound 404
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02},
                                       daemon=True)   # (stops within 0.02 s, not serve_forever's 0.5 s)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class SilentHub:
    """A socket on 127.0.0.1 that accepts every connection and never answers (a hung hub)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.sock.settimeout(0.05)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted.append(conn)   # kept open, never read or answered

    def __enter__(self) -> "SilentHub":
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self.thread.join(2)
        for conn in self.accepted:
            conn.close()
        self.sock.close()
