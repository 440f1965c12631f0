"""Settings precedence: flag > environment > config file > default; bad values name their origin."""

from __future__ import annotations

import ssl
from dataclasses import fields
from pathlib import Path

import pytest

from modelsync.adapters.http.tls import check_ca_bundle
from modelsync.config import Settings, load_settings
from modelsync.errors import CaBundleError, UsageError


def test_defaults_apply_when_nothing_is_given() -> None:
    s = load_settings({}, {})
    assert s == Settings()
    assert s.cache_dir == Path("/model-cache")
    assert s.addressing_style == "path"


def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    config = tmp_path / "modelsync.toml"
    config.write_text('concurrency = 3\npart_size_bytes = "8Mi"\nregion = "file-region"\n')
    env = {"MODELSYNC_CONCURRENCY": "7", "AWS_REGION": "env-region"}
    s = load_settings({"concurrency": 11}, env, config)
    assert s.concurrency == 11
    assert s.region == "env-region"
    assert s.part_size_bytes == 8 * 1024 * 1024
    s = load_settings({}, {}, config)
    assert (s.concurrency, s.region) == (3, "file-region")


def test_the_legacy_default_region_variable_is_honoured() -> None:
    assert load_settings({}, {"AWS_DEFAULT_REGION": "eu-1"}).region == "eu-1"


@pytest.mark.parametrize(
    ("env", "origin"),
    [
        ({"MODELSYNC_CONCURRENCY": "0"}, "MODELSYNC_CONCURRENCY"),
        ({"MODELSYNC_PART_SIZE": "lots"}, "MODELSYNC_PART_SIZE"),
        ({"MODELSYNC_INSECURE": "maybe"}, "MODELSYNC_INSECURE"),
        ({"MODELSYNC_ADDRESSING_STYLE": "sideways"}, "MODELSYNC_ADDRESSING_STYLE"),
    ],
)
def test_a_bad_environment_value_is_a_usage_error_naming_the_variable(
    env: dict[str, str], origin: str
) -> None:
    with pytest.raises(UsageError, match=origin):
        load_settings({}, env)


def test_unknown_keys_in_the_config_file_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("concurency = 3\n")
    with pytest.raises(UsageError, match="unknown setting"):
        load_settings({}, {}, config)


def test_a_missing_or_broken_config_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_settings({}, {}, tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("concurrency = = 3")
    with pytest.raises(UsageError, match="cannot be read"):
        load_settings({}, {}, broken)


def test_a_relative_cache_dir_is_made_absolute(tmp_path: Path) -> None:
    s = load_settings({}, {"MODELSYNC_CACHE_DIR": "rel/cache"})
    assert s.cache_dir.is_absolute()


#: base64 of bytes that start like a DER certificate (an ASN.1 SEQUENCE) and are not one
NOT_QUITE_A_CERTIFICATE = "-----BEGIN CERTIFICATE-----\nMIIBAAECAwQFBgcICQ==\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# REPLACE_WITH_PRIVATE_CA_PEM\n", "holds no PEM certificate"),
        ("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n", "holds no PEM certificate"),
        ("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
         "holds no PEM certificate"),
        (None, "does not exist"),
    ],
)
def test_a_ca_bundle_without_a_certificate_fails_when_settings_are_read(
    tmp_path: Path, text: str | None, message: str
) -> None:
    """A placeholder left in the CA ConfigMap is exit 2 for every command, before any connection."""
    bundle = tmp_path / "ca.crt"
    if text is not None:
        bundle.write_text(text)
    with pytest.raises(CaBundleError, match=f"AWS_CA_BUNDLE.*{message}"):
        load_settings({}, {"AWS_CA_BUNDLE": str(bundle)})


def test_a_ca_bundle_is_loaded_only_where_tls_is_set_up(tmp_path: Path) -> None:
    """Reading settings only looks for a certificate; `check_ca_bundle`, called where a TLS
    context is built, loads the bundle and refuses one that looks like a certificate but is not."""
    bundle = tmp_path / "ca.crt"
    bundle.write_text(NOT_QUITE_A_CERTIFICATE)
    assert load_settings({}, {"AWS_CA_BUNDLE": str(bundle)}).ca_bundle == str(bundle)
    with pytest.raises(CaBundleError, match="holds no PEM certificate"):
        check_ca_bundle(str(bundle))


def test_a_ca_bundle_swapped_for_a_broken_one_is_judged_again(tmp_path: Path) -> None:
    """The loaded bundle is remembered per version of the file, not per path."""
    system = Path(ssl.get_default_verify_paths().openssl_cafile)
    if not system.is_file():
        pytest.skip(f"no system CA bundle at {system}")
    bundle = tmp_path / "ca.crt"
    bundle.write_bytes(system.read_bytes())
    check_ca_bundle(str(bundle))
    bundle.write_text(NOT_QUITE_A_CERTIFICATE)
    with pytest.raises(CaBundleError, match="holds no PEM certificate"):
        check_ca_bundle(str(bundle))


def test_pool_node_name_and_allowed_prefixes_are_settings_like_every_other(tmp_path: Path) -> None:
    env = {
        "MODELSYNC_POOL": "b300-serving",
        "MODELSYNC_NODE_NAME": "gpu-b300-07",
        "MODELSYNC_ALLOWED_PREFIXES": "s3://models/extra/, s3://team/ s3://lab/x/",
    }
    s = load_settings({}, env)
    assert (s.pool, s.node_name) == ("b300-serving", "gpu-b300-07")
    assert s.allowed_prefixes == ("s3://models/extra/", "s3://team/", "s3://lab/x/")
    s = load_settings({"pool": "spark", "allowed_prefixes": ("s3://flag/",)}, env)
    assert (s.pool, s.node_name, s.allowed_prefixes) == ("spark", "gpu-b300-07", ("s3://flag/",))
    config = tmp_path / "modelsync.toml"
    config.write_text('pool = "a100"\nallowed_prefixes = ["s3://file/"]\n')
    s = load_settings({}, {"MODELSYNC_POOL": ""}, config)  # empty means not given
    assert (s.pool, s.allowed_prefixes) == ("a100", ("s3://file/",))


def test_no_module_but_config_reads_a_modelsync_environment_variable() -> None:
    """Every MODELSYNC_* variable is a Settings field, read by `load_settings` and nowhere else."""
    import ast

    import modelsync

    package = Path(modelsync.__file__).parent
    readers = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "config.py" and path.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            key = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                key = node.args[0] if node.func.attr in ("get", "pop", "setdefault", "getenv") else None
            elif isinstance(node, ast.Subscript):
                key = node.slice
            if isinstance(key, ast.Constant) and str(key.value).startswith("MODELSYNC_"):
                readers.append(f"{path.relative_to(package.parent)}:{node.lineno}: {key.value}")
    assert readers == []
    assert {f.metadata["env"] for f in fields(Settings)} >= {
        "MODELSYNC_POOL",
        "MODELSYNC_NODE_NAME",
        "MODELSYNC_ALLOWED_PREFIXES",
    }
