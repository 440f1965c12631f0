"""The package's modules use each other's public names only.

A private name (`_x`) is free to change with its module; another module
importing it couples the two behind the reader's back, which is how a command
ends up depending on a helper buried in a sibling command.
"""

from __future__ import annotations

import ast
from pathlib import Path

import modelsync

PACKAGE = Path(modelsync.__file__).parent


def test_no_module_imports_a_private_name_of_another() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("modelsync"):
                offenders += [
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_")
                ]
    assert offenders == []
