"""docs/ARCHITECTURE.md's module table names every module of the package, and nothing that is gone.

The table is the map a new maintainer reads first; a module added without its row, or a
row left behind by a move, makes it wrong without anyone noticing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "modelsync"
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _table_paths() -> set[str]:
    """The backticked module paths in the first cell of each row of the module table."""
    named: set[str] = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            named |= set(re.findall(r"`([\w/]+(?:\.py|/))`", first_cell))
    return named


def _has_code(path: Path) -> bool:
    """A module with more than a docstring (an empty package marker needs no row)."""
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def _modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py":
            if _has_code(path) and relative != "__init__.py":
                found.add(relative.removesuffix("__init__.py"))
        elif relative != "__main__.py":
            found.add(relative)
    return found


def test_every_module_has_a_row_in_the_architecture_table() -> None:
    missing = sorted(_modules() - _table_paths())
    assert not missing, "docs/ARCHITECTURE.md's module table lacks: " + ", ".join(missing)


def test_every_row_of_the_architecture_table_names_a_module_that_exists() -> None:
    gone = sorted(p for p in _table_paths() if not (PACKAGE / p).exists())
    assert not gone, "docs/ARCHITECTURE.md names modules that do not exist: " + ", ".join(gone)
