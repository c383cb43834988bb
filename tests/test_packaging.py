"""Two rooms: txl, the model package, stands alone; the demo (app.py, webapp/) sits on it.

`pip install .` gives txl with what pyproject.toml declares and nothing of the demo;
`pip install .[app]` adds gradio, plotly and matplotlib; requirements.txt (what a Space
installs) lists the same. No module of txl imports the demo or its web stack at import time.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
WEB_STACK = ("gradio", "plotly", "matplotlib")
DEMO = ("webapp", "app")  # the demo's package and the Space's entry point
# The import name of each distribution txl and the demo use (the rest are the same word).
IMPORT_NAMES = {"huggingface_hub": "huggingface_hub"}


def requirement_name(requirement: str) -> str:
    """'huggingface_hub>=0.34' -> 'huggingface_hub'; 'torch==2.13.0' -> 'torch'."""
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("-", "_")


def top_level_imports(path: Path) -> set[str]:
    """The first name of every module a file imports when it is imported: statements at
    module level, inside module-level ``if``/``try`` too, never inside a function."""
    names = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for part in ("body", "orelse", "finalbody", "handlers"):
                    for child in getattr(node, part, []):
                        visit(child.body if isinstance(child, ast.ExceptHandler) else [child])

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


def without_the_demo(program: str) -> str:
    """Python source that makes gradio, plotly, matplotlib and the demo unimportable, then
    runs ``program``: for a fresh interpreter (``python -c``)."""
    return (
        f"import sys\nfor name in {WEB_STACK + DEMO!r}:\n"
        "    sys.modules[name] = None  # any import of it raises ImportError\n" + program
    )


def txl_modules() -> list[Path]:
    return sorted((ROOT / "txl").rglob("*.py"))


def test_top_level_imports_reads_what_a_module_imports_on_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import os.path\nfrom torch import nn\nfrom . import sibling\n"
        "try:\n    import gradio\nexcept ImportError:\n    pass\n"
        "if True:\n    import plotly.graph_objects as go\n"
        "def later():\n    import matplotlib\n"
    )
    assert top_level_imports(module) == {"os", "torch", "gradio", "plotly"}


def test_no_txl_module_imports_the_demo_or_the_web_stack():
    assert len(txl_modules()) > 15
    found = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in txl_modules()
        for name in top_level_imports(path)
        if name in WEB_STACK + DEMO
    }
    assert found == set()


def test_txl_imports_and_generates_with_the_web_stack_and_the_demo_unimportable():
    """In a fresh interpreter where gradio, plotly, matplotlib and the demo cannot be
    imported: every txl module imports, the shipped model loads, and a Session generates."""
    program = without_the_demo("""
import importlib, pkgutil
import txl
modules = [m.name for m in pkgutil.iter_modules(txl.__path__)]
for name in modules:
    importlib.import_module("txl." + name)
from txl import TransformerXL
from txl.session import Session
model = TransformerXL.from_pretrained("weights/shakespeare-char")
session = Session(model, mem_len=64, seed=0)
session.feed("ROMEO:")
text = "".join(trace.char for trace in session.generate(40))
print(len(modules), repr(text))
""")
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    count, text = done.stdout.strip().split(" ", 1)
    assert int(count) == len([p for p in txl_modules() if p.name != "__init__.py"])
    assert len(eval(text)) == 40  # noqa: S307 (our own repr of a str)


def test_pyproject_declares_what_txl_imports_and_the_app_extra_what_the_demo_adds():
    declared = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    app = {requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["app"]}
    assert declared == {"torch", "numpy", "safetensors", "huggingface_hub", "tqdm"}
    assert app == set(WEB_STACK)

    def third_party(paths) -> set[str]:
        names = set().union(*(top_level_imports(p) for p in paths))
        return {n for n in names if n not in sys.stdlib_module_names and n not in {"txl", *DEMO}}

    imported_names = {IMPORT_NAMES.get(d, d) for d in declared}
    assert third_party(txl_modules()) <= imported_names
    demo_files = [ROOT / "app.py", *sorted((ROOT / "webapp").rglob("*.py"))]
    assert third_party(demo_files) <= imported_names | app


def test_requirements_txt_installs_the_package_and_the_app_with_the_same_versions():
    """What a Space installs (requirements.txt) is complete: every requirement of
    pyproject.toml, the app's extra included, with the same version specifier; and torch
    comes from PyTorch's CPU index where it can be reached (a CPU Space: not the CUDA build
    that PyPI serves on Linux)."""
    project = PYPROJECT["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["app"]
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    listed = [line.split("#")[0].strip() for line in lines]
    options = [line for line in listed if line.startswith("-")]
    assert options == ["--extra-index-url https://download.pytorch.org/whl/cpu"]
    assert sorted(wanted) == sorted(line for line in listed if line and line not in options)


@pytest.mark.slow
def test_the_wheel_holds_txl_alone_and_runs_from_where_it_is_installed(tmp_path):
    """``pip wheel .``: the wheel holds txl/ and its metadata only, requires what pyproject
    declares, and, installed into a folder of its own, imports and generates with the web
    stack unimportable and without this checkout on the path."""
    source = tmp_path / "source"  # what the wheel is built from (the build writes beside it)
    shutil.copytree(ROOT / "txl", source / "txl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("txl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    tops = {name.split("/")[0] for name in names}
    assert tops == {"txl", next(t for t in tops if t.endswith(".dist-info"))}
    assert {f"txl/{p.relative_to(ROOT / 'txl')}" for p in txl_modules()} <= set(names)
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    plain = {r.replace(" ", "") for r in requires if "extra" not in r}
    extra = {requirement_name(r) for r in requires if "extra == \"app\"" in r}
    assert plain == {r.replace(" ", "") for r in PYPROJECT["project"]["dependencies"]}
    assert extra == set(WEB_STACK)

    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=600,
    )
    assert installed.returncode == 0, installed.stderr
    program = f"""
import sys
for name in {WEB_STACK + DEMO!r}:
    sys.modules[name] = None
sys.path.insert(0, {str(site)!r})
import json, txl
from txl import TransformerXL
from txl.session import Session
model = TransformerXL.from_pretrained({str(ROOT / "weights" / "shakespeare-char")!r})
session = Session(model, mem_len=64, seed=0)
session.feed("ROMEO:")
print(json.dumps([txl.__file__, "".join(t.char for t in session.generate(20))]))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    where, text = json.loads(done.stdout)
    assert Path(where).is_relative_to(site) and len(text) == 20
