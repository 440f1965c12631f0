"""The model schedule: which model revisions serve on which node pools, and when.

The file is YAML (format described in docs/schedule.md, JSON Schema in
`modelsync/schema/schedule.schema.json`):

    version: 1
    timezone: Asia/Seoul                 # default for windows; UTC if absent
    defaults: {lead: 30m, keep: 2h, priority: 50}
    models:
      - name: deepseek-v3                # optional, unique
        source: s3://models/deepseek-ai/DeepSeek-V3/2025-03-24/
        pools: [b300-serving]
        priority: 90                     # 0-1000, higher is fetched first
        lead: 45m                        # stage this long before a window opens
        keep: 1h                         # keep this long after it closes
        windows:
          - {cron: "0 8 * * mon-fri", duration: 12h, timezone: Asia/Seoul}
      - source: s3://models/Qwen/Qwen3-0.6B/2025-04-29/
        pools: [spark-serving]
        windows: [always]
        signature: required              # or {mode, public_keys, certificate_chain, identities}

Everything is checked here, at load, so that a daemon never discovers a bad
cron expression at fire time: a schedule either loads completely or is refused
with one `ScheduleError` line `FILE:LINE: FIELD.PATH: what is wrong` (a
`UsageError`, so the CLI exits 2; its code `bad_schedule` marks it in the
daemon's logs and metrics). The daemon can then keep its last good schedule
and report the bad one.

The text is hostile until proven otherwise (it arrives by GitOps from many
hands): its size is checked before parsing, only the safe YAML loader is used,
and the composer refuses alias bombs by counting aliases and the number of
nodes the document would expand to, without ever expanding it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.signature import Mode, SignatureRule, Trust, parse_mode
from modelsync.core.units import parse_duration
from modelsync.core.windows import ALWAYS, CronWindow, Window, load_zone, validate_cron
from modelsync.errors import ScheduleError, UsageError

__all__ = [
    "DEFAULT_KEEP_S",
    "DEFAULT_LEAD_S",
    "DEFAULT_PRIORITY",
    "DEFAULT_TIMEZONE",
    "MAX_SCHEDULE_BYTES",
    "SCHEDULE_VERSION",
    "Schedule",
    "ScheduledModel",
    "load_schedule",
]

SCHEDULE_VERSION = 1
#: refused before parsing; a thousand models take well under 200 KiB
MAX_SCHEDULE_BYTES = 1024 * 1024
#: nodes the document would have with every alias expanded (a billion-laughs guard)
MAX_EXPANDED_NODES = 100_000
#: aliases in the whole document; a legitimate schedule needs a handful at most
MAX_ALIASES = 100

DEFAULT_TIMEZONE = "UTC"
DEFAULT_LEAD_S = 30 * 60.0
DEFAULT_KEEP_S = 2 * 3600.0
DEFAULT_PRIORITY = 50
MIN_PRIORITY, MAX_PRIORITY = 0, 1000

_T = TypeVar("_T")

# A Kubernetes label value (pools come from the `accelerator.pool` label); names share it.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_TOP_KEYS = ("version", "timezone", "defaults", "models")
_DEFAULTS_KEYS = ("lead", "keep", "priority", "signature")
_MODEL_KEYS = ("name", "source", "pools", "priority", "lead", "keep", "windows", "signature")
_SIGNATURE_KEYS = ("mode", "public_keys", "certificate_chain", "identities")
_WINDOW_KEYS = ("cron", "duration", "timezone")
_TYPE_NAMES: dict[type, str] = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
    list: "a list",
    dict: "a mapping",
}


@dataclass(frozen=True, slots=True)
class ScheduledModel:
    """One model entry, with the defaults already applied."""

    source: ModelRef
    name: str | None
    pools: tuple[str, ...]
    priority: int
    lead_s: float
    keep_s: float
    windows: tuple[Window, ...]
    #: 1-based line of the entry in the schedule file, for messages about it
    line: int
    #: the model's signature policy, over the node's settings; None leaves the settings' rule
    signature: SignatureRule | None = None

    @property
    def label(self) -> str:
        """What logs and tables call this model: its name, else its source URI."""
        return self.name if self.name is not None else self.source.uri


@dataclass(frozen=True, slots=True)
class Schedule:
    version: int
    timezone: str
    models: tuple[ScheduledModel, ...]

    def for_pool(self, pool: str) -> tuple[ScheduledModel, ...]:
        """The models that target `pool`, in file order."""
        return tuple(model for model in self.models if pool in model.pools)


def load_schedule(text: str, filename: str, known_pools: frozenset[str] | None = None) -> Schedule:
    """Parse and validate a schedule; any problem is one `ScheduleError` line with its location.

    `known_pools`, when given, is the set of pools that exist (from the cluster);
    a model naming another pool is then refused, which catches typos that would
    otherwise silently stage nothing.
    """
    size_bytes = len(text.encode("utf-8", errors="surrogatepass"))
    if size_bytes > MAX_SCHEDULE_BYTES:
        raise ScheduleError(
            f"{filename}:1: the schedule is {size_bytes} bytes, over the limit of "
            f"{MAX_SCHEDULE_BYTES}; split it or remove unused entries"
        )
    try:
        # the reader refuses non-printable characters while it is constructed
        loader = _BoundedLoader(text, filename)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, filename) from None
    try:
        root = _compose(loader, text, filename)
        return _Reader(loader, filename, known_pools).schedule(root)
    finally:
        loader.dispose()


class _BoundedLoader(yaml.SafeLoader):
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


def _value_of(node: Node, key: str) -> Node:
    """The value node under `key` in an already validated mapping, for pointing at it."""
    for key_node, value_node in node.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return value_node  # type: ignore[no-any-return]  # PyYAML nodes are untyped
    return node


def _compose(loader: _BoundedLoader, text: str, filename: str) -> Node:
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, filename) from None
    if root is None:
        raise ScheduleError(
            f"{filename}:1: the schedule is empty; it needs 'version: {SCHEDULE_VERSION}' and a 'models' list"
        )
    return root


def _yaml_error(exc: yaml.YAMLError, text: str, filename: str) -> ScheduleError:
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


@dataclass(frozen=True, slots=True)
class _Defaults:
    timezone: str
    lead_s: float
    keep_s: float
    priority: int
    #: (mode, trust) for models that name none
    signature: tuple[Mode, Trust] | None = None


class _Reader:
    """Walks the node tree, turning each node into a typed value or a located error."""

    def __init__(self, loader: _BoundedLoader, filename: str, known_pools: frozenset[str] | None) -> None:
        self._loader = loader
        self._filename = filename
        self._known_pools = known_pools

    def fail(self, node: Node, path: str, message: str) -> ScheduleError:
        where = f"{self._filename}:{node.start_mark.line + 1}:"
        return ScheduleError(f"{where} {path}: {message}" if path else f"{where} {message}")

    # --- the format ---------------------------------------------------------------------

    def schedule(self, root: Node) -> Schedule:
        fields = self.mapping(root, "", _TOP_KEYS, required=())
        if "version" not in fields:
            raise self.fail(root, "version", f"missing; add 'version: {SCHEDULE_VERSION}'")
        version_node = fields["version"]
        version = self.integer(version_node, "version")
        if version != SCHEDULE_VERSION:
            raise self.fail(
                version_node,
                "version",
                f"unsupported version {version}; this modelsync reads version {SCHEDULE_VERSION}",
            )
        if "models" not in fields:
            raise self.fail(root, "models", "missing; list the models to stage")
        timezone = DEFAULT_TIMEZONE
        if "timezone" in fields:
            timezone = self.zone(fields["timezone"], "timezone")
        defaults = _Defaults(timezone, DEFAULT_LEAD_S, DEFAULT_KEEP_S, DEFAULT_PRIORITY)
        if "defaults" in fields:
            defaults = self.defaults(fields["defaults"], defaults)
        models = tuple(
            self.model(node, f"models[{index}]", defaults)
            for index, node in enumerate(self.sequence(fields["models"], "models"))
        )
        self.refuse_duplicates(models, fields["models"])
        return Schedule(version=version, timezone=timezone, models=models)

    def defaults(self, node: Node, base: _Defaults) -> _Defaults:
        fields = self.mapping(node, "defaults", _DEFAULTS_KEYS, required=())
        return _Defaults(
            timezone=base.timezone,
            lead_s=self.optional(fields, "lead", "defaults.lead", self.duration, base.lead_s),
            keep_s=self.optional(fields, "keep", "defaults.keep", self.duration, base.keep_s),
            priority=self.optional(fields, "priority", "defaults.priority", self.priority, base.priority),
            signature=self.optional(fields, "signature", "defaults.signature", self.signature, None),
        )

    def model(self, node: Node, path: str, defaults: _Defaults) -> ScheduledModel:
        fields = self.mapping(node, path, _MODEL_KEYS, required=("source", "pools", "windows"))
        name = self.optional(fields, "name", f"{path}.name", self.label_value, None)
        source = self.source(fields["source"], f"{path}.source")
        signature = self.optional(
            fields, "signature", f"{path}.signature", self.signature, defaults.signature
        )
        return ScheduledModel(
            source=source,
            name=name,
            pools=self.pools(fields["pools"], f"{path}.pools"),
            priority=self.optional(fields, "priority", f"{path}.priority", self.priority, defaults.priority),
            lead_s=self.optional(fields, "lead", f"{path}.lead", self.duration, defaults.lead_s),
            keep_s=self.optional(fields, "keep", f"{path}.keep", self.duration, defaults.keep_s),
            windows=self.windows(fields["windows"], f"{path}.windows", defaults.timezone),
            line=node.start_mark.line + 1,
            signature=(
                None if signature is None else SignatureRule(f"{source.bucket}/{source.prefix}", *signature)
            ),
        )

    def signature(self, node: Node, path: str) -> tuple[Mode, Trust]:
        """`required | if-present | off`, or a mapping with the mode and its trust (key paths on the node)."""
        if isinstance(node, ScalarNode):
            text = self.string(node, path)
            return self.check(node, path, lambda: parse_mode(text)), Trust()
        fields = self.mapping(node, path, _SIGNATURE_KEYS, required=("mode",))
        mode_text = self.string(fields["mode"], f"{path}.mode")
        mode = self.check(fields["mode"], f"{path}.mode", lambda: parse_mode(mode_text))
        return mode, Trust(
            public_keys=self.optional(fields, "public_keys", f"{path}.public_keys", self.strings, ()),
            certificate_chain=self.optional(
                fields, "certificate_chain", f"{path}.certificate_chain", self.strings, ()
            ),
            identities=self.optional(fields, "identities", f"{path}.identities", self.strings, ()),
        )

    def strings(self, node: Node, path: str) -> tuple[str, ...]:
        items = self.sequence(node, path)
        values = tuple(self.string(item, f"{path}[{i}]") for i, item in enumerate(items))
        for i, (item, value) in enumerate(zip(items, values, strict=True)):
            if not value:
                raise self.fail(item, f"{path}[{i}]", "empty; name a file or an identity")
        return values

    def pools(self, node: Node, path: str) -> tuple[str, ...]:
        items = self.sequence(node, path)
        if not items:
            raise self.fail(node, path, "empty; name at least one pool")
        pools: list[str] = []
        for index, item in enumerate(items):
            pool = self.label_value(item, f"{path}[{index}]")
            if pool in pools:
                raise self.fail(item, f"{path}[{index}]", f"duplicate pool {pool!r}")
            if self._known_pools is not None and pool not in self._known_pools:
                known = ", ".join(sorted(self._known_pools)[:20]) or "none"
                raise self.fail(item, f"{path}[{index}]", f"unknown pool {pool!r}; known: {known}")
            pools.append(pool)
        return tuple(pools)

    def windows(self, node: Node, path: str, default_zone: str) -> tuple[Window, ...]:
        items = self.sequence(node, path)
        if not items:
            raise self.fail(node, path, "empty; use [always] or at least one cron window")
        return tuple(self.window(item, f"{path}[{index}]", default_zone) for index, item in enumerate(items))

    def window(self, node: Node, path: str, default_zone: str) -> Window:
        if isinstance(node, ScalarNode):
            if self.scalar(node, path) == "always":
                return ALWAYS
            raise self.fail(node, path, "expected 'always' or a mapping with cron and duration")
        fields = self.mapping(node, path, _WINDOW_KEYS, required=("cron", "duration"))
        cron = self.string(fields["cron"], f"{path}.cron")
        self.check(fields["cron"], f"{path}.cron", lambda: validate_cron(cron))
        duration_s = self.duration(fields["duration"], f"{path}.duration")
        if duration_s <= 0:
            raise self.fail(fields["duration"], f"{path}.duration", "must be longer than 0s")
        zone = self.optional(fields, "timezone", f"{path}.timezone", self.zone, default_zone)
        return CronWindow(cron=cron, duration_s=duration_s, timezone=zone)

    def refuse_duplicates(self, models: tuple[ScheduledModel, ...], node: Node) -> None:
        """Two entries for one source (or one name) would fight over the same cache entry."""
        items = self.sequence(node, "models")
        seen_sources: dict[ModelRef, int] = {}
        seen_names: dict[str, int] = {}
        for index, model in enumerate(models):
            first = seen_sources.setdefault(model.source, index)
            if first != index:
                raise self.fail(
                    _value_of(items[index], "source"),
                    f"models[{index}].source",
                    f"duplicate model {model.source.uri}; already listed as models[{first}] "
                    f"(line {models[first].line})",
                )
            if model.name is not None:
                first = seen_names.setdefault(model.name, index)
                if first != index:
                    raise self.fail(
                        _value_of(items[index], "name"),
                        f"models[{index}].name",
                        f"duplicate name {model.name!r}; already used by models[{first}] "
                        f"(line {models[first].line})",
                    )

    # --- typed values -----------------------------------------------------------------------

    def source(self, node: Node, path: str) -> ModelRef:
        text = self.string(node, path)
        return self.check(node, path, lambda: parse_source(text))

    def duration(self, node: Node, path: str) -> float:
        value = self.scalar(node, path)
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self.wrong_type(node, path, "a duration such as 30m", value)
        # The node's own text, so `1:30` (a YAML 1.1 integer) is quoted as written.
        text = node.value if isinstance(node, ScalarNode) else str(value)
        return self.check(node, path, lambda: parse_duration(str(text)))

    def priority(self, node: Node, path: str) -> int:
        value = self.integer(node, path)
        if not MIN_PRIORITY <= value <= MAX_PRIORITY:
            raise self.fail(node, path, f"priority {value} is outside {MIN_PRIORITY}-{MAX_PRIORITY}")
        return value

    def zone(self, node: Node, path: str) -> str:
        name = self.string(node, path)
        self.check(node, path, lambda: load_zone(name))
        return name

    def label_value(self, node: Node, path: str) -> str:
        text = self.string(node, path)
        if not _LABEL_VALUE.match(text):
            raise self.fail(
                node,
                path,
                f"invalid name {text!r}; use 1-63 letters, digits, '.', '_' or '-', "
                "starting and ending with a letter or digit",
            )
        return text

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
