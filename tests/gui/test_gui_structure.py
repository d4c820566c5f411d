"""How the GUI is put together: the typed worker protocol, the session as the one owner of the current result that
the panels subscribe to, menus built from a table, and the window imported by the application alone."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from _gui import HEADS

from vitviz import catalog
from vitviz.core.analyses.maps import PosEmbedData, ResultMaps
from vitviz.gui import protocol
from vitviz.gui.protocol import (REQUESTS, Catalog, Cataloged, Load, Loaded, Move, Moved, PosEmbed, PosEmbedded, Probe,
                                 Probed, Ran, Request, Run)
from vitviz.gui.worker import InferenceWorker

GUI = Path(__file__).resolve().parents[2] / "vitviz" / "gui"


def _is_frozen_dataclass(answer: object) -> bool:
    return dataclasses.is_dataclass(answer) and type(answer).__dataclass_params__.frozen


# ---------------------------------------------------------------------------------------------- the protocol


def test_every_request_carries_its_work_answer_title_and_description() -> None:
    """Each request class is the whole of its kind: work (`__call__`), answer type (a frozen dataclass), failure
    title, status text; `REQUESTS` lists each request class of the protocol once (they are named by their classes:
    there is no second table of short names)."""
    kinds = {v for v in vars(protocol).values() if isinstance(v, type) and issubclass(v, Request) and
             v.__module__ == protocol.__name__ and "title" in vars(v) and v is not Request}
    assert kinds == set(REQUESTS) and len(REQUESTS) == len(set(REQUESTS)) and not hasattr(protocol, "Kind")
    for cls in REQUESTS:
        assert dataclasses.is_dataclass(cls) and "__call__" in {n for c in cls.__mro__[:-2] for n in vars(c)}, cls
        assert dataclasses.is_dataclass(cls.answer) and cls.answer.__dataclass_params__.frozen, cls
        assert cls.title.startswith("Could not"), cls
        request = cls.make(**({"image": "a.png"} if "image" in {f.name for f in dataclasses.fields(cls)} else {}))
        assert request.describe().endswith("…") and request.kind is cls
    titles = [cls.title for cls in REQUESTS]
    assert len(set(titles)) == len(titles)          # a failure's dialog says which kind of work failed


def test_the_protocol_imports_neither_qt_nor_torch() -> None:
    """Panels import answer types from the protocol, which the window can import before torch is loaded."""
    tree = ast.parse(Path(protocol.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [m for m in names if m.split(".")[0] in ("torch", "PySide6", "pyqtgraph")], names
    panels = [p for p in (GUI / "panels").glob("*.py") if "gui.worker import" in p.read_text()]
    assert panels == []


@pytest.fixture
def empty_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty torch hub and Hugging Face caches (the catalog scan finds nothing of the user's)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)


def test_each_kind_dispatches_to_its_handler_and_answers_its_dataclass(qtbot, tiny_ckpt, images,  # noqa: ANN001
                                                                       empty_caches) -> None:
    """The worker, driven directly in this thread: one `finished` per request, carrying the kind's dataclass."""
    worker = InferenceWorker()
    answers: list[object] = []
    worker.finished.connect(lambda _id, answer: answers.append(answer))
    worker.failed.connect(lambda _id, summary, _details: answers.append(summary))

    def ask(kind: type[Request], **args: object) -> object:
        request = kind.make(**args)
        request.id = len(answers) + 1
        worker.handle(request)
        assert len(answers) == 1, answers
        answer = answers.pop()
        assert isinstance(answer, kind.answer) and _is_frozen_dataclass(answer), answer
        return answer

    probed = ask(Probe)
    assert isinstance(probed, Probed) and probed.devices[0] == "cpu"
    loaded = ask(Load, path=str(tiny_ckpt), device=None, heads=HEADS)
    assert isinstance(loaded, Loaded) and loaded.spec.num_heads == HEADS and loaded.device == "cpu"
    assert sum(loaded.counts.values()) == loaded.spec.num_params and loaded.refused == ""
    ran = ask(Run, image=str(images[0]), image_size=None)
    assert isinstance(ran, Ran) and isinstance(ran.maps, ResultMaps) and ran.maps.result.grid == (4, 4)
    posembedded = ask(PosEmbed, grid=(4, 6))
    assert isinstance(posembedded, PosEmbedded) and posembedded.grid == (4, 6)
    assert isinstance(posembedded.data, PosEmbedData) and posembedded.data.grid == (4, 6)
    moved = ask(Move, device="cpu")
    assert moved == Moved("cpu")
    cataloged = ask(Catalog, recent=[str(tiny_ckpt)])
    assert isinstance(cataloged, Cataloged) and isinstance(cataloged.entries, catalog.ScanResult)
    assert [e.path for e in cataloged.entries] == [tiny_ckpt]
    assert {name for name, _cached, _bytes in cataloged.named} == set(catalog.named_models())
    refused = ask(Load, path=str(tiny_ckpt), device="tpu", heads=HEADS)
    assert refused.device == "cpu" and "tpu" in refused.refused


