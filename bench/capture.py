"""Benchmark: the cost of capturing every layer's attention, side by side with the tools users would pick.

Run from the repository root: `python bench/capture.py [--repeats N] [--device cpu]`.

ViT-B/16 at 224 px, random weights, one image, medians of repeats interleaving all nine methods:
- vitviz `model.run(x)` (full capture: 12 x (1, 12, 197, 197) float32 as NumPy, logits, input, display image)
  vs torchvision's own `vit_b_16` forward on the same weights and input. Target <= 1.10x.
- vitviz `model.run(x, logits=False)` on a timm checkpoint vs timm's `AttentionExtract` (fx) on the same timm
  model with fused attention off (the only way timm exposes attention). Both stop after the last softmax (fx prunes
  the graph there). Target: faster. `model.run(x)` with logits is shown too.
- Where the time goes: the reference model's forward without hooks, `forward_captured`, and `run`.
On the CPU vitviz runs its Linear layers with weights prepacked for oneDNN (vitviz.core.running.packed), the main
reason it is faster; `VITVIZ_PACKED=0 python bench/capture.py` measures the plain-F.linear reference model.
- Rollout at T = 577 (ViT-B/16 at 384 px): vitviz's row-vector rollout vs the naive matrix chain.
- The live-module path (vitviz.core.running.live): a ViT-B/16-sized vit-pytorch `ViT` run as written with every layer's
  attention captured (its own softmax, through a TorchFunctionMode) vs that module's own forward, interleaved in a
  group of their own. Target <= 1.15x. `--only live` runs just this part
  (`--only` takes a comma-separated list: core, live, families, windowed, swin, sam).
- The 2026 families (`--only families` runs just this part): an EVA-02-B/14 (RoPE, SwiGLU, sub-LN) and a
  SigLIP-B/16 (MAP head, whose attention is captured too) with random weights, saved as timm hub folders, loaded by
  vitviz: `model.run(x)` vs timm's own forward with fused attention off, same input, interleaved per model.
  Target <= 1.10x.
- Windowed models (`--only windowed`, or `--only swin` / `--only sam` for one row): a Swin-T (torchvision `swin_t`, random weights, saved as
  a state dict) at 224 px and a SAM ViT-B image encoder (timm `samvit_base_patch16`, random weights, a hub folder)
  at --sam-size px (1024: SAM's own, 4 global blocks of 4096 tokens), loaded by vitviz: `model.run(x)` (every
  block's (windows, heads, n, n) attention as NumPy) vs the original's own eager forward, same input, interleaved
  per model. Target <= 1.10x.
- Moving maps off a CUDA device (`--only transfer`; part of the default run when CUDA is there): one layer's
  (1, H, T, T) float32 attention of ViT-B/16 @224 and ViT-L/14 @518 copied to the host as vitviz's `HostCopy`
  does it (an asynchronous copy through a pinned staging buffer, one wait; float16 cast on the device first) vs
  the old way (a synchronous copy, the cast on the host: `VITVIZ_PINNED=0`) and a pinned buffer reused (the bound),
  interleaved; GB/s of the bytes kept. Without CUDA it says so and measures nothing.
"""
from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch

from common import interleaved, ratio_line, timm_vit_b16, torchvision_vit_b16  # noqa: I001
from rollout import time_rollout

import vitviz


def torchvision_methods(folder: Path, x: torch.Tensor, device: str) -> dict[str, Callable[[], object]]:
    """The torchvision side, checked to agree with vitviz first."""
    tv, path = torchvision_vit_b16(folder)
    tv = tv.to(device)
    model = vitviz.load(path, device=device)
    xd = x.to(device)
    with torch.inference_mode():
        ref = tv(xd)
    got = model.run(x)
    assert torch.allclose(torch.from_numpy(got.logits), ref[0].float().cpu(), atol=1e-3), "vitviz != torchvision"

    def tv_forward() -> None:
        with torch.inference_mode():
            tv(xd)
        _sync(device)

    def net_only() -> None:
        with torch.inference_mode():
            model.net(xd)
        _sync(device)

    return {"torchvision forward": tv_forward, "vitviz net (no hooks)": net_only,
            "vitviz forward_captured": lambda: model.forward_captured(x), "vitviz run": lambda: model.run(x)}


