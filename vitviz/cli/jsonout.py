"""The `--json` outputs of the commands: one JSON object whose first key, "schema", names the document and its
version, e.g. {"schema": "vitviz.info/1", ...}.

The number after '/' changes only when a key is removed or changes its meaning; new keys may appear in any
version, so a reader checks the name and the number and ignores keys it does not know. README: "JSON outputs".
"""
from __future__ import annotations

import json
from typing import Any

SCHEMA_VERSION = 1


def schema(kind: str) -> str:
    """'vitviz.<kind>/<version>': the "schema" value of a `--json` document."""
    return f"vitviz.{kind}/{SCHEMA_VERSION}"


def document(kind: str, data: dict[str, Any] | list[Any], key: str = "") -> str:
    """`data` as a `--json` document: a dict gets "schema" first; a list goes under `key` beside it."""
    body = {key: data} if isinstance(data, list) else data
    return json.dumps({"schema": schema(kind), **body}, indent=2, default=list)
