"""The layers the package docstrings name are the layers the imports make: nothing imports upward."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import optuna_ds

_ROOT = Path(optuna_ds.__file__).parent
# Serve any layer and import none but the helpers below them: _errors quotes through _text's
# cleaner, _files raises an _errors error.
_HELPERS = {"_text": -3, "_errors": -2, "_redact": -1, "_optuna_compat": -1, "_files": -1}
_TOP = {"__init__": 6, "__main__": 7}  # the root package's own modules


def _layer_of_package(name: str) -> int:
    doc = ast.get_docstring(ast.parse((_ROOT / name / "__init__.py").read_text())) or ""
    match = re.match(r"Layer (\d+):", doc)
    assert match, f"optuna_ds.{name}'s docstring names no layer"
    return int(match.group(1))


def _layers() -> dict[str, int]:
    layers = {p.name: _layer_of_package(p.name) for p in _ROOT.iterdir() if (p / "__init__.py").exists()}
    return {**layers, **_TOP, **_HELPERS}


def _imports(path: Path) -> set[str]:
    """The top-level units of optuna_ds that ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found |= {n.split(".")[1] for n in names if n.startswith("optuna_ds.")}
    return found


def test_every_import_goes_down_the_layers_the_docstrings_name() -> None:
    layers = _layers()
    upward = []
    for path in _ROOT.rglob("*.py"):
        unit = path.relative_to(_ROOT).parts[0].removesuffix(".py")
        for target in _imports(path) - {unit}:
            assert target in layers, f"{path}: imports optuna_ds.{target}, which has no layer"
            if layers[target] >= layers[unit]:
                upward.append(f"{path.relative_to(_ROOT)} (layer {layers[unit]}) imports {target} (layer {layers[target]})")
    assert not upward, "\n".join(upward)


def test_the_top_docstring_says_the_layer_order() -> None:
    # Its numbered list: each item's text, up to the next item, by its number.
    items = {int(n): text for n, text in re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |\n\n)", optuna_ds.__doc__ or "", re.M | re.S)}
    for name, layer in _layers().items():
        if 0 <= layer and name not in ("__main__", "__init__"):
            assert f"``{name}``" in items.get(layer, ""), f"optuna_ds.{name} is layer {layer}: the top docstring says otherwise"


def test_the_domain_imports_nothing_else_of_optuna_ds() -> None:
    assert not set().union(*(_imports(p) for p in (_ROOT / "domain").rglob("*.py"))) - {"domain"}
