"""Write the shape signatures of every registered timm and torchvision ViT architecture, for the versions installed,
into `resources/identify/` (`vitviz.core.reading.identify.bundled`): a first search for a file nothing names then costs no
build with those versions. Run again when a new timm or torchvision is supported:

    python scripts/identify_signatures.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vitviz.core.reading.identify import LIBRARIES, write_signatures  # noqa: E402


def main() -> None:
    folder = ROOT / "resources" / "identify"
    folder.mkdir(parents=True, exist_ok=True)
    for library in LIBRARIES:
        print(write_signatures(library, folder))


if __name__ == "__main__":
    main()
