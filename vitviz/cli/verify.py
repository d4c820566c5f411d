"""`vitviz verify MODEL`: compare vitviz's conversion of a checkpoint with the original implementation.

    vitviz verify vit_small/                                  # the library that names it (timm, transformers...)
    vitviz verify vit.pth                                     # nothing names it: the timm / torchvision architectures
                                                              # whose parameters fit it exactly
    vitviz verify vit.pth --against timm:vit_small_patch16_224   # one architecture
    vitviz verify weights.pth --code model.py:build_model     # your own code is the original

Prints the original that was built, per input size the largest attention difference of every layer and of the
output, the assumptions, and the verdict. Exit codes: 0 verified, 1 differs or not verified, 2 an error (the model
or the original could not be loaded).
"""
from __future__ import annotations

import argparse
import warnings
from typing import Any

from vitviz.cli.jsonout import document
from vitviz.cli.options import MODEL_HELP, add_override_arguments, overrides_from, with_remembered
from vitviz.core.protocol import is_reference

# vitviz.core.analyses.verify.AGAINST and _BY_ARCH, spelled out so that parsing the command line does not import torch
# (tests/core/reading/test_identify.py keeps them equal)
AGAINST = ("auto", "timm", "transformers", "open_clip", "torchvision", "dinov2")
BY_ARCH = ("timm", "torchvision", "dinov2", "open_clip", "transformers")


def add_verify_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("verify", help="compare the converted model with its original implementation",
                       description=__doc__.split("\n\n")[0] + " The original is built by the library that names "
                       "the model, with the file's own weights, and run on one seeded random input at the native "
                       "size and at 2 patches more per side; every layer's per-head attention (tolerance 1e-5) "
                       "and the output (1e-4) are compared in float32.")
    p.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    p.add_argument("--against", type=_against, default="auto", metavar="LIBRARY[:ARCH]",
                   help="the original to compare with: auto (default: the library that names the model; for a file "
                   "nothing names, the timm / torchvision architectures whose parameter names and shapes fit it "
                   f"exactly), one of {', '.join(AGAINST[1:])}, or one architecture, e.g. timm:vit_small_patch16_224 "
                   "or torchvision:vit_b_16")
    p.add_argument("--json", action="store_true", help="print the verification as JSON")
    p.add_argument("--device", default="cpu", help="device to run both models on (default: cpu)")
    add_override_arguments(p)  # --code FILE.py:FACTORY among them: then your code is the original
    return p


def _against(text: str) -> str:
    library, sep, arch = text.partition(":")
    if library not in AGAINST or (sep and (not arch or library not in BY_ARCH)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(AGAINST)}, or LIBRARY:ARCH of "
                                         f"{', '.join(BY_ARCH)}")
    return text


def run_verify(args: argparse.Namespace) -> int:
    """0 verified, 1 differs or unverified; a VitvizError (exit 2) when the model or the original cannot load."""
    import vitviz
    from vitviz.cli.models import resolve_cli_model
    from vitviz.core.spec import GuessWarning
    from vitviz.core.analyses.verify import apply_verification, remembered_verify

    checkpoint = resolve_cli_model(args.model, quiet=getattr(args, "quiet", False))
    overrides = with_remembered(checkpoint, overrides_from(args))
    code = overrides.pop("code", None)
    with warnings.catch_warnings():  # the assumptions are listed below, each once
        warnings.simplefilter("ignore", GuessWarning)
        model = vitviz.load(checkpoint, device=args.device, **overrides)
        if code is not None and checkpoint is not None and is_reference(model):   # converted: the code's settings
            model = _with_code_settings(vitviz, model, checkpoint, code, overrides, args.device)
    with warnings.catch_warnings():  # the libraries' own deprecation notes while the original is built
        warnings.simplefilter("ignore")
        check, _ = remembered_verify(model, against=args.against, code=code, fresh=True)   # info and export see it
    apply_verification(model, check)   # what it confirmed is verified, no longer assumed
    if args.json:
        print(document("verify", check.to_dict()))
    else:
        print("\n".join(report_lines(check, model.spec)))
    return 0 if check.verified else 1


