"""`vitviz models`: list the ViT checkpoints on this computer and the named models; download one by name.

Only `--get NAME` touches the network: a torchvision name when it is not cached yet; a hub name as huggingface_hub
does (a branch or tag is asked of the hub again, a file of the same commit not downloaded again; offline or with
a commit hash, the cache only). `resolve_cli_model` is how `vitviz info` and `vitviz export` take a named model as
well (downloaded with a progress bar on stderr). The listing names every checkpoint as the other commands take it
(`hf:ORG/NAME[@REVISION]`, `torchvision:ARCH:WEIGHTS`, else its path).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from vitviz.catalog.scan import format_size, scan
from vitviz.catalog.dirs import hf_hub_dir, torch_hub_dir
from vitviz.catalog.hub import hub_offline, is_hub_name
from vitviz.catalog.named import (cached_named, check_model_name, is_named_model, lookup_named, named_models,
                                  resolve_model_arg)
from vitviz.cli.jsonout import document
from vitviz.cli.options import add_verbosity_arguments
from vitviz.cli.progress import ProgressBar
from vitviz.errors import VitvizError

EXAMPLES = """examples:
  vitviz models                                  checkpoints in the caches
  vitviz models --recent ~/runs/vit.pth          ... and this file or folder too
  vitviz models --named                          torchvision's ViTs, and which ones are downloaded
  vitviz models --get torchvision:vit_b_16       download one (if not cached) and print its path
  vitviz models --get torchvision:vit_b_16 --json   ... as {"name", "path", "size"}
  vitviz --model torchvision:vit_b_16            open it in the window (downloaded first if need be)
  vitviz info torchvision:vit_b_16               describe it (likewise: vitviz export --model NAME ...)"""


def add_models_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `vitviz models` to the CLI's subparsers."""
    p = subparsers.add_parser("models", help="list ViT checkpoints on this computer; download named models",
                              description="List the ViT checkpoints in the torch hub and Hugging Face caches, "
                              "or fetch a model by name (hf:ORG/NAME[@REVISION], timm:NAME[.TAG] into the Hugging Face cache; "
                              "torchvision:ARCH[:WEIGHTS] into the torch hub cache).",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table (with --get: the "
                   "model's name, path and size)")
    add_verbosity_arguments(p)
    what = p.add_mutually_exclusive_group()   # each is a different listing (or a download): one at a time
    what.add_argument("--named", action="store_true",
                      help="list the named models and whether each is downloaded (downloads nothing)")
    what.add_argument("--get", metavar="NAME", help="download a named model (torchvision:ARCH[:WEIGHTS], "
                      "hf:ORG/NAME[@REVISION] or timm:NAME[.TAG]) unless it is cached, and print its path")
    what.add_argument("--recent", metavar="PATH", action="append", default=[],
                      help="also list this file or folder with the caches' checkpoints (repeatable)")
    return p


def run_models_command(args: argparse.Namespace) -> int:
    """`vitviz models`: 0 on success; VitvizError propagates to the CLI's handler (exit 2).

    Folders or files of the caches that cannot be read are left out of the listing and named on stderr."""
    if args.get:
        if args.named or args.recent:   # the parser refuses these; a Namespace built by hand might not
            raise VitvizError("--get downloads one model and prints its path; it cannot be combined with "
                              "--named or --recent")
        if getattr(args, "verbose", False):
            os.environ["VITVIZ_VERBOSE"] = "1"      # read by vitviz.catalog.hub (huggingface_hub's own messages)
        return _get(args.get, args.json, quiet=getattr(args, "quiet", False))
    if args.named:
        rows = [{"name": n, "cached": str(cached_named(n) or "")} for n in named_models()]
        if args.json:
            print(document("named", rows, "models"))
        else:
            print(f"{'NAME':<48} {'SIZE':>8}  FILE")
            for row in rows:
                size = format_size(4 * lookup_named(row["name"]).num_params)   # float32 weights
                print(f"{row['name']:<48} {size:>8}  {row['cached'] or 'not downloaded'}")
        return 0
    entries = scan(args.recent)
    for skipped in entries.skipped:
        print(f"vitviz: skipped {skipped} (not listed)", file=sys.stderr)
    if args.json:
        print(document("models", [e.to_dict() for e in entries], "models"))
        return 0
    if not entries:
        print(f"no ViT checkpoints found in {torch_hub_dir()} or {hf_hub_dir()}.\n"
              "Try `vitviz models --named`, then `vitviz --model torchvision:vit_b_16`.")
        return 0
    print(f"{'NAME':<44} {'FAMILY':<12} {'SIZE':>8}  {'SOURCE':<12} {'REVISION':<12} PATH")
    for e in entries:   # NAME as the commands and vitviz.load take it: the hub or torchvision name, else the path
        print(f"{e.named or str(e.path):<44} {e.family_text:<12} {e.size_text:>8}  {e.source:<12} "
              f"{e.revision[:12] or '-':<12} {e.path}")
    return 0


def _get(name: str, as_json: bool = False, quiet: bool = False) -> int:
    """`--get NAME`: the cached file, else downloaded with a progress bar on stderr; its path on stdout (or, with
    --json, {"name", "path", "size"})."""
    if is_hub_name(name):   # hf:ORG/NAME[@REVISION] or timm:NAME[.TAG]: a model folder in the HF cache
        check_model_name(name)   # before anything is asked of the hub (a revision that leads out of the cache)
        canonical, path = name, resolve_cli_model(name, quiet=quiet)
        size = sum(p.stat().st_size for p in Path(path).iterdir() if p.is_file())
    else:
        canonical = lookup_named(name).name
        path = resolve_cli_model(name, quiet=quiet)
        size = os.path.getsize(path)
    if as_json:
        print(document("get", {"name": canonical, "path": path, "size": size}))
    else:
        print(path)
    return 0


def resolve_cli_model(text: str, quiet: bool = False) -> str:
    """A checkpoint argument of a command (`vitviz info`, `vitviz export --model`, `vitviz models --get`) as
    something `vitviz.load` accepts, through `resolve_model_arg` like the window: paths unchanged, a named model
    its cached file, else downloaded (naming it on stderr with a progress bar, unless `quiet`).

    Raises:
        VitvizError: an unknown name; DownloadError when it is not cached and cannot be downloaded or saved
            (naming the file and the folder).
    """
    if not is_named_model(text):
        return text
    offline = is_hub_name(text) and hub_offline()   # offline nothing is downloaded: the error says what is missing
    if not quiet and not offline and cached_named(text) is None:   # the cache is looked at once (a hub name: every
        if is_hub_name(text):                                        # file)
            print(f"downloading {text} from the Hugging Face Hub into {hf_hub_dir()}", file=sys.stderr)
        else:
            nw = lookup_named(text)
            print(f"downloading {nw.file_name} ({format_size(4 * nw.num_params)}) from {nw.url} to "
                  f"{torch_hub_dir()}", file=sys.stderr)
    bar = None if quiet else ProgressBar(stream=sys.stderr, tty_only=False)
    try:
        return resolve_model_arg(text, progress=bar)
    finally:
        if bar is not None:
            bar.close()   # end the bar's line, so an error message starts on a line of its own
