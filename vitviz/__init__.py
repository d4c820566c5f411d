"""vitviz: see what a Vision Transformer attends to.

The public API is small::

    import vitviz
    model = vitviz.load("vit_b_16.pth")     # overrides: heads=, family=, image_size=, device=, eps=, mean=, std=
    model = vitviz.load("hf:facebook/dinov2-small")   # names as the commands take them (timm:, torchvision: too)
    result = model.run("cat.jpg")           # a path, PIL image, HxWxC array or a (1, C, H, W) tensor
    result.attentions.shape                 # (L, H, T, T)
    vitviz.show(result)                     # a PIL image: the CLS map over the image (also a result's notebook view)
    vitviz.verify(model).summary()          # 'Verified against timm 1.0.31 (max 3e-7)' / 'Not verified — 3 ...'

`vitviz.load` imports torch on first use, so importing this package stays cheap (the GUI relies on that).
"""
from __future__ import annotations

import sys
from typing import Any

from vitviz.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    DeviceError,
    ImageError,
    InconsistentCheckpointError,
    NoWeightsError,
    UnknownLayoutError,
    UnsafeCheckpointError,
    VitvizError,
)

__version__ = "0.1.0"

__all__ = [
    "load", "VitvizError", "CheckpointError", "CheckpointNotFoundError", "CorruptCheckpointError",
    "DeviceError", "ImageError", "InconsistentCheckpointError", "NoWeightsError", "UnknownLayoutError",
    "UnsafeCheckpointError", "__version__", "show", "verify", "compare",
]


def load(path: Any, *, progress: Any = None, offline: bool | None = None, **overrides: Any) -> Any:
    """Load a ViT checkpoint into a `vitviz.core.running.capture.VitModel`: a file, a folder, a state dict, or a name the
    command line takes -- `hf:ORG/NAME[@REVISION]`, `timm:NAME[.TAG]`, `torchvision:ARCH[:WEIGHTS]`.

    A name is resolved as the commands resolve it (`vitviz.catalog.named.resolve_model_arg`): the cached files,
    else downloaded (huggingface_hub's cache for hub names, torch hub's for torchvision's).

    Args:
        progress: for a name, called as progress(done_bytes, total_bytes_or_None) while it downloads; an
            exception it raises cancels the download.
        offline: for a name, use only the cache (default: `$HF_HUB_OFFLINE` for hub names).
        overrides: heads=, family=, image_size=, device=, eps=, mean=, std= ... (`vitviz.core.running.load.load`).
    """
    if isinstance(path, str):
        from vitviz.catalog.named import is_named_model, resolve_model_arg

        if is_named_model(path.strip()):
            path = resolve_model_arg(path.strip(), progress=progress, offline=offline)
    from vitviz.core.running.load import load as _load
    import vitviz.core.drawing.show  # noqa: F401 -- gives every result kind its notebook picture (_repr_png_)

    return _load(path, **overrides)


def compare(a: Any, b: Any, images: Any, **options: Any) -> Any:
    """Compare two loaded models on the same images (`vitviz.core.analyses.compare.compare`): per layer their maps, A − B,
    the head matching, mean Jensen–Shannon divergence and linear CKA against relative depth."""
    from vitviz.core.analyses.compare import compare as _compare

    return _compare(a, b, images, **options)


def verify(model: Any, **options: Any) -> Any:
    """Check a loaded model against its original implementation (`vitviz.core.analyses.verify.verify`): the library that
    made it (timm, transformers, open_clip, torchvision), or the user's own code with `code='FILE.py:FACTORY'`, run
    on a probe input at the model's size and another; a `Verification` whose `verdict` is 'verified', 'unverified'
    (nothing names the model, or its library is missing: its assumptions are listed) or 'differs'.

    It lives here, not as a method of the model, because it loads the original through `vitviz.core.running.load`, which
    builds the model classes: a method would be an import cycle (tests/package/test_layering.py)."""
    from vitviz.core.analyses.verify import verify as _verify

    check = _verify(model, **options)
    try:
        model.verification = check   # what the model's repr says ('verified' / 'differs')
    except AttributeError:   # an object that takes no attributes: the verdict is still returned
        pass
    return check


def show(result: Any, map: str = "cls", layer: Any = -1, head: Any = "mean", **options: Any) -> Any:  # noqa: A002
    """A result's map drawn over the image the model saw, as a PIL image (`vitviz.core.drawing.show.show`).

    `map` is any map `vitviz export --maps` knows ('cls', 'mean', 'max', 'rollout', 'token:N'), `layer` an index
    or 'mean', `head` an index, 'mean' or 'max'; `options` are `RenderOptions` fields (cmap, opacity, style...).
    """
    from vitviz.core.drawing.show import show as _show

    return _show(result, map, layer, head, **options)


def _png(result: Any) -> bytes:
    from vitviz.core.drawing.show import png_bytes

    return png_bytes(result)


def _register_notebook_display() -> None:
    """In IPython/Jupyter, show an `AttentionResult` as its picture (registered by name: nothing is imported)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None:
        return
    formatter = shell.display_formatter.formatters["image/png"]
    formatter.for_type_by_name("vitviz.core.spec", "AttentionResult", _png)


_register_notebook_display()
