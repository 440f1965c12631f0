"""The signature policy and the comparison of signed digests with a pull's, as pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelsync.config import load_settings
from modelsync.core.refs import parse_source
from modelsync.core.signature import (
    Mode,
    SignatureRule,
    SignedModel,
    Trust,
    check_contents,
    check_identity,
    parse_rules,
    resolve,
    scope_of,
)
from modelsync.engine.rules import pull_rules
from modelsync.errors import SignedContentError, UntrustedSignatureError, UsageError

KEY = Trust(public_keys=("/trust/release.pem",))
TEAM = Trust(public_keys=("/trust/team.pem",))


@pytest.mark.parametrize(
    ("text", "scope"),
    [
        ("*", ""),
        ("s3://models/", "models/"),
        ("s3://models/org", "models/org/"),
        ("models/org/", "models/org/"),
    ],
)
def test_scopes_are_normalised_to_bucket_and_prefix_with_a_trailing_slash(text: str, scope: str) -> None:
    assert scope_of(text) == scope


@pytest.mark.parametrize("text", ["s3://", "s3://a//b/"])
def test_a_scope_that_names_no_bucket_is_refused(text: str) -> None:
    with pytest.raises(UsageError):
        scope_of(text)


RULES = (
    SignatureRule("", Mode.IF_PRESENT, KEY),
    SignatureRule("models/", Mode.REQUIRED),
    SignatureRule("models/team/", Mode.REQUIRED, Trust(public_keys=TEAM.public_keys, identities=("ops",))),
    SignatureRule("models/team/scratch/", Mode.OFF),
)


@pytest.mark.parametrize(
    ("source", "mode", "trust"),
    [
        ("s3://other/m/", Mode.IF_PRESENT, KEY),
        ("s3://models/m/", Mode.REQUIRED, KEY),  # inherits the global key
        ("s3://models-2/m/", Mode.IF_PRESENT, KEY),  # a scope matches whole segments only
        ("s3://models/team/m/", Mode.REQUIRED, Trust(public_keys=TEAM.public_keys, identities=("ops",))),
        ("s3://models/team/scratch/m/", Mode.OFF, Trust(public_keys=TEAM.public_keys, identities=("ops",))),
    ],
)
def test_the_most_specific_rule_wins_and_trust_is_inherited(source: str, mode: Mode, trust: Trust) -> None:
    rule = resolve(RULES, parse_source(source))
    assert (rule.mode, rule.trust) == (mode, trust)


def test_no_rule_means_off_and_a_policy_without_trust_is_a_usage_error() -> None:
    ref = parse_source("s3://models/m/")
    assert resolve((), ref).mode is Mode.OFF
    with pytest.raises(UsageError, match="names no trusted public key"):
        resolve((SignatureRule("", Mode.REQUIRED),), ref)


def test_rules_from_the_config_file_and_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "modelsync.toml"
    config.write_text(
        'signature = "if-present"\n'
        'signature_public_keys = ["/trust/a.pem", "/trust/b.pem"]\n'
        "[[signature_rules]]\n"
        'scope = "s3://models/prod/"\n'
        'mode = "required"\n'
        'identities = ["release@example.com"]\n'
    )
    settings = load_settings({}, {"MODELSYNC_SIGNATURE_IDENTITIES": "x@example.com"}, config)
    rule = pull_rules(settings, parse_source("s3://models/prod/m/")).signature
    assert rule.mode is Mode.REQUIRED
    assert rule.trust == Trust(("/trust/a.pem", "/trust/b.pem"), (), ("release@example.com",))
    other = pull_rules(settings, parse_source("s3://other/m/")).signature
    assert other.trust.identities == ("x@example.com",)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{", "not JSON"),
        ('{"scope": "*"}', "list of tables"),
        ('[{"scope": "*", "mode": "sometimes"}]', "not one of required, if-present, off"),
        ('[{"scope": "*", "mode": "off", "keys": []}]', "unknown key"),
        ('[{"mode": "off"}]', "scope and mode are required"),
        ('[{"scope": "*", "mode": "off", "public_keys": [1]}]', "list of strings"),
    ],
)
def test_bad_rules_are_one_usage_error(text: str, reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        parse_rules(text)


def test_a_bad_policy_in_the_environment_names_the_variable() -> None:
    with pytest.raises(UsageError, match="MODELSYNC_SIGNATURE: bad value"):
        load_settings({}, {"MODELSYNC_SIGNATURE": "maybe"})


# ---- what the signature must match ----------------------------------------------------------

SIGNED = SignedModel(
    signer="key release.pem (sha256:ab)",
    names=frozenset({"sha256:abcd", "release.pem"}),
    digests={"config.json": "11", "w/shard.safetensors": "22"},
    ignore_paths=("model.sig", ".git"),
)


def test_exactly_the_signed_files_pass_and_the_signature_and_ignored_paths_are_skipped() -> None:
    check_contents(
        SIGNED,
        {"config.json": "11", "w/shard.safetensors": "22", "model.sig": "ff", ".git/HEAD": "ee"},
        "model.sig",
    )


@pytest.mark.parametrize(
    ("sha256s", "reason"),
    [
        (
            {"config.json": "11", "w/shard.safetensors": "23"},
            "w/shard.safetensors does not match the signature",
        ),
        ({"config.json": "11", "w/shard.safetensors": "22", "extra.bin": "33"}, "extra.bin is not listed"),
        ({"config.json": "11", "w/shard.safetensors": "22", ".gitx": "33"}, ".gitx is not listed"),
        ({"config.json": "11"}, "w/shard.safetensors is signed by key release.pem"),
    ],
)
def test_a_changed_extra_or_missing_file_is_refused_naming_it(sha256s: dict[str, str], reason: str) -> None:
    with pytest.raises(SignedContentError, match=reason):
        check_contents(SIGNED, sha256s, "model.sig")


def test_allowed_identities_restrict_the_signer() -> None:
    check_identity(SIGNED, Trust(public_keys=("k",)))
    check_identity(SIGNED, Trust(public_keys=("k",), identities=("sha256:abcd",)))
    with pytest.raises(
        UntrustedSignatureError, match=r"signed by key release.pem \(sha256:ab\), which is not"
    ):
        check_identity(SIGNED, Trust(public_keys=("k",), identities=("ops@example.com",)))


PATHS = st.sampled_from(["a", "b/c", "d.bin", "e/f/g"])
DIGESTS = st.sampled_from(["00", "11", "22"])


@given(st.dictionaries(PATHS, DIGESTS, max_size=4), st.dictionaries(PATHS, DIGESTS, max_size=4))
def test_contents_pass_exactly_when_the_pulled_files_are_the_signed_ones(
    signed: dict[str, str], pulled: dict[str, str]
) -> None:
    model = SignedModel("key k", frozenset(), signed, ("model.sig",))
    try:
        check_contents(model, {**pulled, "model.sig": "ff"}, "model.sig")
    except SignedContentError:
        assert pulled != signed
    else:
        assert pulled == signed
