"""Where a model runs and what it may take: devices, and the memory checks that turn an allocation failure into
a clear message before anything runs."""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vitviz.core.running.packed import Linear
from vitviz.errors import DeviceError

if TYPE_CHECKING:
    from vitviz.core.spec import ModelSpec

SMALLER = "try a smaller image size, fewer images per batch or half=True (float16 maps; --half in export)"


def packing_fits(net: torch.nn.Module) -> bool:
    """Packed copies of the Linear weights double their memory: only when that takes under a quarter of what is
    left."""
    need = sum(m.weight.numel() * 4 for m in net.modules() if isinstance(m, Linear))
    free = available_memory()
    return free is None or need < free // 4


def available_memory() -> int | None:
    """Bytes of memory this process can still get: Linux MemAvailable, or less when a container (cgroup v2)
    limit leaves less; None where that is unknown."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text().strip()))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def format_bytes(n: float) -> str:
    """'1.5 GiB', '12.0 MiB', '512 bytes'."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


# Allocations below this are not checked against the memory left: the estimate of what is left is coarser than that.
CHECK_FROM = 64 << 20


def check_model_memory(nbytes: int, device: torch.device, where: str) -> None:
    """Refuse, before building, a model whose weights would not fit: it is built in host memory (beside the
    tensors read from the file) and then moved to `device`, whose free memory is checked too for CUDA."""
    if nbytes < CHECK_FROM:
        return
    free = available_memory()
    if free is not None and nbytes > free:
        raise DeviceError(f"{where}: building the model needs {format_bytes(nbytes)} for its weights, but only "
                          f"{format_bytes(free)} of memory is available; nothing was allocated")
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            cuda_free, _total = torch.cuda.mem_get_info(device)
        except RuntimeError:
            return
        if nbytes > cuda_free:
            raise DeviceError(f"{where}: the model's weights need {format_bytes(nbytes)} but {device} has only "
                              f"{format_bytes(cuda_free)} free; try device='cpu' or a smaller model")


def check_input_size(spec: "ModelSpec", where: str) -> None:
    """Refuse an input size whose attention cannot be computed here: one layer's attention matrix (heads x tokens
    x tokens, float32) exists during every forward pass, whatever the capture keeps, so it must fit."""
    tokens = spec.num_tokens
    needed = spec.num_heads * tokens * tokens * 4
    free = available_memory() if needed >= CHECK_FROM else None
    if free is not None and needed > free:
        h, w = spec.image_size
        raise DeviceError(f"{where}: image_size {h}x{w} gives {tokens:,} tokens; one layer's attention "
                          f"({spec.num_heads} heads x {tokens:,} x {tokens:,}, float32) needs {format_bytes(needed)} "
                          f"but only {format_bytes(free)} of memory is available; expected a smaller image_size")


def check_image_memory(needed: int, name: str, size: tuple[int, int]) -> None:
    """Refuse, before Pillow allocates it, a resized image that would not fit in the memory left."""
    free = available_memory()
    if free is not None and needed > free:
        raise DeviceError(f"{name}: resizing to {size[0]}x{size[1]} px needs {format_bytes(needed)} but only "
                          f"{format_bytes(free)} of memory is available; expected a smaller input size")


def check_host_memory(needed: int, x: torch.Tensor, half: bool) -> None:
    """Refuse, before running, a capture whose attention maps alone would not fit in the memory left."""
    free = available_memory()
    if free is not None and needed > free:
        raise DeviceError(f"the attention maps of input {tuple(x.shape)} need {needed / 2**30:.1f} GiB "
                          f"({'float16' if half else 'float32'}) but only {free / 2**30:.1f} GiB of memory is "
                          f"available; {SMALLER}")


def device_memory(device: torch.device) -> bool:
    """Whether tensors on `device` live outside host memory (CUDA), so that their copies to the host go through
    pinned buffers, asynchronously (`HostCopy`); on the CPU a copy is a plain memory copy."""
    return device.type == "cuda"


def _host_empty(shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """An uninitialised host tensor, page-locked when `pinned` (pinning needs a CUDA device)."""
    return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=pinned)