def timm_methods(folder: Path, x: torch.Tensor, device: str) -> dict[str, Callable[[], object]]:
    """The timm side (fused attention off), checked to agree with vitviz first."""
    from timm.utils import AttentionExtract

    tm, path = timm_vit_b16(folder)
    tm = tm.to(device)
    model = vitviz.load(path, device=device)
    extract = AttentionExtract(tm, method="fx")
    hooked = AttentionExtract(tm, method="hook")  # the full forward, attention read at attn_drop
    xd = x.to(device)
    with torch.inference_mode():
        maps = extract(xd)
    got = model.run(x)
    first = next(iter(maps.values()))[0].float().cpu()
    assert torch.allclose(torch.from_numpy(got.attentions[0]), first, atol=1e-4), "vitviz != timm attention"

    def timm_extract() -> None:
        with torch.inference_mode():
            extract(xd)
        _sync(device)

    def timm_extract_hook() -> None:
        with torch.inference_mode():
            hooked(xd)
        _sync(device)

    def timm_forward() -> None:
        with torch.inference_mode():
            tm(xd)
        _sync(device)

    return {"timm AttentionExtract": timm_extract, "timm AttentionExtract (hook)": timm_extract_hook,
            "timm forward (unfused)": timm_forward,
            "vitviz run (timm file)": lambda: model.run(x),
            "vitviz run, logits=False": lambda: model.run(x, logits=False)}


def live_methods(x: torch.Tensor, device: str) -> dict[str, Callable[[], object]]:
    """The live path on a ViT-B/16-sized vit-pytorch ViT (random weights), checked to agree with its forward."""
    from vit_pytorch import ViT

    from vitviz.core.spec import GuessWarning

    torch.manual_seed(0)
    net = ViT(image_size=224, patch_size=16, num_classes=1000, dim=768, depth=12, heads=12, mlp_dim=3072,
              dim_head=64).eval().to(device)
    with warnings.catch_warnings():  # random weights: its preprocessing and 1000 labels are guesses, and say so
        warnings.simplefilter("ignore", GuessWarning)
        model = vitviz.load(net, live=True, device=device)
    xd = x.to(device)
    with torch.inference_mode():
        ref = net(xd)
    attn, out = model.forward_captured(x)
    assert attn.shape == (1, 12, 12, 197, 197) and torch.equal(torch.from_numpy(out), ref.float().cpu()), \
        "live capture != the module's own forward"

    def own_forward() -> None:
        with torch.inference_mode():
            net(xd)
        _sync(device)

    return {"vit-pytorch forward": own_forward, "live forward_captured": lambda: model.forward_captured(x),
            "live run": lambda: model.run(x)}


FAMILY_MODELS = (("EVA-02-B/14", "eva02_base_patch14_224"), ("SigLIP-B/16", "vit_base_patch16_siglip_224"))


def family_methods(folder: Path, arch: str, x: torch.Tensor, device: str) -> dict[str, Callable[[], object]]:
    """timm's own unfused forward and vitviz's capture of the same random model (a timm hub folder)."""
    import timm

    torch.manual_seed(0)
    tm = timm.create_model(arch, pretrained=False).eval()
    for block in tm.blocks:
        block.attn.fused_attn = False
    if getattr(tm, "attn_pool", None) is not None:
        tm.attn_pool.fused_attn = False
    timm.models._hub.save_for_hf(tm, str(folder / arch), safe_serialization=True)
    model = vitviz.load(folder / arch, device=device)
    return _checked_pair(tm, model, x, device, f"timm ({arch})", "timm forward (unfused)")


def _checked_pair(original: torch.nn.Module, model: object, x: torch.Tensor, device: str, label: str,
                  name: str) -> dict[str, Callable[[], object]]:
    """`name`: the original's forward, and 'vitviz run': the loaded model's capture, once checked to agree."""
    original = original.to(device)
    xd = x.to(device)
    with torch.inference_mode():
        ref = original(xd)
    got = model.run(x)
    out = got.features if got.features is not None else got.logits
    assert torch.allclose(torch.from_numpy(out), ref[0].float().cpu(), atol=1e-3), f"vitviz != {label}"

    def own_forward() -> None:
        with torch.inference_mode():
            original(xd)
        _sync(device)

    return {name: own_forward, "vitviz run": lambda: model.run(x)}


