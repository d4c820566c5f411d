"""Maps leaving the device (issue 36, item 5): every capture moves them through one `HostCopy` -- on CUDA with
asynchronous copies through pinned staging buffers, cast to float16 on the device first, each landing in its host
array after its copy event, one wait before any read.

This machine has no GPU, so the device path is run here against a simulated device (`device`): buffers asked for
pinned are recorded, every `non_blocking` copy into them is *deferred* until the `synchronize` of an event
recorded after it (as a CUDA stream would run it later), every buffer starts as NaN, and every read of a staging
buffer or array fails while a copy into a staging buffer is pending. What that proves: the branch's logic -- the
staging buffers asked for pinned and reused, copies queued after the narrowing cast, nothing read before its
copy's event, the same maps bit for bit. What it cannot: that CUDA runs the copies asynchronously and faster
(scripts/gpu_check.py measures it on a GPU)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from _tiny import write_tiny_checkpoint

import vitviz
from vitviz.batch import pipeline
from vitviz.batch.plan import parse_maps, with_rollout
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.core.analyses.tokens import fuse_heads
from vitviz.core.running import capture, runtime
from vitviz.core.running.capture import LayerSink, capture_attention
from vitviz.core.running.runtime import STAGES, HostCopy

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
ROWS = [0, 5]
DEPTH = 5   # more layers than staging buffers: each is reused


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("host") / "m.pth", reg_tokens=2, depth=DEPTH)
    return vitviz.load(path, heads=2, device="cpu")


ORIGINAL_COPY = torch.Tensor.copy_
ORIGINAL_NUMPY = torch.Tensor.numpy


class Device:
    """A simulated CUDA device for `HostCopy`: what it was asked, in order, in `log`."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.pinned: list[bool] = []          # `pinned` of every host buffer asked for
        self.copies: list[tuple[torch.dtype, torch.dtype, bool]] = []   # into staging: (source, buffer, non_blocking)
        self.direct: list[tuple[torch.dtype, torch.dtype, bool]] = []   # into an array, not from a staging buffer
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (order, staging buffer, source)
        self.queued = 0
        self.stages: set[int] = set()         # storage addresses of the pinned buffers made
        self.arrays: set[int] = set()         # ... and of the others
        self.made: list[torch.Tensor] = []    # every buffer made, held: a freed one's address, reused by an
        #                                       unrelated tensor, would otherwise count as a staging buffer

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        self.pinned.append(pinned)
        t = torch.empty(shape, dtype=dtype)
        t.view(torch.uint8).fill_(255)        # NaN in float32 and float16: what an unfinished copy leaves
        (self.stages if pinned else self.arrays).add(t.untyped_storage().data_ptr())
        self.made.append(t)
        return t

    def stage(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.stages

    def ours(self, t: torch.Tensor) -> bool:
        return self.stage(t) or t.untyped_storage().data_ptr() in self.arrays

    def event(self, _device: torch.device) -> Any:
        self.log.append("event")
        upto = self.queued
        return SimpleNamespace(synchronize=lambda: self.flush(upto))

    def flush(self, upto: int) -> None:
        """The copies queued before the event ran: done now, in order."""
        self.log.append("sync")
        with torch.inference_mode():   # the buffers may be inference tensors; the stream does not care
            for order, dst, src in [q for q in self.pending if q[0] < upto]:
                ORIGINAL_COPY(dst, src)
        self.pending = [q for q in self.pending if q[0] >= upto]

    def unfinished(self, t: torch.Tensor) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return any(dst.untyped_storage().data_ptr() == ptr for _o, dst, _s in self.pending)


@pytest.fixture()
def device(monkeypatch: pytest.MonkeyPatch) -> Device:
    """The simulated device: `HostCopy` (and the capture) take their CUDA branch."""
    return simulated(monkeypatch)


def simulated(monkeypatch: pytest.MonkeyPatch) -> Device:
    """Patch in a simulated device until `monkeypatch` is undone."""
    dev = Device()

    def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        if dev.stage(self):
            dev.copies.append((src.dtype, self.dtype, non_blocking))
            dev.log.append("copy")
            if non_blocking:
                assert self.is_contiguous(), "an asynchronous copy into a non-contiguous buffer is staged by torch"
                dev.pending.append((dev.queued, self, src))   # runs at a later event's synchronize
                dev.queued += 1
                return self
        elif dev.stage(src):
            assert not dev.unfinished(src), "a staging buffer was read before the copy into it had arrived"
            dev.log.append("land")
        elif dev.ours(self):
            dev.direct.append((src.dtype, self.dtype, non_blocking))
        return ORIGINAL_COPY(self, src, non_blocking)

    def numpy(self: torch.Tensor, *a: Any, **k: Any) -> np.ndarray:
        if dev.ours(self):
            dev.log.append("read")
            assert not dev.pending, "a host array was read before the copies into it had arrived"
        return ORIGINAL_NUMPY(self, *a, **k)

    monkeypatch.setattr(runtime, "device_memory", lambda _d: True)
    monkeypatch.setattr(capture, "device_memory", lambda _d: True)
    monkeypatch.setattr(runtime, "_host_empty", dev.empty)
    monkeypatch.setattr(runtime, "_copy_event", dev.event)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    monkeypatch.setattr(torch.Tensor, "numpy", numpy)
    return dev


def hooked(model: Any, x: torch.Tensor) -> torch.Tensor:
    """(B, L, H, T, T): every layer's attention kept by plain hooks (clones), the reference the captures match."""
    keep: list[torch.Tensor] = []
    with torch.inference_mode(), capture_attention(model.net, keep):
        model.net(x)
    return torch.stack([k.clone() for k in keep], dim=1)


CASES = {"full": {}, "rows": {"rows": ROWS}, "half": {"half": True}, "half rows": {"half": True, "rows": ROWS}}


def expected(ref: torch.Tensor, case: dict[str, Any]) -> np.ndarray:
    out = ref[:, :, :, case["rows"]] if "rows" in case else ref
    return (out.half() if case.get("half") else out).numpy()


@pytest.mark.parametrize("name", list(CASES))
def test_captured_maps_are_those_of_plain_hooks(tiny: Any, name: str) -> None:
    """On the host (no pinning, synchronous copies): full, rows and float16 captures, two images at once."""
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    maps, _ = tiny.forward_captured(x, **CASES[name])
    np.testing.assert_array_equal(maps, expected(hooked(tiny, x), CASES[name]))


@pytest.mark.parametrize("name", list(CASES))
def test_the_device_path_gives_the_same_maps_read_only_after_the_wait(tiny: Any, device: Device, name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    ref = expected(hooked(tiny, x), CASES[name])
    calls: list[tuple[int, ...]] = []
    copy = HostCopy.copy
    monkeypatch.setattr(HostCopy, "copy", lambda self, dst, src: calls.append(tuple(src.shape)) or copy(self, dst, src))
    maps, _ = tiny.forward_captured(x, **CASES[name])
    np.testing.assert_array_equal(maps, ref)
    assert len(calls) == DEPTH                         # the helper moved every layer (no softmax wrote to the host)
    assert device.pinned == [False] + [True] * STAGES  # one array, and the staging buffers made once, reused
    assert len(device.copies) == DEPTH and device.direct == []   # one asynchronous copy per layer ...
    assert all(nb for _s, _d, nb in device.copies)
    wanted = torch.float16 if CASES[name].get("half") else torch.float32
    assert {(s, d) for s, d, _nb in device.copies} == {(wanted, wanted)}   # ... cast on the device before it
    assert device.log.count("land") == DEPTH and device.log.count("sync") >= DEPTH
    first_read = device.log.index("read")
    assert "copy" not in device.log[first_read:] and "land" not in device.log[first_read:]


def test_the_simulation_defers_copies(tiny: Any, device: Device) -> None:
    """The simulated device is what makes the test above able to fail: an array read before the wait misses the
    layers still on their way, and a staging buffer cannot be read before its copy's event."""
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    sink = LayerSink(DEPTH, half=True)
    with torch.inference_mode(), capture_attention(tiny.net, sink):
        tiny.net(x)
    raw = ORIGINAL_NUMPY(sink.array)
    assert len(device.pending) == STAGES and np.isnan(raw[:, -STAGES:]).all()   # the last layers are on their way
    assert not np.isnan(raw[:, :-STAGES]).any()                               # the others have landed
    with pytest.raises(AssertionError, match="before the copies"):
        sink.array.numpy()
    with pytest.raises(AssertionError, match="staging buffer was read"):
        torch.empty(device.pending[0][1].shape, dtype=torch.float16).copy_(device.pending[0][1])
    np.testing.assert_array_equal(sink.numpy(), hooked(tiny, x).half().numpy())


def test_host_copy_on_the_cpu_is_a_plain_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same calls on the CPU: nothing staged or pinned, synchronous copies, the float16 cast before the copy."""
    asked: list[bool] = []
    empty = runtime._host_empty
    monkeypatch.setattr(runtime, "_host_empty", lambda s, d, p: asked.append(p) or empty(s, d, p))
    seen: list[tuple[torch.dtype, bool]] = []
    monkeypatch.setattr(torch.Tensor, "copy_",
                        lambda self, src, non_blocking=False: seen.append((src.dtype, non_blocking))
                        or ORIGINAL_COPY(self, src, non_blocking))
    host = HostCopy("cpu")
    src = torch.rand(2, 3, 4)
    out = host.take(src, torch.float16)
    assert asked == [False] and seen == [(torch.float16, False)] and not host.staged
    np.testing.assert_array_equal(host.numpy(out), src.half().numpy())


def _old_kept(layers: list[torch.Tensor], rows: list[int], fusions: list[str], half: bool) -> tuple[Any, Any]:
    """What the streamed export kept before `HostCopy`: each layer on the host as float32, rows indexed and
    heads fused there (`fuse_heads`)."""
    a = np.stack([t.float().numpy() for t in layers], axis=1)    # (B, L, H, T, T)
    kept_rows = a[:, :, :, rows].astype(np.float16 if half else np.float32)
    fused = {f: np.stack([[fuse_heads(a[b, i], f) for i in range(a.shape[1])] for b in range(a.shape[0])])
             for f in fusions}
    return kept_rows, fused


@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("simulated", [False, True])
@pytest.mark.parametrize("asked", ["cls,token:5,rollout", "rollout"])
def test_streamed_export_keeps_what_it_kept_on_the_host(tiny: Any, half: bool, simulated: bool, asked: str,
                                                        request: pytest.FixtureRequest) -> None:
    """`Kept` takes rows and fuses heads on the device and moves only them: the same bits as the host-side
    indexing and `fuse_heads`, for every fusion."""
    dev = request.getfixturevalue("device") if simulated else None
    heads, tokens = 12, tiny.spec.num_tokens   # 12 heads: a sum whose order matters in the last bit
    gen = torch.Generator().manual_seed(6)
    spec = SimpleNamespace(num_tokens=tokens, depth=3, num_heads=heads, num_prefix=1, cls_token=True)
    maps = parse_maps(asked)
    rows = [0, 5] if "cls" in asked else []
    maps += [m for f in ("max", "min") for m in with_rollout(maps, RolloutParams(fusion=f)) if m.kind == "rollout"]
    kept = pipeline.Kept(spec, SimpleNamespace(maps=maps, half=half), 2, "cpu")  # type: ignore[arg-type]
    layers = [torch.softmax(torch.randn(2, heads, tokens, tokens, generator=gen), -1) for _ in range(3)]
    for layer in layers:
        kept.append(layer)
    if dev is not None:   # rows (when there are any) and three fusions per layer, through two staging buffers
        moved = 3 + bool(rows)
        assert dev.pending and dev.pinned.count(False) == 4 and all(nb for _s, _d, nb in dev.copies)
        # the staging buffers are reused: made once each, and once more larger when a fusion follows the rows
        assert len(dev.copies) == moved * 3 and STAGES <= dev.pinned.count(True) <= 2 * STAGES
    kept.check()
    kept_rows, fused = _old_kept(layers, rows, ["max", "mean", "min"], half)
    np.testing.assert_array_equal(kept.rows_of, kept_rows)
    assert sorted(kept.fused) == ["max", "mean", "min"]
    for f, stack in fused.items():
        np.testing.assert_array_equal(kept.fused[f], stack)


@pytest.mark.parametrize("half", [False, True])
def test_windowed_capture_through_the_device_path(device: Device, half: bool) -> None:
    """A windowed (Swin) capture moves each block through the same helper: the same maps as on the host."""
    from _windowed import model_of, swin_spec

    model = model_of(swin_spec())
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(7))
    with pytest.MonkeyPatch.context() as plain:   # the reference: the host path, the simulation undone
        plain.setattr(runtime, "device_memory", lambda _d: False)
        ref, _, _ = model.forward_captured(x, half=half)
    device.log.clear(), device.copies.clear(), device.pinned.clear(), device.direct.clear()
    maps, _, _ = model.forward_captured(x, half=half)
    assert len(maps) == len(ref) == len(device.copies) == device.pinned.count(False) and device.direct == []
    wanted = torch.float16 if half else torch.float32
    assert all(s == d == wanted and nb for s, d, nb in device.copies)
    assert "sync" in device.log[: device.log.index("read")]
    for a, b in zip(maps, ref):
        np.testing.assert_array_equal(a, b)


def test_the_old_path_stays_as_a_switch(tiny: Any, device: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """VITVIZ_PINNED=0 (only to measure against): pageable buffers, synchronous copies casting on the host."""
    monkeypatch.setenv("VITVIZ_PINNED", "0")
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    maps, _ = tiny.forward_captured(x, half=True)
    np.testing.assert_array_equal(maps, hooked(tiny, x).half().numpy())
    assert device.pinned == [False] and "sync" not in device.log and device.copies == []
    assert device.direct == [(torch.float32, torch.float16, False)] * DEPTH


def _pictures(out: Path) -> dict[Path, np.ndarray]:
    from PIL import Image

    return {p.relative_to(out): np.asarray(Image.open(p)) for p in sorted(out.rglob("*.png"))}


@pytest.mark.parametrize("maps", ["cls,token:5,rollout", "cls,rollout"])
def test_an_export_through_the_device_path_writes_the_same_pictures(tmp_path: Path, maps: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`vitviz export` end to end (streamed with a rollout; with .npz the whole stack is captured), batches of 2:
    the simulated device path writes the host path's PNGs and .npz arrays."""
    from PIL import Image

    from vitviz.cli import main as vitviz_main

    ckpt = write_tiny_checkpoint(tmp_path / "m.pth", depth=DEPTH)
    rng = np.random.default_rng(0)
    images = []
    for i in range(3):
        images.append(str(tmp_path / f"{i}.png"))
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(images[-1])

    def export(out: Path, *extra: str) -> None:
        assert vitviz_main(["export", "--model", str(ckpt), "--heads", "2", *images, "--out", str(out), "--quiet",
                            "--no-verify", "--maps", maps, "--workers", "1", "--batch-size", "2", *extra]) == 0

    for extra in ((), ("--npz",)):
        name = "npz" if extra else "streamed"
        export(tmp_path / f"host-{name}", *extra)
        with monkeypatch.context() as patch:
            dev = simulated(patch)   # the simulated device, for this export only
            export(tmp_path / f"device-{name}", *extra)
            assert dev.copies and all(nb for _s, _d, nb in dev.copies) and not dev.pending
        host, moved = _pictures(tmp_path / f"host-{name}"), _pictures(tmp_path / f"device-{name}")
        assert host and host.keys() == moved.keys()
        for key, picture in host.items():
            np.testing.assert_array_equal(moved[key], picture, err_msg=str(key))
        for f in sorted((tmp_path / f"host-{name}").rglob("*.npz")):
            with np.load(f) as a, np.load(tmp_path / f"device-{name}" / f.relative_to(tmp_path / f"host-{name}")) as b:
                np.testing.assert_array_equal(a["attentions"], b["attentions"])
