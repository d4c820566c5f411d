"""Locate files under the repository's `resources/` folder, both from a checkout and from an installed wheel."""
from __future__ import annotations

from pathlib import Path


def resource_dir() -> Path:
    """The folder holding vitviz's resources.

    An installed wheel carries them as the package `vitviz.resources`; a source checkout has them in
    `<repo>/resources`.
    """
    try:
        from importlib.resources import files

        root = Path(str(files("vitviz.resources")))
        if root.is_dir():
            return root
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent / "resources"


def resource(name: str) -> Path:
    """Path of one resource file, e.g. `resource('imagenet_classes.txt')`."""
    return resource_dir() / name
