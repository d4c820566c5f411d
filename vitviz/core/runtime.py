"""Where a model runs and what it may take: devices, and the memory checks that turn an allocation failure into
a clear message before anything runs."""
from __future__ import annotations

from pathlib import Path

import torch

from vitviz.core.packed import Linear
from vitviz.errors import DeviceError

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


def check_host_memory(needed: int, x: torch.Tensor, half: bool) -> None:
    """Refuse, before running, a capture whose attention maps alone would not fit in the memory left."""
    free = available_memory()
    if free is not None and needed > free:
        raise DeviceError(f"the attention maps of input {tuple(x.shape)} need {needed / 2**30:.1f} GiB "
                          f"({'float16' if half else 'float32'}) but only {free / 2**30:.1f} GiB of memory is "
                          f"available; {SMALLER}")


def available_devices() -> list[str]:
    """Devices a model can run on here: 'cpu', plus 'cuda' (or 'cuda:N') when available."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        devices += ["cuda"] if n == 1 else [f"cuda:{i}" for i in range(n)]
    return devices


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