def test_the_client_answers_every_kind_on_one_signal_with_its_request(qtbot, session, tiny_ckpt,  # noqa: ANN001
                                                                       images, empty_caches) -> None:
    client = session.client
    asks = [(Probe, {}), (Load, {"path": str(tiny_ckpt), "device": None, "heads": HEADS}),
            (Run, {"image": str(images[0]), "image_size": None}), (PosEmbed, {"grid": (4, 4)}),
            (Move, {"device": "cpu"}), (Catalog, {"recent": []})]
    for kind, args in asks:
        with qtbot.waitSignal(client.answered, timeout=60000,
                              check_params_cb=lambda r, _a, kind=kind: r.kind is kind) as blocker:
            request = client.submit(kind, **args)
        assert blocker.args[0] is request and request.kind is kind
        assert isinstance(blocker.args[1], kind.answer)


# ---------------------------------------------------------------------------------------------- the session


def test_current_changed_reaches_the_panels_without_a_window(qtbot, session, tiny_ckpt, images) -> None:  # noqa: ANN001
    """Panels made on a bare session and view state follow the current image by themselves: switching image
    updates the image panel, matrix, rollout, head statistics, model info and the image list."""
    from vitviz.gui.panels.headstats import HeadStatsPanel
    from vitviz.gui.panels.image import ImagePanel
    from vitviz.gui.panels.image_list import ImageListPanel
    from vitviz.gui.panels.info import InfoPanel
    from vitviz.gui.panels.matrix import MatrixPanel
    from vitviz.gui.panels.overview import OverviewPanel
    from vitviz.gui.panels.rollout import RolloutPanel
    from vitviz.gui.state import ViewState, current_map

    state = ViewState()
    image = ImagePanel(state, session.model, session.image_list)
    overview = OverviewPanel(state, session.model, session.image_list)
    matrix, rollout = MatrixPanel(state, session.image_list), RolloutPanel(state, session.image_list)
    stats, info = HeadStatsPanel(state, session), InfoPanel(session)
    listing = ImageListPanel(session.image_list, session.cached)
    listing.current_requested.connect(session.set_current)      # what the window wires
    panels = (image, overview, matrix, rollout, stats, info, listing)
    for panel in panels:
        qtbot.addWidget(panel)
        panel.show()
        qtbot.waitExposed(panel)
    assert image.title.text.startswith("Open a model")
    with qtbot.waitSignal(session.model.model_loaded, timeout=20000):
        session.load_model(str(tiny_ckpt), heads=HEADS)
    session.add_images([str(p) for p in images])
    assert listing.paths() == [str(p) for p in images] and listing.current_path() == str(images[0])
    qtbot.waitUntil(lambda: not session.busy, timeout=20000)
    first, second = (session.result(str(p)) for p in images[:2])
    assert matrix._maps is first and rollout._maps is first and overview._maps is first

    with qtbot.waitSignal(session.image_list.current_changed, timeout=5000) as blocker:
        listing.list.setCurrentRow(1)                       # the user picks another image in the list
    assert blocker.args == [second] and session.image_list.current == str(images[1])
    assert matrix._maps is second and rollout._maps is second
    attn = second.result.attentions
    np.testing.assert_allclose(matrix.image_item.image, attn[-1].mean(0), rtol=1e-6)
    np.testing.assert_allclose(image.values, current_map(second, state)[0])
    assert image.title.text.startswith("img1.png")
    np.testing.assert_allclose(rollout.raw_map, current_map(second, ViewState(layer=-1))[0], rtol=1e-6)
    np.testing.assert_array_equal(stats.shown[0], second.head_stats()[0])
    assert "img1.png" in info.text() and "cached results: 3 image(s)" in info.text()

    session.set_current(str(images[2]))                     # and back from the session: the list follows
    assert listing.current_path() == str(images[2]) and matrix._maps is session.result(str(images[2]))
    session.set_image_size((32, 48))                         # another size: every result and statistic goes
    assert matrix._maps is None and image.values is None and session.head_stats == {}
    assert image.title.text == "Running img2.png…"
    qtbot.waitUntil(lambda: not session.busy, timeout=20000)
    assert image.values.shape == (4, 6) and matrix._maps is session.result(str(images[2]))


# ---------------------------------------------------------------------------------------------- composition


def test_menus_are_built_from_callbacks_without_touching_the_window(qtbot) -> None:  # noqa: ANN001
    from PySide6.QtWidgets import QMainWindow

    from vitviz.gui import menus

    window = QMainWindow()
    qtbot.addWidget(window)
    called: list[str] = []
    before = set(vars(window))
    built = menus.build(window, {spec.name: (lambda n=spec.name: called.append(n)) for spec in menus.ACTIONS})
    assert set(vars(window)) == before                      # returns what it built, sets nothing on the window
    assert list(built.actions) == [spec.name for spec in menus.ACTIONS]
    built.actions["next_layer"].trigger()
    assert called == ["next_layer"] and built.actions["next_layer"].shortcut().toString() == "Ctrl+Down"
    assert built.models.objectName() == "modelsMenu" and built.toolbar.objectName() == "mainToolbar"


def _imported_modules(path: Path) -> set[str]:
    """Every vitviz module an import statement of `path` names (module level, lazy and type-only alike)."""
    package = ["vitviz", "gui", *path.relative_to(GUI).parent.parts]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def test_only_the_application_imports_the_window() -> None:
    importers = sorted(str(p.relative_to(GUI)) for p in GUI.rglob("*.py")
                       if "vitviz.gui.window" in _imported_modules(p))
    assert importers == ["app.py"]
    assert "vitviz.gui.window" in _imported_modules(GUI / "app.py")      # the reader sees the one that is there
