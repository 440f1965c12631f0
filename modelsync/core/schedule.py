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
      - name: qwen3-32b                  # one name, a source per set of pools
        variants:
          - {pools: [b300-serving, spark-serving], source: s3://models/qwen3-32b/nvfp4/}
          - {pools: [a100-serving], source: s3://models/qwen3-32b/fp8/, variant: fp8}
        windows: [always]

An entry with `variants` becomes one `ScheduledModel` per variant, sharing the
entry's name, windows and other fields; a pool in two variants of one entry is
refused, so each pool has at most one source per name.

Everything is checked here, at load, so that a daemon never discovers a bad
cron expression at fire time: a schedule either loads completely or is refused
with one `ScheduleError` line `FILE:LINE: FIELD.PATH: what is wrong` (a
`UsageError`, so the CLI exits 2; its code `bad_schedule` marks it in the
daemon's logs and metrics). The daemon can then keep its last good schedule
and report the bad one.

The text is hostile until proven otherwise (it arrives by GitOps from many
hands): its size is checked here before parsing; `core/schedule_yaml.py` uses
only the safe YAML loader and refuses alias bombs without ever expanding them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import yaml
from yaml.nodes import Node

from modelsync.core.refs import ModelRef, parse_source
from modelsync.core.schedule_fields import FieldReader
from modelsync.core.schedule_variants import Located, read_variants, refuse_duplicates
from modelsync.core.schedule_yaml import BoundedLoader, compose, value_of, yaml_error
from modelsync.core.signature import Mode, SignatureRule, Trust
from modelsync.core.windows import Window
from modelsync.errors import ScheduleError

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
    "schedule_too_large",
]

SCHEDULE_VERSION = 1
#: refused before parsing; a thousand models take well under 200 KiB
MAX_SCHEDULE_BYTES = 1024 * 1024


def schedule_too_large(filename: str, size_bytes: int) -> ScheduleError:
    """The refusal of a schedule of `size_bytes` (the file's whole size, not what was read of it)."""
    return ScheduleError(
        f"{filename}:1: the schedule is {size_bytes} bytes, over the limit of "
        f"{MAX_SCHEDULE_BYTES}; split it or remove unused entries"
    )

DEFAULT_TIMEZONE = "UTC"
DEFAULT_LEAD_S = 30 * 60.0
DEFAULT_KEEP_S = 2 * 3600.0
DEFAULT_PRIORITY = 50

_TOP_KEYS = ("version", "timezone", "defaults", "models")
_DEFAULTS_KEYS = ("lead", "keep", "priority", "signature")
_MODEL_KEYS = ("name", "source", "pools", "priority", "lead", "keep", "windows", "signature", "variants")


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
    #: which of its name's `variants` this is (the entry's `variant`, else its source's last
    #: path segment); None for an entry with a plain `source`
    variant: str | None = None

    @property
    def label(self) -> str:
        """What logs and tables call this model: its name, else its source URI."""
        return self.name if self.name is not None else self.source.uri

    @property
    def shown(self) -> str:
        """The label with the variant, as tables show it: `qwen3-32b [nvfp4]`."""
        return self.label if self.variant is None else f"{self.label} [{self.variant}]"


@dataclass(frozen=True, slots=True)
class Schedule:
    version: int
    timezone: str
    models: tuple[ScheduledModel, ...]

    def for_pool(self, pool: str) -> tuple[ScheduledModel, ...]:
        """The models that target `pool`, in file order."""
        return tuple(model for model in self.models if pool in model.pools)

    def named(self, name: str) -> tuple[ScheduledModel, ...]:
        """Every entry (each variant) called `name`."""
        return tuple(model for model in self.models if model.name == name)

    def source_of(self, model_id: str) -> ModelRef | None:
        """The source of the entry whose cache entry is `model_id`, if the schedule lists one."""
        return next((m.source for m in self.models if m.source.model_id == model_id), None)


def load_schedule(text: str, filename: str, known_pools: frozenset[str] | None = None) -> Schedule:
    """Parse and validate a schedule; any problem is one `ScheduleError` line with its location.

    `known_pools`, when given, is the set of pools that exist (from the cluster);
    a model naming another pool is then refused, which catches typos that would
    otherwise silently stage nothing.
    """
    size_bytes = len(text.encode("utf-8", errors="surrogatepass"))
    if size_bytes > MAX_SCHEDULE_BYTES:
        raise schedule_too_large(filename, size_bytes)
    try:
        # the reader refuses non-printable characters while it is constructed
        loader = BoundedLoader(text, filename)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, text, filename) from None
    try:
        root = compose(loader, text, filename)
        if root is None:
            raise ScheduleError(
                f"{filename}:1: the schedule is empty; it needs 'version: {SCHEDULE_VERSION}' "
                "and a 'models' list"
            )
        return _Reader(loader, filename, known_pools).schedule(root)
    finally:
        loader.dispose()


@dataclass(frozen=True, slots=True)
class _Defaults:
    timezone: str
    lead_s: float
    keep_s: float
    priority: int
    #: (mode, trust) for models that name none
    signature: tuple[Mode, Trust] | None = None


class _Reader(FieldReader):
    """The format's shape: the top-level keys, the defaults, each entry and its variants."""

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
            model
            for index, node in enumerate(self.sequence(fields["models"], "models"))
            for model in self.model(node, f"models[{index}]", defaults)
        )
        refuse_duplicates(self, models)
        return Schedule(version=version, timezone=timezone, models=tuple(located[0] for located in models))

    def defaults(self, node: Node, base: _Defaults) -> _Defaults:
        fields = self.mapping(node, "defaults", _DEFAULTS_KEYS, required=())
        return _Defaults(
            timezone=base.timezone,
            lead_s=self.optional(fields, "lead", "defaults.lead", self.duration, base.lead_s),
            keep_s=self.optional(fields, "keep", "defaults.keep", self.duration, base.keep_s),
            priority=self.optional(fields, "priority", "defaults.priority", self.priority, base.priority),
            signature=self.optional(fields, "signature", "defaults.signature", self.signature, None),
        )

    def model(self, node: Node, path: str, defaults: _Defaults) -> list[Located]:
        """One entry: a model, or one model per variant; each with where its source and name are."""
        fields = self.mapping(node, path, _MODEL_KEYS, required=("windows",))
        name = self.optional(fields, "name", f"{path}.name", self.label_value, None)
        signature = self.optional(
            fields, "signature", f"{path}.signature", self.signature, defaults.signature
        )
        base = ScheduledModel(
            source=parse_source("s3://unset/unset/"),
            name=name,
            pools=(),
            priority=self.optional(fields, "priority", f"{path}.priority", self.priority, defaults.priority),
            lead_s=self.optional(fields, "lead", f"{path}.lead", self.duration, defaults.lead_s),
            keep_s=self.optional(fields, "keep", f"{path}.keep", self.duration, defaults.keep_s),
            windows=self.windows(fields["windows"], f"{path}.windows", defaults.timezone),
            line=node.start_mark.line + 1,
        )
        name_node = fields.get("name")
        if "variants" not in fields:
            for key in ("source", "pools"):
                if key not in fields:
                    raise self.fail(node, path, f"missing required key {key!r} (or give 'variants')")
            source = self.source(fields["source"], f"{path}.source")
            model = replace(
                base, source=source, pools=self.pools(fields["pools"], f"{path}.pools"),
                signature=_rule(source, signature),
            )
            return [(model, f"{path}.source", fields["source"], name_node)]
        for key in ("source", "pools"):
            if key in fields:
                raise self.fail(
                    value_of(node, key), f"{path}.{key}",
                    "give either source and pools, or variants (each with its own source and pools)",
                )
        if name is None:
            raise self.fail(node, f"{path}.variants", "variants need the entry's name; add name:")
        return [
            (replace(model, signature=_rule(model.source, signature)), where, source_node, name_node)
            for model, where, source_node in read_variants(self, fields["variants"], f"{path}.variants", base)
        ]


def _rule(source: ModelRef, signature: tuple[Mode, Trust] | None) -> SignatureRule | None:
    return None if signature is None else SignatureRule(f"{source.bucket}/{source.prefix}", *signature)
