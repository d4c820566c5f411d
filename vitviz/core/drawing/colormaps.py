"""Colormap lookup tables as (256, 3) uint8 arrays, without matplotlib.

viridis, inferno, magma and plasma (Smith, van der Walt and Firing; CC0) and turbo (Mikhailov, Google; Apache-2.0)
are stored as evenly spaced entries of their published 256-entry tables (every 5th, i.e. indices 0, 5, ..., 255;
plasma every 3rd) and rebuilt by linear interpolation; every rebuilt entry is within 1 unit of the published table. Append '_r' to a
name for the reversed map.

One diverging map, for signed maps that centre on 0 (the difference of two models' maps, `vitviz.core.analyses.compare`):
'rdbu', ColorBrewer's RdBu (Brewer, Apache-2.0) from its 11 published classes, blue for negative, white
(#f7f7f7) at the middle, red for positive (matplotlib's 'RdBu_r'). It is accepted wherever a colormap name is
(`colormap`, `apply_colormap`), but not listed by `available_colormaps` (the sequential maps the window and
`--cmap` offer for attention, which never goes below 0): `diverging_colormaps` lists it.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from vitviz.errors import VitvizError


_CONTROL_HEX: dict[str, str] = {
    "viridis": (
        "44015446085c471063481769481d6f482475472a7a46307e453781433d844142873f48893d4e8a3a538b38598c355e8d"
        "33638d31688e2e6d8e2c718e2a768e297b8e27808e25848e23898e218e8d20928c1f978b1e9c891fa18821a58524aa83"
        "28ae802eb37c35b7793dbc7446c06f50c46a5ac86465cb5e70cf577cd25089d54895d840a2da37b0dd2fbddf26cae11f"
        "d8e219e5e419f1e51dfde725"
    ),
    "inferno": (
        "00000402020c0504170a072210092d160b391e0c45260c512f0a5b380962400a67490b6a510e6c59106e61136e69166e"
        "71196e781c6d801f6c88226a902568982766a02a63a82e5fb0315bb73557bf3952c63d4dcc4248d34743d94d3ddf5337"
        "e45a31e9612bed6925f1711ff47918f78212f98b0bfa9407fb9d07fca60cfcb014fbba1ffac42af8cd37f6d746f4e156"
        "f2ea69f2f27df5f992fcffa4"
    ),
    "magma": (
        "00000402020b0504160907200e0b2b140e361a104221114e29115a311165390f6e420f754a107952137c5a167e621980"
        "6a1c81721f81792282812581892881912b81992d80a1307eaa337db2357bba3878c23b75ca3e72d2426fd9466be04c67"
        "e75263ec5860f1605df4695cf7725cf97b5dfb8560fc8e64fd9869fea16efeaa74feb47bfebd82fec68afecf92fed89a"
        "fde2a3fdebacfcf4b6fcfdbf"
    ),
    "plasma": (  # every 3rd entry: every 5th leaves a 2-unit error where blue turns sharply at the top
        "0d088716078a1d068e2406912a05932f05963504983a049a3f049c44039e4903a04e02a25302a35801a45c01a66100a7"
        "6600a76a00a86f00a87401a87801a87d03a88104a78606a68a09a58e0ca4920fa39613a19a169f9e199da21d9aa62098"
        "aa2395ad2793b12a90b42e8db7318abb3488be3885c13b82c43e7fc7427cca457acc4977cf4c74d24f71d5536fd7566c"
        "da5a6adc5d67de6164e16462e3685fe56b5de76f5ae97257eb7655ed7a52ef7e50f1814df3854bf48948f68d45f79143"
        "f89540f99a3efa9e3bfba238fca636fdab33fdaf31fdb42ffeb82cfebd2afdc229fdc627fdcb26fcd025fbd524fada24"
        "f8df25f7e425f5e926f3ee27f1f426f0f921"
    ),
    "turbo": (
        "30123b36215f3b2f803f3e9c424bb54559cb4666dd4773eb4680f6458cfd4099ff38a5fb2fb2f427bee91fc9dd1ad4d0"
        "18ddc21ae4b622ebaa2ff19b3ff68a52fa7a65fd6979fe598bff4b9cfe40a9fb39b7f735c3f134d0ea34dbe236e5d938"
        "eecf3af5c53afaba39fdae35fea130fe932afc8423f9751df46617ef5811e84b0ce14109d83706ce2d04c32503b71d02"
        "a916019b0f018b09027a0403"
    ),
}


# ColorBrewer RdBu, 11 classes, reversed (low = blue), at 11 evenly spaced positions 0, 25.5, ..., 255.
_DIVERGING_HEX: dict[str, str] = {
    "rdbu": "0530612166ac4393c392c5ded1e5f0f7f7f7fddbc7f4a582d6604db2182b67001f",
}
DIVERGING = "rdbu"   # the diverging map difference pictures are drawn with


class ColormapError(VitvizError, ValueError):
    """An unknown colormap name, or values that are not a 2-D map."""


def available_colormaps() -> tuple[str, ...]:
    """Names accepted by `colormap` and `apply_colormap` (each also with an '_r' suffix), in the order the window
    lists them and the CLI names them: viridis (the default) first."""
    return (*_CONTROL_HEX, "gray")


def diverging_colormaps() -> tuple[str, ...]:
    """Names of the diverging maps (centred on their middle entry), for signed maps drawn on -m..m."""
    return tuple(_DIVERGING_HEX)


def _from_control_points(hex_string: str) -> np.ndarray:
    """Rebuild a (256, 3) uint8 table from evenly spaced control points that include entries 0 and 255."""
    points = np.frombuffer(bytes.fromhex(hex_string), dtype=np.uint8).reshape(-1, 3)  # (P, 3)
    step = 255 // (points.shape[0] - 1)
    assert step * (points.shape[0] - 1) == 255, "control points must be evenly spaced from 0 to 255"
    where = np.arange(points.shape[0]) * step  # (P,) table indices
    x = np.arange(256)
    table = np.stack([np.interp(x, where, points[:, c].astype(np.float64)) for c in range(3)], axis=1)
    return np.round(table).astype(np.uint8)  # (256, 3)


@lru_cache(maxsize=None)
def _table(name: str) -> np.ndarray:
    if name == "gray":
        table = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)  # (256, 3)
    elif name in _DIVERGING_HEX:
        points = np.frombuffer(bytes.fromhex(_DIVERGING_HEX[name]), dtype=np.uint8).reshape(-1, 3)  # (P, 3)
        where = np.linspace(0.0, 255.0, points.shape[0])
        table = np.round(np.stack([np.interp(np.arange(256), where, points[:, c].astype(np.float64))
                                   for c in range(3)], axis=1)).astype(np.uint8)  # (256, 3)
    else:
        table = _from_control_points(_CONTROL_HEX[name])
    table.setflags(write=False)
    return table


def colormap(name: str) -> np.ndarray:
    """The (256, 3) uint8 lookup table of `name` (read-only); '<name>_r' gives it reversed.

    Raises:
        ColormapError: the name is not one of `available_colormaps()`.
    """
    base, reverse = (name[:-2], True) if name.endswith("_r") else (name, False)
    if base not in available_colormaps() + diverging_colormaps():
        raise ColormapError(f"unknown colormap {name!r}; expected one of {', '.join(available_colormaps())} "
                            f"(diverging, for signed maps: {', '.join(diverging_colormaps())})")
    table = _table(base)
    return table[::-1] if reverse else table


def normalize(values: np.ndarray, vmin: float | None = None, vmax: float | None = None) -> np.ndarray:
    """Scale values to [0, 1] between vmin and vmax (default: the finite min and max), clipped.

    A constant input (vmax == vmin) maps to 0; non-finite values map to 0.
    """
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    if vmin is None:
        vmin = float(v[finite].min()) if finite.any() else 0.0
    if vmax is None:
        vmax = float(v[finite].max()) if finite.any() else 1.0
    span = vmax - vmin
    scaled = (v - vmin) / span if span > 0 else np.zeros_like(v)
    return np.where(finite, np.clip(scaled, 0.0, 1.0), 0.0)


def apply_colormap(values: np.ndarray, name: str = "viridis", vmin: float | None = None,
                   vmax: float | None = None) -> np.ndarray:
    """Colour a 2-D float map.

    Values are scaled by `normalize` and binned into 256 equal bins (matplotlib's convention: vmin gets entry 0,
    vmax entry 255).

    Args:
        values: (h, w) map.

    Returns:
        (h, w, 3) uint8 RGB.
    """
    v = np.asarray(values)
    if v.ndim != 2:
        raise ColormapError(f"expected a 2-D (h, w) map, found shape {v.shape}")
    index = np.minimum((normalize(v, vmin, vmax) * 256).astype(np.int64), 255)  # (h, w)
    return colormap(name)[index]  # (h, w) -> (h, w, 3)
