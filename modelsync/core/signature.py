"""OpenSSF model signatures (OMS v1.0): the policy, and what a verified signature must match.

A signature is a Sigstore bundle (`model.sig` at the model's prefix) whose DSSE
envelope carries an in-toto statement listing every file with its SHA-256. The
adapter (adapters/oms.py) checks the envelope against the trusted keys or
certificate chain and hands back a `SignedModel`; this module decides, without
I/O, whether the files a pull fetched are exactly those the signer listed.

Policy: per bucket or prefix, one of

- `required`   an unsigned model, a bad signature, an untrusted signer, or a file
               not listed or not matching is refused (exit 5), nothing is published;
- `if-present` a signature that is there must verify as above; a model without one is pulled;
- `off`        signatures are not looked at (the default).

The most specific scope wins; a rule that names no keys, chain or identities
inherits them from the next less specific rule that does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum
from typing import NamedTuple

from modelsync.core.refs import ModelRef
from modelsync.core.scope import parse_scope
from modelsync.errors import ConfigError, SignedContentError, UntrustedSignatureError, UsageError

DEFAULT_SIGNATURE_NAME = "model.sig"


class Mode(StrEnum):
    REQUIRED = "required"
    IF_PRESENT = "if-present"
    OFF = "off"


def parse_mode(text: str) -> Mode:
    try:
        return Mode(text.strip())
    except ValueError:
        raise UsageError(f"signature policy {text!r} is not one of required, if-present, off") from None


class Trust(NamedTuple):
    """What a signature must chain to, and whom it may name."""

    #: PEM public keys (elliptic curve P-256/384/521) that may have signed
    public_keys: tuple[str, ...] = ()
    #: PEM certificates (root and intermediates) a signing certificate must chain to
    certificate_chain: tuple[str, ...] = ()
    #: allowed signers: a certificate's subject alternative names or common name, or a key's
    #: `sha256:<hex>` fingerprint; empty allows whoever the keys or chain vouch for
    identities: tuple[str, ...] = ()

    @property
    def anchored(self) -> bool:
        return bool(self.public_keys or self.certificate_chain)


class SignatureRule(NamedTuple):
    #: `bucket/prefix/` (or `bucket/`) the rule covers; "" covers everything
    scope: str
    mode: Mode
    trust: Trust = Trust()

    def covers(self, ref: ModelRef) -> bool:
        return f"{ref.bucket}/{ref.prefix}".startswith(self.scope)


def scope_of(text: str) -> str:
    """`s3://bucket/`, `s3://bucket/prefix`, `bucket/prefix/` or `*` as a scope (core/scope.py)."""
    return parse_scope(text, "signature scope")


def resolve(rules: tuple[SignatureRule, ...], ref: ModelRef) -> SignatureRule:
    """The rule for `ref`: the most specific scope's mode, with trust inherited where it names none."""
    matching = sorted((r for r in rules if r.covers(ref)), key=lambda r: len(r.scope), reverse=True)
    if not matching:
        return SignatureRule("", Mode.OFF)
    rule = matching[0]
    trust = next((r.trust for r in matching if r.trust.anchored), rule.trust)
    identities = next((r.trust.identities for r in matching if r.trust.identities), ())
    rule = rule._replace(trust=trust._replace(identities=identities))
    if rule.mode is not Mode.OFF and not rule.trust.anchored:
        raise ConfigError(
            f"signature policy {rule.mode} for {ref.uri} names no trusted public key or certificate "
            "chain; set signature_public_keys or signature_certificate_chain"
        )
    return rule


def parse_rules(text: str) -> tuple[SignatureRule, ...]:
    """Rules from JSON (the environment, or the config file's `[[signature_rules]]` tables)."""
    tables = rule_tables(text, "signature")
    return tuple(rule_from(raw, f"signature_rules[{i}]") for i, raw in enumerate(tables))


def rule_tables(text: str, what: str) -> list[object]:
    """The JSON list of `what` (signature, manifest) rule tables; each is checked by its parser."""
    try:
        doc = json.loads(text) if text.strip() else []
    except ValueError as exc:
        raise UsageError(f"{what} rules are not JSON ({exc})") from None
    if not isinstance(doc, list):
        raise UsageError(f"{what} rules must be a list of tables with scope and mode")
    return doc


_RULE_KEYS = frozenset({"scope", "mode", "public_keys", "certificate_chain", "identities"})


def rule_from(raw: object, where: str) -> SignatureRule:
    """One rule from a mapping `{scope, mode, public_keys, certificate_chain, identities}`."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: expected a table with scope and mode")
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if not isinstance(raw.get("scope"), str) or not isinstance(raw.get("mode"), str):
        raise UsageError(f"{where}: scope and mode are required strings")
    return SignatureRule(
        scope=scope_of(raw["scope"]),
        mode=parse_mode(raw["mode"]),
        trust=Trust(
            public_keys=_strings(raw, "public_keys", where),
            certificate_chain=_strings(raw, "certificate_chain", where),
            identities=_strings(raw, "identities", where),
        ),
    )


def _strings(raw: Mapping[str, object], key: str, where: str) -> tuple[str, ...]:
    value = raw.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise UsageError(f"{where}.{key}: expected a list of strings")
    return tuple(value)


class SignedModel(NamedTuple):
    """A signature whose envelope verified: who signed, and what they listed."""

    #: how `ls` and messages name the signer
    signer: str
    #: every name the signer answers to, for the allowed identities
    names: frozenset[str]
    #: file path -> lowercase hex SHA-256
    digests: Mapping[str, str]
    #: paths (files or directories) the signer chose not to sign
    ignore_paths: tuple[str, ...] = ()


def check_identity(signed: SignedModel, trust: Trust) -> None:
    if trust.identities and not signed.names & set(trust.identities):
        raise UntrustedSignatureError(
            f"signed by {signed.signer}, which is not an allowed identity "
            f"({', '.join(trust.identities)}); allow it in signature_identities or sign as one of them"
        )


def check_contents(signed: SignedModel, sha256s: Mapping[str, str], signature_name: str) -> None:
    """Every file (but the signature and what it ignores) is listed with its digest, and none is missing."""
    hint = "; the bucket does not hold what was signed: republish the model and sign it again"
    for path in sorted(sha256s):
        if path == signature_name or _ignored(path, signed.ignore_paths):
            continue
        expected = signed.digests.get(path)
        if expected is None:
            raise SignedContentError(f"{path} is not listed in the signature by {signed.signer}{hint}")
        if sha256s[path] != expected:
            raise SignedContentError(
                f"{path} does not match the signature by {signed.signer} "
                f"(SHA-256 {sha256s[path]}, signed {expected}){hint}"
            )
    missing = sorted(set(signed.digests) - set(sha256s))
    if missing:
        raise SignedContentError(
            f"{missing[0]} is signed by {signed.signer} but missing from the model{hint}"
        )


def _ignored(path: str, ignore_paths: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in ignore_paths)