def _families_report(x: torch.Tensor, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for label, arch in FAMILY_MODELS:
            size = 224
            xs = x if x.shape[-1] == size else torch.randn(1, 3, size, size)
            times = interleaved(family_methods(Path(tmp), arch, xs, args.device), args.repeats)
            tokens = {"eva02_base_patch14_224": 257, "vit_base_patch16_siglip_224": 196}[arch]
            print(f"{label} ({arch}) @{size}, T={tokens}, median of {args.repeats} interleaved repeats:")
            for name, t in times.items():
                print(f"  {name:<28} {t * 1e3:8.1f} ms")
            print(ratio_line(f"{label}: vitviz run / timm forward", times["vitviz run"],
                             times["timm forward (unfused)"], "(target <= 1.10x)"))


def windowed_methods(folder: Path, which: str, size: int, device: str) -> dict[str, Callable[[], object]]:
    """The original's eager forward and vitviz's capture of the same random Swin-T / SAM-B, checked to agree."""
    torch.manual_seed(0)
    if which == "swin":
        from torchvision.models import swin_t

        original = swin_t().eval()
        torch.save(original.state_dict(), folder / "swin_t.pth")
        with warnings.catch_warnings():   # random weights under no release name: its conventions are assumed
            warnings.simplefilter("ignore")
            model = vitviz.load(folder / "swin_t.pth", device=device, image_size=size)
    else:
        import timm

        original = timm.create_model("samvit_base_patch16", pretrained=False, img_size=size).eval()
        for m in original.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = False
        timm.models._hub.save_for_hf(original, str(folder / "sam"), safe_serialization=True)
        model = vitviz.load(folder / "sam", device=device)
    return _checked_pair(original, model, torch.randn(1, 3, size, size), device, f"original ({which})",
                         "original forward (eager)")


WINDOWED_ROWS = {"swin": ("Swin-T (torchvision swin_t)", 224), "sam": ("SAM ViT-B encoder (timm samvit_base_patch16)", 0)}


def _windowed_report(args: argparse.Namespace, rows: tuple[str, ...] = ("swin", "sam")) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for which in rows:
            label, size = WINDOWED_ROWS[which]
            size = size or args.sam_size
            times = interleaved(windowed_methods(Path(tmp), which, size, args.device), args.repeats)
            print(f"{label} @{size}, median of {args.repeats} interleaved repeats:")
            for name, t in times.items():
                print(f"  {name:<28} {t * 1e3:8.1f} ms")
            print(ratio_line(f"{label.split(' (')[0]}: vitviz run / original forward", times["vitviz run"],
                             times["original forward (eager)"], "(target <= 1.10x)"))


def transfer_methods(shape: tuple[int, ...]) -> dict[str, Callable[[], object]]:
    """Copy one (1, H, T, T) layer from cuda to a new host array, float32 and float16: `HostCopy` (asynchronous
    through a pinned staging buffer; 'pinned async') vs the old synchronous pageable copy casting on the host
    (`VITVIZ_PINNED=0`; 'pageable sync'), and, as the bound of what pinning gives, one asynchronous copy straight
    into a pinned buffer kept between runs ('pinned reused': what a pinned array would cost if it were free)."""
    import os

    from vitviz.core.running.runtime import HostCopy

    layer = torch.rand(shape, device="cuda")
    kept = {dtype: torch.empty(shape, dtype=dtype, pin_memory=True) for dtype in (torch.float32, torch.float16)}

    def copy(dtype: torch.dtype, pinned: bool) -> Callable[[], object]:
        def run() -> object:
            os.environ["VITVIZ_PINNED"] = "1" if pinned else "0"
            host = HostCopy("cuda")
            out = host.take(layer, dtype)
            return host.numpy(out)
        return run

    def reused(dtype: torch.dtype) -> Callable[[], object]:
        def run() -> object:
            kept[dtype].copy_(layer.to(dtype), non_blocking=True)
            torch.cuda.current_stream().synchronize()
            return kept[dtype].numpy()
        return run

    methods: dict[str, Callable[[], object]] = {}
    for name, dtype in (("float32", torch.float32), ("float16", torch.float16)):
        methods[f"pinned async {name}"] = copy(dtype, True)
        methods[f"pageable sync {name}"] = copy(dtype, False)
        methods[f"pinned reused {name}"] = reused(dtype)
    return methods


def _transfer_report(args: argparse.Namespace) -> None:
    import os

    if not torch.cuda.is_available():
        print("transfer: no CUDA device here, nothing measured (pinned vs pageable copies need one)")
        return
    before = os.environ.get("VITVIZ_PINNED")
    try:
        for label, shape in (("ViT-B/16 @224", (1, 12, 197, 197)), ("ViT-L/14 @518", (1, 16, 1370, 1370))):
            times = interleaved(transfer_methods(shape), args.repeats)
            print(f"one layer's maps {shape} of {label} to the host, {torch.cuda.get_device_name()}, median of "
                  f"{args.repeats} interleaved repeats:")
            elements = 1
            for n in shape:
                elements *= n
            for name, t in times.items():
                kept = elements * (2 if name.endswith("float16") else 4)
                print(f"  {name:<28} {t * 1e3:8.2f} ms  {kept / t / 1e9:6.1f} GB/s")
            for kind in ("float32", "float16"):
                print(ratio_line(f"  pinned async / pageable sync, {kind}", times[f"pinned async {kind}"],
                                 times[f"pageable sync {kind}"]))
                print(ratio_line(f"  pinned reused / pageable sync, {kind}", times[f"pinned reused {kind}"],
                                 times[f"pageable sync {kind}"]))
    finally:
        if before is None:
            os.environ.pop("VITVIZ_PINNED", None)
        else:
            os.environ["VITVIZ_PINNED"] = before


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rollout-repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--sam-size", type=int, default=1024, help="input size of the SAM encoder row (default "
                        "1024, SAM's own; smaller is quicker on a CPU)")
    parser.add_argument("--only", type=_parts, help="run only these parts, comma-separated: core (the ViT-B/16 "
                        "comparisons and rollout), live, families, windowed (= swin,sam), swin, sam, transfer "
                        "(cuda: pinned vs pageable copies of maps to the host)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    print(f"ViT-B/16 @224, batch 1, {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} interleaved repeats")
    if args.only:
        if "core" in args.only:
            _core_report(x, args)
        if "live" in args.only:
            _live_report(x, args)
        if "families" in args.only:
            _families_report(x, args)
        rows = tuple(r for r in WINDOWED_ROWS if r in args.only)
        if rows:
            _windowed_report(args, rows)
        if "transfer" in args.only:
            _transfer_report(args)
        return
    _core_report(x, args)
    _live_report(x, args)
    _families_report(x, args)
    _windowed_report(args)
    if torch.cuda.is_available():
        _transfer_report(args)


def _parts(text: str) -> set[str]:
    """--only's comma-separated parts ('windowed' is both windowed rows)."""
    known = ("core", "live", "families", "windowed", "transfer", *WINDOWED_ROWS)
    parts = {p.strip() for p in text.split(",") if p.strip()}
    unknown = sorted(parts - set(known))
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(unknown) or '(none)'}; choose from "
                                         f"{', '.join(known)}")
    return parts | (set(WINDOWED_ROWS) if "windowed" in parts else set())