def _with_code_settings(vitviz: Any, model: Any, checkpoint: Any, code: str, overrides: dict[str, Any],
                        device: str) -> Any:
    """The file converted with what your code says where the file alone left a setting assumed (its attention's
    head count, its input size, its modules' eps / activation / scale / norm order): your code is the original
    here, so its word is read, not guessed -- said on stderr, with the flags that give the same elsewhere."""
    import sys

    from vitviz.core.analyses.verify import code_settings, mark_sources, settings_to_fill

    said = code_settings(checkpoint, code, device)
    fill = settings_to_fill(model.spec, said, overrides)
    if not fill:
        return model
    flags = " ".join(f"--{k.replace('_', '-')} " + (f"{v[0]}x{v[1]}" if k == "image_size" else f"{v}")
                     for k, v in fill.items())
    print(f"vitviz: read from your code, where the file alone left them assumed: {flags} (pass them to open the "
          "file the same way in the window or with export)", file=sys.stderr)
    model = vitviz.load(checkpoint, device=device, **overrides, **fill)
    mark_sources(model, {k: said[k][1] for k in fill})
    return model


def report_lines(check: Any, spec: Any) -> list[str]:
    """The text report: the original, a table of the largest differences (layers by sizes), what was skipped, the
    assumptions and the verdict line."""
    from vitviz.core.analyses.verify import format_difference

    lines = [f"{spec.source}"]
    if check.original:
        lines.append(f"  original   {check.original}" + (f"  ({check.library} {check.version})"
                                                          if check.version else ""))
    if check.sizes:
        width = max(10, *(len(f"{h}x{w}") + 2 for h, w in check.sizes))
        head = "  " + f"{'layer':<8}" + "".join(f"{f'{h}x{w}':>{width}}" for h, w in check.sizes)
        lines += [f"  largest |difference| (tolerance: attention {format_difference(check.atol_attention)}, output "
                  f"{format_difference(check.atol_output)}; * beyond it):", head]
        depth = max(len(layers) for layers in check.per_layer)
        for i in range(depth):
            cells = []
            for layers in check.per_layer:
                d = layers[i][1] if i < len(layers) else None
                cells.append(_cell(d, check.atol_attention, width, format_difference))
            lines.append("  " + f"{i:<8}" + "".join(cells))
        lines.append("  " + f"{'output':<8}" + "".join(_cell(d, check.atol_output, width, format_difference)
                                                         for d in check.output_per_size))
    for (h, w), why in check.skipped:
        lines.append(f"  skipped    {h}x{w}: {why}")
    if check.fitting:
        lines.append(f"  fitting    {len(check.fitting)} architecture{'s' if len(check.fitting) != 1 else ''} "
                     f"with exactly its parameter names and shapes: {', '.join(check.fitting)}")
        if check.matches:
            lines.append(f"  matches    {', '.join(check.matches)}")
        lines += [f"  other      {name}: {how}" for name, how in check.alternatives]
    if check.verdict == "differs" and check.reason:
        lines.append(f"  differs    {check.reason}")
    if check.causes:
        flags = {"heads": "--heads", "act": "--act", "eps": "--eps", "eps_final": "--eps-final",
                 "attn_scale": "--attn-scale", "block_norm": "--block-norm", "pooling": "--pooling"}
        fix = " ".join(f"{flags.get(k, '--' + k.replace('_', '-'))} {v}" for k, v in check.suggested)
        lines.append("  could be   " + ", ".join(f"{name}: the original has {what}" for name, what in check.causes)
                     + (f" (try {fix})" if fix else ""))
    verified = [(name, source) for name, source in spec.provenance if name in check.confirmed]
    if verified:
        lines.append(f"  verified ({len(verified)}): " + ", ".join(name for name, _ in verified)
                     + " (assumed, and confirmed by this comparison)")
    assumed = dict(spec.assumptions)
    still_open = dict(check.open)
    if assumed:
        lines.append(f"  assumptions ({len(assumed)}):")
        lines += [f"    {name:<14} {source}" + (f" [could also be {still_open[name]}]" if name in still_open else "")
                  for name, source in assumed.items()]
    else:
        lines.append("  assumptions none")
    if check.verdict == "unverified":
        lines.append(f"  why        {check.reason}")
    lines.append(check.summary())
    return lines


def _cell(value: float | None, tolerance: float, width: int, fmt: Any) -> str:
    if value is None:
        return f"{'-':>{width}}"
    text = fmt(value) + ("*" if value > tolerance else " ")
    return f"{text:>{width}}"

