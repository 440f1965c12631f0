"""The schedule file's YAML layer: hostile text to a node tree, and nodes to located, typed values.

The text arrives by GitOps from many hands, so it is hostile until proven
otherwise: only the safe loader is used, and the composer refuses alias bombs by
counting aliases and the nodes the document would expand to, without ever
expanding it. Every node keeps its mark, so each problem becomes one
`ScheduleError` line `FILE:LINE: FIELD.PATH: what is wrong`. What the fields
mean is `core/schedule.py`'s job; this module knows only YAML's shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from modelsync.errors import ScheduleError, UsageError

__all__ = [
    "MAX_ALIASES",
    "MAX_EXPANDED_NODES",
    "BoundedLoader",
    "NodeReader",
    "compose",
    "value_of",
    "yaml_error",
]

#: nodes the document would have with every alias expanded (a billion-laughs guard)
MAX_EXPANDED_NODES = 100_000
#: aliases in the whole document; a legitimate schedule needs a handful at most
MAX_ALIASES = 100

_T = TypeVar("_T")
_TYPE_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
    list: "a list",
    dict: "a mapping",
}


class BoundedLoader(yaml.SafeLoader):
    """Composes nodes with their marks and refuses documents that would expand too far.

    Aliases are shared nodes, so composing is cheap; it is walking or
    constructing the result that explodes. Each node's expanded size is computed
    once, from its children's, and checked against `MAX_EXPANDED_NODES`.
    """

    def __init__(self, text: str, filename: str) -> None:
        super().__init__(text)
        self._filename = filename
        self._aliases = 0
        self._expanded: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        # the stubs leave peek_event untyped; it returns the next parser event
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark is not None else 1
        is_alias = self.check_event(yaml.AliasEvent)
        if is_alias:
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise self._refuse(line, f"more than {MAX_ALIASES} aliases")
        node = super().compose_node(parent, index)
        if node is None:  # pragma: no cover - the composer returns a node for every event
            return None
        expanded = self._expanded.get(id(node))
        if expanded is None:
            if is_alias:
                raise self._refuse(line, "an alias refers to the node that contains it")
            expanded = 1 + sum([self._expanded[id(child)] for child in _children(node)])
            self._expanded[id(node)] = expanded
        if expanded > MAX_EXPANDED_NODES:
            raise self._refuse(line, f"aliases expand it beyond {MAX_EXPANDED_NODES} nodes")
        return node

    def _refuse(self, line: int, reason: str) -> ScheduleError:
        return ScheduleError(f"{self._filename}:{line}: YAML refused: {reason}")


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [item for pair in node.value for item in pair]
    return []


def value_of(node: Node, key: str) -> Node:
    """The value node under `key` in an already validated mapping, for pointing at it."""
    for key_node, value_node in node.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return value_node  # type: ignore[no-any-return]  # PyYAML nodes are untyped
    return node


def compose(loader: BoundedLoader, text: str, filename: str) -> Node | None:
    """The document's root node; None for an empty document."""
    try:
        root: Node | None = loader.get_single_node()
    except yaml.YAMLError as exc:
        raise yaml_error(exc, text, filename) from None
    return root


def yaml_error(exc: yaml.YAMLError, text: str, filename: str) -> ScheduleError:
    """PyYAML's multi-line message as one line at the line it points to."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = " ".join(str(exc.problem or "syntax error").split())
        context = f" ({' '.join(str(exc.context).split())})" if exc.context else ""
        return ScheduleError(f"{filename}:{line}: malformed YAML: {problem}{context}")
    # reader errors carry a character position instead of a mark
    position = int(getattr(exc, "position", 0))
    line = text.count("\n", 0, position) + 1
    reason = " ".join(str(getattr(exc, "reason", "unreadable text")).split())
    return ScheduleError(f"{filename}:{line}: malformed YAML: {reason}")


class NodeReader:
    """Turns nodes into typed values or located errors; the format's reader builds on it."""

    def __init__(self, loader: BoundedLoader, filename: str) -> None:
        self._loader = loader
        self._filename = filename

    def fail(self, node: Node, path: str, message: str) -> ScheduleError:
        where = f"{self._filename}:{node.start_mark.line + 1}:"
        return ScheduleError(f"{where} {path}: {message}" if path else f"{where} {message}")

    def string(self, node: Node, path: str) -> str:
        value = self.scalar(node, path)
        if not isinstance(value, str):
            raise self.wrong_type(node, path, "a string", value)
        return value

    def integer(self, node: Node, path: str) -> int:
        value = self.scalar(node, path)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.wrong_type(node, path, "an integer", value)
        return value

    # --- structure -------------------------------------------------------------------------

    def scalar(self, node: Node, path: str) -> object:
        if isinstance(node, SequenceNode):
            raise self.wrong_type(node, path, "a single value", [])
        if isinstance(node, MappingNode):
            raise self.wrong_type(node, path, "a single value", {})
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = " ".join(str(getattr(exc, "problem", exc)).split())
            raise self.fail(node, path, f"unreadable value: {problem}") from None

    def sequence(self, node: Node, path: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            raise self.wrong_type(node, path, "a list", self.peek(node))
        return list(node.value)

    def mapping(
        self, node: Node, path: str, allowed: tuple[str, ...], required: tuple[str, ...]
    ) -> dict[str, Node]:
        """The values of a mapping by key, refusing unknown, duplicate and missing keys."""
        if not isinstance(node, MappingNode):
            raise self.wrong_type(node, path, "a mapping", self.peek(node))
        fields: dict[str, Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self.fail(key_node, path or "top level", "merge keys (<<) are not supported")
            key = self.scalar(key_node, path) if isinstance(key_node, ScalarNode) else None
            key_path = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str) or key not in allowed:
                shown = repr(key) if isinstance(key, str) else "a non-string key"
                raise self.fail(
                    key_node,
                    key_path if isinstance(key, str) else path,
                    f"unknown key {shown}; expected one of {', '.join(allowed)}",
                )
            if key in fields:
                raise self.fail(
                    key_node,
                    key_path,
                    f"duplicate key (first at line {fields[key].start_mark.line + 1})",
                )
            fields[key] = value_node
        for key in required:
            if key not in fields:
                raise self.fail(node, path, f"missing required key {key!r}")
        return fields

    def optional(
        self,
        fields: dict[str, Node],
        key: str,
        path: str,
        read: Callable[[Node, str], _T],
        default: _T,
    ) -> _T:
        return read(fields[key], path) if key in fields else default

    def check(self, node: Node, path: str, parse: Callable[[], _T]) -> _T:
        """Run a parser that raises `UsageError`, and give its message this node's location."""
        try:
            return parse()
        except UsageError as exc:
            raise self.fail(node, path, str(exc)) from None

    def peek(self, node: Node) -> object:
        if isinstance(node, SequenceNode):
            return []
        if isinstance(node, MappingNode):
            return {}
        return self.scalar(node, "")

    def wrong_type(self, node: Node, path: str, expected: str, value: object) -> ScheduleError:
        got = _TYPE_NAMES.get(type(value), type(value).__name__)
        hint = "; quote it" if expected == "a string" and isinstance(value, bool | int | float) else ""
        return self.fail(node, path, f"expected {expected}, got {got}{hint}")
