"""`vitviz.core.running.live` as a package, and the `Model` protocol both loaded kinds satisfy.

- `VitModel` (a checkpoint converted to the reference ViT) and `LiveModel` (a user's module run as written) both
  satisfy `vitviz.core.protocol.Model`; `LiveModel` is no `VitModel`.
- Their `capabilities` say what each can give (the reference ViT's hooks: gradients, block outputs, a MAP head's
  map; the live path: its captured attention, and its position table when it has one); relevance, features and
  the text tower refuse by asking them.
- Both take `forward_captured(..., pool=...)`: a list gets a MAP head's attention when there is one, else stays
  empty -- callers need no special case.
- The package's modules import one another downward only, and only `code.py` imports a user's file.
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _tiny import write_tiny_checkpoint
from tests.package.test_layering import PACKAGE
from torch import nn

import vitviz
from vitviz.core.running.capture import ImageModel, VitModel
from vitviz.core.running.live import LiveModel
from vitviz.core.protocol import (
    ATTENTION, CAPABILITIES, EARLY_STOP, FEATURES, GRADIENTS, MAP_HEAD, POS_TABLE, REFERENCE, ROWS, Model,
    capabilities_of, is_reference,
)

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")


class TinySdpa(nn.Module):
    """A hand-written ViT: Conv2d patches, a CLS token, SDPA attention, no position table."""

    def __init__(self, dim: int = 16, heads: int = 2, depth: int = 2, patch: int = 8) -> None:
        super().__init__()
        self.img_size, self.heads = 32, heads
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(depth))
        self.head = nn.Linear(dim, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = torch.cat([self.cls_token.expand(len(t), -1, -1), t], dim=1)
        for qkv in self.qkv:
            b, n, d = t.shape
            q, k, v = qkv(t).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            t = t + F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        return self.head(t[:, 0])


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> VitModel:
    return vitviz.load(write_tiny_checkpoint(tmp_path_factory.mktemp("ref") / "m.pth"), heads=2, device="cpu")


@pytest.fixture(scope="module")
def map_head(reference: VitModel) -> VitModel:
    """The tiny reference ViT with a MAP pooling head (random weights), as SigLIP pools."""
    from vitviz.core.running.model import ReferenceViT

    spec = dataclasses.replace(reference.spec, pooling="map", pool_mlp=64)
    torch.manual_seed(0)
    return VitModel(ReferenceViT(spec).eval(), spec, torch.device("cpu"), [])


@pytest.fixture(scope="module")
def live() -> LiveModel:
    torch.manual_seed(0)
    return vitviz.load(TinySdpa().eval(), live=True)


@pytest.fixture(scope="module")
def live_pos() -> LiveModel:
    from vit_pytorch import ViT

    torch.manual_seed(0)
    return vitviz.load(ViT(image_size=32, patch_size=8, num_classes=4, dim=16, depth=2, heads=2, mlp_dim=32,
                           dim_head=8).eval(), live=True)


def _x(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_both_kinds_satisfy_the_protocol_and_live_is_no_vit_model(reference, live) -> None:
    for model in (reference, live):
        assert isinstance(model, Model) and isinstance(model, ImageModel)
        assert model.device == "cpu" and model.spec.depth == 2 and model.spec.num_heads == 2
        assert isinstance(model.capabilities, frozenset) and model.capabilities <= CAPABILITIES
        assert model.to("cpu") is model
    assert isinstance(reference, VitModel)
    assert not isinstance(live, VitModel) and type(live).__mro__[1] is ImageModel   # shares the base, not VitModel
    assert not isinstance(object(), Model)


def test_capabilities_of_the_reference_vit_and_the_live_path(reference, map_head, live, live_pos) -> None:
    everything = {ATTENTION, EARLY_STOP, ROWS, REFERENCE, GRADIENTS, FEATURES, POS_TABLE}
    assert reference.capabilities == everything                   # token pooling: no MAP head
    assert map_head.capabilities == everything | {MAP_HEAD}
    assert live.capabilities == {ATTENTION, EARLY_STOP, ROWS}     # no position table in TinySdpa
    assert live_pos.capabilities == {ATTENTION, EARLY_STOP, ROWS, POS_TABLE}   # vit-pytorch's pos_embedding
    assert (live.pos_embed() is None) and live_pos.pos_embed().shape == (17, 16)
    assert is_reference(reference) and is_reference(map_head)
    assert not is_reference(live) and not is_reference(live_pos)
    assert not is_reference(object()) and capabilities_of(object()) == frozenset()


@pytest.mark.parametrize("which", ["reference", "live"])
def test_forward_captured_takes_pool_none_and_a_list(which, request) -> None:
    model = request.getfixturevalue(which)
    x = _x()
    attn, out = model.forward_captured(x, pool=None)
    assert attn.shape == (2, 2, 2, 17, 17) and out.shape == (2, 4 if which == "live" else 5)
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
    pool: list[np.ndarray] = []
    attn2, out2 = model.forward_captured(x, pool=pool)
    assert pool == []                                             # no MAP head: nothing appended
    np.testing.assert_array_equal(attn2, attn)
    np.testing.assert_array_equal(out2, out)
    early, none = model.forward_captured(x, logits=False, upto=0, pool=pool)   # the same keywords on both
    np.testing.assert_array_equal(early[:, 0], attn[:, 0])
    assert none.shape == (2, 0) and pool == []
    assert model.run(x[:1]).pool_attention is None


def test_a_map_head_fills_pool_and_run_reports_it(map_head) -> None:
    pool: list[np.ndarray] = []
    attn, _out = map_head.forward_captured(_x(), pool=pool)
    assert len(pool) == 1 and pool[0].shape == (2, 2, 1, 16)      # (B, H', 1, N'): its latent query over patches
    np.testing.assert_allclose(pool[0].sum(-1), 1.0, atol=1e-5)
    result = map_head.run(_x()[:1])
    assert result.pool_attention is not None and result.pool_attention.shape == (2, 17)


def test_gradients_features_and_text_refuse_by_capability(live) -> None:
    from vitviz.core.analyses.features import FeatureError, capture_features
    from vitviz.core.analyses.relevance import RelevanceError, class_relevance
    from vitviz.core.analyses.text import TextTowerError, text_embedding

    image = _x()[:1]
    with pytest.raises(RelevanceError, match="need vitviz's reference ViT; this model runs as TinySdpa"):
        class_relevance(live, image)
    with pytest.raises(FeatureError, match="needs vitviz's reference ViT; this model runs as TinySdpa"):
        capture_features(live, image)
    with pytest.raises(TextTowerError, match="not vitviz's reference ViT \\(family 'live'"):
        text_embedding(live, ["a cat"])


def test_the_old_import_names_still_work() -> None:
    from vitviz.core.running import live as pkg
    for name in ("MHA", "SDPA", "SOFTMAX", "LIVE_OVERRIDES", "LiveModel", "LiveModelError", "NoAttentionError",
                 "UserCodeError", "sdpa_probabilities", "sdpa_scores", "watch_attention", "load_live", "load_code",
                 "load_weights", "module_from_code", "user_call", "find_patch_embedding", "AttentionLayout"):
        assert hasattr(pkg, name), name
    assert issubclass(pkg.NoAttentionError, pkg.LiveModelError) and issubclass(pkg.UserCodeError, pkg.LiveModelError)


LIVE = ("errors", "packing", "record", "describe", "model", "code")


def _imports(path: Path) -> set[str]:
    """Every module an import statement of `path` names (module level, lazy or type-only: all count), with the
    imported names appended (`from a import b` -> 'a' and 'a.b')."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            found |= {node.module or ""} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_package_imports_downward_only() -> None:
    """errors <- record <- describe <- model <- code: each module imports only those before it, never the package
    itself (the review's warning: errors left in model.py closed record -> model -> describe -> record)."""
    live = PACKAGE / "core" / "running" / "live"
    for i, name in enumerate(LIVE):
        imported = _imports(live / f"{name}.py")
        mine = {m.split(".")[3] for m in imported if m.startswith("vitviz.core.running.live.")}
        assert mine & set(LIVE) <= set(LIVE[:i]), (name, mine)
        assert "vitviz.core.running.live" not in imported, name
    assert {m for m in _imports(live / "__init__.py") if m.startswith("vitviz.core.running.live.")} >= \
        {f"vitviz.core.running.live.{n}" for n in LIVE}


def test_only_code_py_imports_user_files() -> None:
    """`spec_from_file_location` / `exec_module` / `importlib.util` appear in vitviz only in core/running/live/code.py;
    the recorder, describer, model and errors import no importlib at all."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if any(w in text for w in ("spec_from_file_location", "exec_module", "module_from_spec", "importlib.util")):
            found.append(path.relative_to(PACKAGE).as_posix())
    assert found == ["core/running/live/code.py"]
    for name in ("errors", "record", "describe", "model"):
        imported = _imports(PACKAGE / "core" / "running" / "live" / f"{name}.py")
        assert not any(m.startswith("importlib") for m in imported), (name, imported)


def test_no_type_ignore_left_for_the_live_model() -> None:
    text = (PACKAGE / "core" / "running" / "live" / "model.py").read_text(encoding="utf-8")
    assert "type: ignore" not in text
    assert "live path" not in (PACKAGE / "core" / "running" / "capture.py").read_text(encoding="utf-8")
