"""The ViT checkpoints already on this computer, and named models that resolve to a cached or downloaded file.

Qt-free. Scanning reads directory listings and small JSON files only; torch (through torchvision's weights
tables) is imported only when a torch-hub file is named like a torchvision ViT, or a named model is resolved,
so call `scan` from a worker thread when the window must not stall.

    entries = scan(recent=["~/runs/vit.pth"])          # torch hub cache, HF hub cache, recent files
    entries.skipped                                    # folders and files that could not be read (listed, not raised)
    path = resolve_named("torchvision:vit_b_16")       # cached file, else downloaded with progress
    model = vitviz.load(path)

Named models are `torchvision:ARCH[:WEIGHTS]`, ARCH one of torchvision's ViTs (vit_b_16, vit_b_32, vit_l_16,
vit_l_32, vit_h_14) and WEIGHTS a member of its Weights enum (IMAGENET1K_V1, IMAGENET1K_SWAG_E2E_V1, ...;
default DEFAULT). The file keeps torchvision's name, so `vitviz.load` reads the preprocessing and categories
from it, and it lands in the torch hub cache where torchvision itself would look.

This module scans the caches; it re-exports the cache locations (`vitviz.catalog.dirs`), the named models and
their downloads (`vitviz.catalog.named`) and, lazily, the `vitviz models` command (`vitviz.cli.models`), so
everything stays importable from here.
"""
from vitviz.catalog.dirs import hf_hub_dir, torch_hub_dir
from vitviz.catalog.named import (NAMED_PREFIX, TORCHVISION_ARCHS, DownloadError, NamedWeights, Progress,
                                  cached_named, check_model_name, is_named_model, lookup_named, named_models,
                                  resolve_model_arg, resolve_named)
from vitviz.catalog.scan import (CatalogEntry, ScanResult, Skipped, format_size,
                                 guess_family_from_name, scan, scan_hf_hub, scan_recent, scan_torch_hub)

__all__ = [
    "CatalogEntry", "DownloadError", "NAMED_PREFIX", "NamedWeights", "Progress",
    "ScanResult", "Skipped", "TORCHVISION_ARCHS", "cached_named", "check_model_name", "format_size", "guess_family_from_name",
    "hf_hub_dir", "is_named_model", "lookup_named", "named_models", "resolve_model_arg", "resolve_named", "scan",
    "scan_hf_hub", "scan_recent", "scan_torch_hub", "torch_hub_dir"]
