"""What each field of a schedule means: its values read from YAML nodes, with located errors.

The schedule's shape (which mapping holds which keys, defaults, variants) is
core/schedule.py's; this reader knows the values those keys take: a source, a
duration, a priority, a time zone, a name, the pools, the windows and a
signature policy. Each refusal names the node's line and the field's path.
"""

from __future__ import annotations

import re

from yaml.nodes import Node, ScalarNode

from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.schedule_yaml import BoundedLoader, NodeReader
from modelsync.core.signature import Mode, Trust, parse_mode
from modelsync.core.units import parse_duration
from modelsync.core.windows import ALWAYS, CronWindow, Window, load_zone, validate_cron

MIN_PRIORITY, MAX_PRIORITY = 0, 1000

# A Kubernetes label value (pools come from the `accelerator.pool` label); names share it.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_SIGNATURE_KEYS = ("mode", "public_keys", "certificate_chain", "identities")
_WINDOW_KEYS = ("cron", "duration", "timezone")


class FieldReader(NodeReader):
    """The values a schedule's fields take; core/schedule.py's reader builds the format's shape on it."""

    def __init__(self, loader: BoundedLoader, filename: str, known_pools: frozenset[str] | None) -> None:
        """`known_pools`: the pools that exist, when known; another is refused as a likely typo."""
        super().__init__(loader, filename)
        self._known_pools = known_pools

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
