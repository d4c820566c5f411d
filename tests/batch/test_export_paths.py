"""Every output path resolves inside --out, whatever the input's name (issue 34's payload: a glob with '..' after
the wildcard named outputs above the output folder, and with --overwrite replaced a file there)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.batch.jobs import inside


def test_inside_drops_every_way_out() -> None:
    assert inside(Path("x/../../../outside/deep")) == Path("x/outside/deep")
    assert inside(Path("/abs/p")) == Path("abs/p") and inside(Path("..")) == Path(".")
    assert inside(Path("a/b")) == Path("a/b") and inside(Path(".")) == Path(".")


def test_a_glob_or_list_line_reaching_above_its_folder_names_outputs_inside_out(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`vitviz export --engine ray` lists globs and list files itself (the shell expands a local engine's): a match
    above the glob's folder keeps a subfolder without '..', so `out / sub` is under --out."""
    from vitviz.batch.ray_engine import collect_sources

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tree/a/b/c").mkdir(parents=True)
    victim_dir = tmp_path / "outside_target/deep"
    victim_dir.mkdir(parents=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
        victim_dir / "victim.png")
    pattern = "tree/a/b/*/../../../../outside_target/deep/*.png"
    (tmp_path / "list.txt").write_text(pattern + "\n")
    out = (tmp_path / "t1/t2/t3").resolve()
    for given in (pattern, "list.txt"):
        sources = collect_sources([given], out, None)
        assert sources and all(".." not in s.sub.parts and not s.sub.is_absolute() for s in sources), given
        assert all(out in (out / s.sub / "x.png").resolve().parents for s in sources)


@pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
def test_a_path_through_dotdot_writes_inside_out(tiny_ckpt: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from _tiny import HEADS

    from vitviz.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tree/a/b/c").mkdir(parents=True)
    victim_dir = tmp_path / "outside_target/deep"
    victim_dir.mkdir(parents=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(
        victim_dir / "victim.png")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    pattern = "tree/a/b/c/../../../../outside_target/deep/victim.png"   # what a shell expands the glob to
    assert main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), pattern, "--out", "t1/t2/t3",
                 "--maps", "cls", "--layers", "0", "--which-heads", "mean", "--quiet", "--no-verify"]) == 0
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    new = [p for p in after if p not in before]
    assert new and all(p.parts[0] == "t1" for p in new), new     # nothing written outside --out
    out = (tmp_path / "t1/t2/t3").resolve()
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["images"]:
        for rel in entry["outputs"]:
            assert ".." not in Path(rel).parts and out in (out / rel).resolve().parents