def _core_report(x: torch.Tensor, args: argparse.Namespace) -> None:
    from vitviz.core.running.packed import packing_available

    print(f"vitviz Linear layers prepacked for oneDNN: {packing_available() and args.device == 'cpu'} "
          "(VITVIZ_PACKED=0 to compare without; timm and torchvision run plain nn.Linear)")
    with tempfile.TemporaryDirectory() as tmp:
        methods = {**torchvision_methods(Path(tmp), x, args.device), **timm_methods(Path(tmp), x, args.device)}
        tv = tm = interleaved(methods, args.repeats)  # one group: every method sees the same load
    for name, t in tv.items():
        print(f"  {name:<28} {t * 1e3:8.1f} ms")
    print(ratio_line("vitviz run / torchvision forward", tv["vitviz run"], tv["torchvision forward"], "(target <= 1.10x)"))
    print(ratio_line("  of which: net (no hooks) / torchvision", tv["vitviz net (no hooks)"], tv["torchvision forward"]))
    print(ratio_line("  forward_captured / net (no hooks)", tv["vitviz forward_captured"], tv["vitviz net (no hooks)"]))
    print(ratio_line("  run / forward_captured", tv["vitviz run"], tv["vitviz forward_captured"]))
    print(ratio_line("vitviz run(logits=False) / timm AttentionExtract", tm["vitviz run, logits=False"],
                     tm["timm AttentionExtract"], "(target < 1.00x)"))
    print("  (both stop at the last softmax; vitviz also skips the last block's v projection and returns NumPy)")
    print(ratio_line("vitviz run (with logits) / timm AttentionExtract", tm["vitviz run (timm file)"],
                     tm["timm AttentionExtract"], "(vitviz also runs the last MLP and head)"))
    print(ratio_line("vitviz run / timm AttentionExtract (hook)", tm["vitviz run (timm file)"],
                     tm["timm AttentionExtract (hook)"], "(full forward with logits on both sides)"))
    r = time_rollout(577, repeats=args.rollout_repeats)
    print(f"rollout T=577 (L=12, H=12): vitviz {r['fast_s'] * 1e3:.1f} ms, naive matrix chain "
          f"{r['naive_s'] * 1e3:.1f} ms ({r['ratio']:.1f}x faster, max |diff| {r['max_abs_diff']:.1e})")


def _live_report(x: torch.Tensor, args: argparse.Namespace) -> None:
    live = interleaved(live_methods(x, args.device), args.repeats)
    print(f"live-module path, vit-pytorch ViT-B/16 @224 (softmax captured), median of {args.repeats} interleaved "
          "repeats:")
    for name, t in live.items():
        print(f"  {name:<28} {t * 1e3:8.1f} ms")
    print(ratio_line("live forward_captured / vit-pytorch forward", live["live forward_captured"],
                     live["vit-pytorch forward"], "(target <= 1.15x)"))
    print(ratio_line("live run / vit-pytorch forward", live["live run"], live["vit-pytorch forward"],
                     "(run also preprocesses and copies the input)"))


if __name__ == "__main__":
    main()
