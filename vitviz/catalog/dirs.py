"""Where the torch hub and Hugging Face hub caches are, by the same environment rules as those libraries.

Qt-free and torch-free; shared by the cache scan (`vitviz.catalog.scan`) and named-model downloads
(`vitviz.catalog.named`).
"""
from __future__ import annotations

import os
from pathlib import Path


def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()


def torch_hub_dir() -> Path:
    """Where torch hub keeps downloaded weights: `$TORCH_HOME/hub/checkpoints` (torch.hub's own rule)."""
    home = os.environ.get("TORCH_HOME")
    root = Path(home).expanduser() if home else _cache_home() / "torch"
    return root / "hub" / "checkpoints"


def hf_hub_dir() -> Path:
    """The Hugging Face hub cache by huggingface_hub's rules (`huggingface_hub.constants`, which reads them once at
    import; here at each call, so a changed environment counts, without importing it): `$HF_HUB_CACHE`, else the
    legacy `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub` or
    ~/.cache/huggingface/hub; '~' and $VARIABLES in them expanded."""
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(os.path.expandvars(os.path.expanduser(cache)))
    home = os.environ.get("HF_HOME")
    return (Path(os.path.expandvars(os.path.expanduser(home))) if home else _cache_home() / "huggingface") / "hub"
