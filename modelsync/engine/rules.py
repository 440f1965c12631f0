"""What a pull must obey, resolved in one place for every way into a pull.

A model is made ready by `pull` (the init container's fast path and the full
command), `prefetch` (through the daemon or, without one, here), the daemon's
own schedule and its tenants' pulls, `verify --repair` and the demo. Each of
them used to gather its own options, and one (`prefetch` without a daemon)
skipped the schedule's signature rule: an unsigned model was made ready that
the daemon would have refused. Now every entry calls `pull_rules` and hands the
result to `engine.ensure.ensure_ready`, which takes nothing else: there is no
way into a pull that has not been through this function.

Imported by the warm path, so it stays cheap: no S3, no YAML (a schedule is
passed in already parsed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from modelsync.config import Settings
from modelsync.core.completeness import ManifestMode, ManifestRule, resolve_manifest_rule
from modelsync.core.refs import ModelRef
from modelsync.core.signature import Mode, SignatureRule, Trust, resolve

if TYPE_CHECKING:
    from modelsync.config_values import CacheBudget
    from modelsync.core.schedule import Schedule


_IF_PRESENT = ManifestRule("", ManifestMode.IF_PRESENT)


class PullRules(NamedTuple):
    """The effective rules of one pull of one source; built by `pull_rules` only.

    Node-wide settings (budget, bandwidth cap, concurrency, timeouts) travel in
    `settings`; what is decided per bucket, prefix or schedule entry has a field
    of its own, already resolved for `source`.
    """

    source: ModelRef
    #: the node's settings the pull runs with
    settings: Settings
    #: the signature policy for `source`: mode, trusted keys or chain, allowed identities
    signature: SignatureRule
    #: hold the model in use this many seconds once it is ready; None: no lease
    lease_s: float | None = None
    #: the manifest policy for `source`: whether a prefix without a manifest may be pulled
    manifest: ManifestRule = _IF_PRESENT

    @property
    def signed_only(self) -> bool:
        """Only a model whose signature was verified may be served as `source`."""
        return self.signature.mode is Mode.REQUIRED

    @property
    def signature_name(self) -> str:
        return self.settings.signature_name

    @property
    def budget(self) -> CacheBudget | None:
        """The cache budget the pull makes room under; None: only the disk's free space."""
        return self.settings.cache_budget

    @property
    def max_bandwidth_bytes_per_s(self) -> int:
        """The pull's download cap; 0: none."""
        return self.settings.max_bandwidth_bytes_per_s


def pull_rules(
    settings: Settings,
    source: ModelRef,
    schedule: Schedule | None = None,
    *,
    lease_s: float | None = None,
) -> PullRules:
    """The rules a pull of `source` obeys: the settings, and the schedule's entry for it when there is one.

    Signature policy: the most specific of the schedule entry's rule (its scope is the
    model itself, and it wins over a settings rule of the same scope), the settings'
    `signature_rules`, and the settings' global mode; trust and identities are
    inherited from the nearest rule that names them (core/signature.py `resolve`).

    Manifest policy (core/completeness.py): the most specific of the settings'
    `manifest_rules`, then the global `manifest`. A new per-scope rule is one more
    field of `PullRules`, resolved here the same way; no entry changes, and none can
    miss it.
    """
    scheduled = _scheduled_rules(schedule, source)
    trust = Trust(
        settings.signature_public_keys, settings.signature_certificate_chain, settings.signature_identities
    )
    default = SignatureRule("", settings.signature, trust)
    signature = resolve((*scheduled, default, *settings.signature_rules), source)
    # the settings' global mode last: a rule for every scope ("*") overrides it
    manifest = resolve_manifest_rule((*settings.manifest_rules, ManifestRule("", settings.manifest)), source)
    return PullRules(
        source=source, settings=settings, signature=signature, lease_s=lease_s, manifest=manifest
    )


def _scheduled_rules(schedule: Schedule | None, source: ModelRef) -> tuple[SignatureRule, ...]:
    for model in schedule.models if schedule is not None else ():
        if model.source == source and model.signature is not None:
            return (model.signature,)
    return ()
