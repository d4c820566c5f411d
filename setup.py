"""The package index's page (the long description): README.md with each picture replaced by its caption.

The README's pictures are paths relative to the repository (resources/screenshots/...). The package index shows a
long description on its own, where such a path points nowhere: a broken picture. A picture needs an absolute
address to show there, and vitviz has no public repository address yet ([project.urls] in pyproject.toml is empty
on purpose: none is made up), so the index gets the caption in place of each picture. Everything else is read from
pyproject.toml; `readme` is declared dynamic there, given here.
"""
import re
from pathlib import Path

from setuptools import setup

PICTURE = re.compile(r"!\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*://)[^)\s]*\)")   # ![caption](relative/path.png)


def index_readme(text: str) -> str:
    """README text with every relative picture `![caption](path)` as '*(picture: caption)*'."""
    return PICTURE.sub(lambda m: f"*(picture: {m.group(1).strip() or 'screenshot'})*", text)


if __name__ == "__main__":
    setup(long_description=index_readme((Path(__file__).parent / "README.md").read_text(encoding="utf-8")),
          long_description_content_type="text/markdown")
