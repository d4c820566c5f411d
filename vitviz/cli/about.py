"""`vitviz --help` (the commands, one line and an example each) and `vitviz --info` (versions, devices and the
files vitviz reads and writes: what a bug report needs, as `napari --info` gives it).

The full list of the window's options stays one flag away (`vitviz --help-all`): the top-level help is the map
of the program, not of one of its commands.
"""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

# (command, what it does, an example): the top-level help's table
COMMANDS = (
    ("(none)", "open the window, optionally with images and a model", "vitviz cat.jpg --model vit_b_16.pth"),
    ("info", "describe a model: shapes, heads, every setting and where it came from",
     "vitviz info hf:facebook/dinov2-small"),
    ("export", "write attention maps (PNG) or arrays (.npz) for many images",
     "vitviz export photos/ --model timm:vit_small_patch16_224.augreg_in21k --out maps/"),
    ("models", "list the checkpoints on this computer; download a model by name",
     "vitviz models --get torchvision:vit_b_16"),
    ("verify", "compare the converted model with its original implementation",
     "vitviz verify timm:vit_small_patch16_224.augreg_in21k"),
)


def top_help() -> str:
    """What `vitviz --help` prints."""
    rows = []
    for name, what, example in COMMANDS:
        rows.append(f"  {name:<8} {what}\n  {'':<8}   {example}")
    return "\n".join([
        "usage: vitviz [IMAGE ...] [--model MODEL] [window options]",
        "       vitviz COMMAND [options]        (vitviz COMMAND --help: its options)",
        "",
        "See what a Vision Transformer attends to.",
        "",
        "commands:",
        *rows,
        "",
        "MODEL is a weights file, a model folder, or a name: hf:ORG/NAME[@REVISION], timm:NAME[.TAG],",
        "torchvision:ARCH[:WEIGHTS] (downloaded into its cache unless it is there; HF_HUB_OFFLINE=1: cache only).",
        "",
        "options:",
        "  -h, --help     this summary",
        "  --help-all     every option of the window",
        "  --version      vitviz's version",
        "  --info         versions, devices and the files vitviz uses (for bug reports)",
        "  -q, -v         quieter / the libraries' own messages too (every command)",
        "",
        "Files and environment variables (VITVIZ_SETTINGS, VITVIZ_ANSWERS, VITVIZ_CACHE, ...): README,",
        "\"Environment and files\".",
    ])


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def info_lines() -> list[str]:
    """`vitviz --info`: one 'name: value' line per fact. Imports torch and Qt's core module (no window)."""
    from vitviz import __version__
    from vitviz.catalog.answers import answers_path
    from vitviz.catalog.dirs import hf_hub_dir, torch_hub_dir
    from vitviz.catalog.hub import hub_offline
    from vitviz.core.files import cache_dir

    lines = [f"vitviz: {__version__}", f"Platform: {platform.platform()}",
             f"Python: {platform.python_version()} ({sys.executable})"]
    try:
        import torch

        lines.append(f"torch: {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})")
        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            lines.append(f"CUDA devices: {len(names)}: {', '.join(names)}")
        else:
            lines.append("CUDA devices: none available (the CPU is used)")
    except ImportError as e:   # a broken install is what a bug report is for
        lines.append(f"torch: cannot be imported ({e})")
    try:
        import PySide6
        from PySide6 import QtCore

        lines.append(f"Qt: {QtCore.qVersion()} (PySide6 {PySide6.__version__})")
        settings = QtCore.QSettings(QtCore.QSettings.Format.IniFormat, QtCore.QSettings.Scope.UserScope,
                                    "vitviz", "vitviz").fileName()
    except ImportError as e:
        lines.append(f"Qt: cannot be imported ({e})")
        settings = "(Qt missing)"
    for dist in ("torchvision", "numpy", "pyqtgraph", "huggingface_hub", "safetensors", "pillow", "timm",
                 "transformers", "open_clip_torch", "ray"):
        lines.append(f"{dist}: {_version(dist)}")
    lines += [
        f"Settings (window): {os.environ.get('VITVIZ_SETTINGS') or settings}"
        + (" (VITVIZ_SETTINGS)" if os.environ.get("VITVIZ_SETTINGS") else ""),
        f"Answers (remembered per file): {answers_path()}",
        f"Cache (verdicts, shape signatures): {cache_dir()}",
        f"Torch hub cache (torchvision: names): {torch_hub_dir()}",
        f"Hugging Face cache (hf:/timm: names): {hf_hub_dir()}"
        + (" (offline: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)" if hub_offline() else ""),
    ]
    return lines
