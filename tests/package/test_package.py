"""Packaging contracts: import boundaries, entry points, and resources from a regular install."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=kw.get("cwd", ROOT),
                          env=kw.get("env"), timeout=240)


def test_core_imports_no_qt() -> None:
    code = ("import sys, vitviz, vitviz.core.running.capture, vitviz.core.analyses.analysis, vitviz.core.drawing.render, vitviz.core.files, vitviz.core.running.images, "
            "vitviz.cli\nbad = [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph', 'shiboken'))]\n"
            "assert not bad, bad\nprint('ok')")
    r = _run(code)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_gui_and_package_import_without_torch() -> None:
    mods = ["vitviz", "vitviz.cli", "vitviz.core.spec"]
    gui = ROOT / "vitviz" / "gui"
    mods += [f"vitviz.gui.{p.stem}" for p in sorted(gui.glob("*.py")) if p.stem != "__init__"]
    code = (f"import sys, importlib\nfor m in {mods!r}: importlib.import_module(m)\n"
            "assert 'torch' not in sys.modules, [m for m in sys.modules if m.startswith('torch')][:5]\nprint('ok')")
    r = _run(code, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_main_py_and_module_entry_points_agree() -> None:
    a = subprocess.run([sys.executable, "main.py", "info", "--help"], capture_output=True, text=True, cwd=ROOT)
    b = subprocess.run([sys.executable, "-m", "vitviz", "info", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and "--json" in a.stdout


def test_resources_found_from_a_regular_install(tmp_path) -> None:
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--quiet",
                        "--target", str(target), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not (target / "vitviz" / "resources_path.py").is_symlink()
    code = ("import vitviz.resources_path as rp, pathlib\nd = rp.resource_dir()\n"
            "print(d)\nassert rp.resource('vitviz.svg').is_file()\n")
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = _run(code, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert str(target) in r.stdout and str(ROOT) not in r.stdout


def test_version_flag_is_instant_and_names_the_package() -> None:
    r = subprocess.run([sys.executable, "-m", "vitviz", "--version"], capture_output=True, text=True, cwd=ROOT,
                       timeout=60)
    import vitviz

    assert r.returncode == 0 and r.stdout.strip() == f"vitviz {vitviz.__version__}"


def test_readme_layout_names_every_module() -> None:
    """README's Layout section is the map of the tree: every module of the package is named there."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout"):]
    missing = [str(p.relative_to(root)) for p in sorted((root / "vitviz").rglob("*.py"))
               if p.stem != "__init__" and not re.search(rf"\b{re.escape(p.stem)}(\.py)?\b", layout)]
    assert missing == [], f"modules not in README's Layout section: {missing}"


def test_every_subpackage_ships_in_the_wheel() -> None:
    """pyproject.toml lists the packages explicitly: a new subpackage (vitviz.core.running.live was one) must be listed, or
    a regular install lacks it (`No module named ...` from the installed command)."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "vitviz").rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"


def _build(kind: str, out: Path) -> Path:
    """Build the wheel or sdist of this checkout into `out`, in process-free isolation from the tree's build/."""
    code = (f"import sys; from setuptools import build_meta as b; "
            f"print(b.build_{kind}({str(out)!r}))")
    r = _run(code)
    assert r.returncode == 0, r.stderr[-2000:]
    return out / r.stdout.strip().splitlines()[-1]


def test_metadata_license_and_classifiers(tmp_path: Path) -> None:
    """An SPDX expression (not the deprecated table), the LICENSE file, authors, classifiers; no made-up URLs."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert project["authors"] == [{"name": "vitviz contributors"}]
    assert not any(c.startswith("License ::") for c in project["classifiers"])   # PEP 639: the expression says it
    assert all(url.startswith("https://") for url in project.get("urls", {}).values())


def test_wheel_leaves_the_screenshots_out(tmp_path: Path) -> None:
    import zipfile

    shutil_build = ROOT / "build"   # a stale build/lib would put files back that the config leaves out
    if shutil_build.exists():
        import shutil

        shutil.rmtree(shutil_build, ignore_errors=True)
    wheel = _build("wheel", tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if "/screenshots/" in n]
    assert "vitviz/resources/demo/model.safetensors" in names and "vitviz/resources/vitviz.svg" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert wheel.stat().st_size < 2_500_000   # 5.7 MB with the screenshots, 1.4 MB without


def test_sdist_tests_run_from_the_unpacked_sdist(tmp_path: Path) -> None:
    """The sdist has what the tests need (conftest.py, the helpers, tests/gui/, the README's screenshots), and one
    quick test file that uses them passes from the unpacked sdist, importing vitviz from there."""
    import tarfile

    sdist = _build("sdist", tmp_path / "dist")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    root = tmp_path / "src" / sdist.name[: -len(".tar.gz")]
    for need in ("LICENSE", "tests/conftest.py", "tests/_tiny.py", "tests/_fakehub.py", "tests/gui/conftest.py",
                 "resources/screenshots/first_run.png", "main.py"):
        assert (root / need).is_file(), need
    env = {**os.environ, "PYTHONPATH": str(root), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cli/test_cli_help.py"],
                       capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    probe = subprocess.run([sys.executable, "-c", "import vitviz; print(vitviz.__file__)"], capture_output=True,
                           text=True, cwd=root, env=env)
    assert probe.stdout.startswith(str(root))