def _copy_event(device: torch.device) -> Any:
    """A CUDA event recorded on `device`'s current stream now, after the copies just queued there."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


STAGES = 2   # pinned staging buffers a capture copies through in turn: one layer lands while the next one moves


class HostCopy:
    """Moves tensors from the model's device into host memory: the one way maps leave the device.

    On a CUDA device each copy is queued asynchronously (`non_blocking=True`) into a pinned staging buffer -- after
    a narrowing cast (float32 -> float16) on the device, so half the bytes cross the bus -- and lands in its host
    array (ordinary memory, exactly its size) when that buffer is next needed or at `wait`, after the event
    recorded behind the copy has completed. The STAGES staging buffers are made once per capture (pinned memory
    comes from torch's caching host allocator, so later captures reuse them) and are one layer each: pinning the
    whole array instead would hold the maps in page-locked memory rounded up to a power of two and cached by torch
    after they are freed (up to 2x their size). A host array is read only after `wait` (`numpy` waits first), so
    nothing sees an array before its copies are done.

    The source of a queued copy need not be kept alive by us: the copy is queued on the current stream, and the
    caching allocator hands a freed block (the layer's probabilities, the float16 cast) only to later work on that
    same stream, which runs after the copy; every capture runs on the current stream (no side streams).

    On the CPU the same calls run: nothing is staged (pinning needs a device), copies are synchronous and `wait`
    has nothing to wait for, so the tests on the CPU run this code. `VITVIZ_PINNED=0` keeps the path before issue
    36 on a device -- synchronous copies into the array, cast on the host -- only to measure against
    (`scripts/gpu_check.py`, `bench/capture.py --only transfer`).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.staged = device_memory(self.device) and os.environ.get("VITVIZ_PINNED", "1") != "0"
        self._cast_here = self.staged or not device_memory(self.device)   # where a narrowing cast runs: `copy`
        self._stages: list[torch.Tensor | None] = [None] * STAGES         # flat pinned bytes, grown when needed
        self._queued: list[tuple[Any, torch.Tensor, torch.Tensor] | None] = [None] * STAGES  # (event, stage, array)
        self._turn = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host array for copies from this device; read it only after `wait` (or through `numpy`)."""
        return _host_empty(tuple(shape), dtype, False)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy `src` (on the device) into host array `dst`: queued on a device, done on the CPU. A narrowing cast
        (float32 -> float16) runs on the device before the copy, a widening one on the way."""
        if self._cast_here and src.dtype != dst.dtype and dst.element_size() < src.element_size():
            src = src.to(dst.dtype)
        if not self.staged or dst.numel() == 0:
            dst.copy_(src)
            return
        turn, self._turn = self._turn, (self._turn + 1) % STAGES
        self._land(turn)   # this buffer's previous copy into its array, before the buffer is used again
        stage = self._stage(turn, dst.numel() * dst.element_size()).view(dst.dtype).view(dst.shape)
        stage.copy_(src, non_blocking=True)
        self._queued[turn] = (_copy_event(self.device), stage, dst)

    def _stage(self, turn: int, nbytes: int) -> torch.Tensor:
        """Staging buffer `turn`, at least `nbytes` long (made, or made larger, only when it is too short)."""
        stage = self._stages[turn]
        if stage is None or stage.numel() < nbytes:
            stage = self._stages[turn] = _host_empty((nbytes,), torch.uint8, True)
        return stage[:nbytes]

    def _land(self, turn: int) -> None:
        """Wait for the copy queued in staging buffer `turn` (if any) and move it into its host array."""
        queued = self._queued[turn]
        if queued is not None:
            event, stage, dst = queued
            event.synchronize()
            with torch.inference_mode():   # an array made in a capture's inference mode, landed after it
                dst.copy_(stage)
            self._queued[turn] = None

    def take(self, src: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new host array holding `src` (as `dtype`, default its own) once `wait` returns."""
        dst = self.empty(tuple(src.shape), dtype or src.dtype)
        self.copy(dst, src)
        return dst

    def wait(self) -> None:
        """Block until every copy queued so far is in its host array (oldest first); the staging buffers go back
        to torch's cache when this object does."""
        for i in range(STAGES):
            self._land((self._turn + i) % STAGES)

    def numpy(self, host: torch.Tensor) -> np.ndarray:
        """`host` (an array of this object's copies) as NumPy, after waiting for the copies into it."""
        self.wait()
        return host.numpy()


def available_devices() -> list[str]:
    """Devices a model can run on here: 'cpu', plus 'cuda' (or 'cuda:N') when available."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        devices += ["cuda"] if n == 1 else [f"cuda:{i}" for i in range(n)]
    return devices


def move_module(net: torch.nn.Module, device: str | None, current: torch.device, refusal: str) -> torch.device:
    """Move `net` to `device` (`resolve_device`) and return where it is now; out of memory there, it goes back to
    `current` and DeviceError says '{refusal} on {device} (...); use device='cpu''."""
    dev = resolve_device(device)
    try:
        net.to(dev)
    except torch.cuda.OutOfMemoryError as e:
        net.to(current)
        torch.cuda.empty_cache()
        raise DeviceError(f"{refusal} on {dev} ({e}); use device='cpu'") from e
    return dev


def resolve_device(device: str | None) -> torch.device:
    """'auto'/None -> CUDA when available, else CPU; a requested but missing CUDA raises DeviceError."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"unknown device {device!r}; expected auto, cpu, cuda or cuda:N "
                          f"(available here: {', '.join(available_devices())})") from e
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"device {device!r} is not supported; expected auto, cpu, cuda or cuda:N "
                          f"(available here: {', '.join(available_devices())})")
    if dev.type == "cuda" and dev.index is not None and torch.cuda.is_available() \
            and dev.index >= torch.cuda.device_count():
        raise DeviceError(f"device {device!r} requested, but there are {torch.cuda.device_count()} CUDA devices "
                          f"(available: {', '.join(available_devices())})")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {device!r} requested, but CUDA is not available here "
                          f"(available: {', '.join(available_devices())})")
    return dev
