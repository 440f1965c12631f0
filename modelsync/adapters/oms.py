"""OpenSSF model signatures through the `model-signing` library: check a bundle, make one.

`model_signing.verifying.Config.verify` checks a bundle and then re-hashes the
model directory. A pull has already hashed every byte as it landed, so this
module runs only the first half: the library's verifier checks the Sigstore
bundle (DSSE envelope, signature, certificate chain) and returns the signed
manifest, whose digests core/signature.py compares with the pull's SHA-256s.
Signing likewise builds the in-toto payload from digests `publish` computed in
its one pass over each file. Both use the library's signer and verifier classes
(`model_signing._signing`, pinned to model-signing 1.x in pyproject.toml), never
bundle crypto of our own, so a signature made here verifies with the
`model_signing` command unchanged, and the reverse.

The library (and sigstore, cryptography, pyOpenSSL under it) is an optional
extra, `modelsync[sign]`, imported only when a signature is in play: a pull
with signatures off never loads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

from modelsync.core.signature import SignedModel, Trust
from modelsync.errors import ConfigError, SignatureError, UntrustedSignatureError, UsageError

HASH_TYPE = "sha256"


def require_library() -> None:
    """Fail with one line, before any transfer, when the `sign` extra is not installed."""
    if importlib.util.find_spec("model_signing") is None:
        raise UsageError(
            "verifying or making model signatures needs the model-signing library: "
            "pip install 'modelsync[sign]'"
        )


@contextlib.contextmanager
def _foreign_errors(what: str) -> Iterator[None]:
    """The library raises ValueError, cryptography's and pyOpenSSL's errors, and KeyError on a
    malformed bundle; whatever it raises while checking one means the bundle is not trusted."""
    try:
        yield
    except (ModuleNotFoundError, ImportError) as exc:
        raise UsageError(f"model-signing is not usable ({exc}); pip install 'modelsync[sign]'") from None
    except OSError as exc:  # a trusted key or chain named in the settings cannot be read
        raise ConfigError(
            f"cannot read {exc.filename or 'a trust file'}: {exc.strerror or exc}; "
            "check the signature settings"
        ) from None
    except Exception as exc:  # the foreign boundary: any failure there means "not verified"
        detail = (str(exc) or type(exc).__name__).splitlines()[0][:300]
        raise UntrustedSignatureError(f"{what} ({detail})") from None


def verify_bundle(signature_path: Path, trust: Trust, origin: str) -> SignedModel:
    """Check the bundle at `signature_path` against `trust`; the signed digests, or an error.

    Keys are tried in order; a bundle carrying a certificate chain is checked
    against `trust.certificate_chain` only.
    """
    require_library()
    from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb

    with _foreign_errors(f"{origin} is not a readable signature bundle"):
        signature = sign_sigstore_pb.Signature.read(signature_path)
    material = signature.bundle.verification_material
    chain = material.x509_certificate_chain
    if chain is not None and chain.certificates:
        if not trust.certificate_chain:
            raise UntrustedSignatureError(
                f"{origin} is signed with a certificate, but no certificate chain is trusted"
            )
        with _foreign_errors(f"{origin} does not verify against the trusted certificate chain"):
            verifier = sign_certificate.Verifier([Path(p) for p in trust.certificate_chain])
            manifest = verifier.verify(signature)
        signer, names = _certificate_signer(chain.certificates[0].raw_bytes)
        return _signed(manifest, signer, names, origin)
    failures = []
    for key in trust.public_keys:
        try:
            with _foreign_errors(key):
                manifest = sign_ec_key.Verifier(Path(key)).verify(signature)
        except SignatureError as exc:
            failures.append(str(exc))
            continue
        fingerprint = _key_fingerprint(Path(key))
        signer = f"key {Path(key).name} (sha256:{fingerprint[:16]})"
        return _signed(manifest, signer, frozenset({f"sha256:{fingerprint}", Path(key).name}), origin)
    if not failures:
        raise UntrustedSignatureError(f"{origin} is signed with a key, but no public key is trusted")
    raise UntrustedSignatureError(
        f"{origin} is not signed by a trusted key (tried {'; '.join(failures)}); "
        "sign it with a trusted key, or trust its key in signature_public_keys"
    )


def _signed(manifest: Any, signer: str, names: frozenset[str], origin: str) -> SignedModel:
    serialization = manifest.serialization_type
    if serialization.get("method") != "files" or serialization.get("hash_type") != HASH_TYPE:
        raise UntrustedSignatureError(
            f"{origin} uses serialization {serialization.get('method')}/{serialization.get('hash_type')}; "
            "modelsync verifies files/sha256 signatures (model_signing's default)"
        )
    digests = {rd.identifier: rd.digest.digest_hex for rd in manifest.resource_descriptors()}
    ignore = tuple(str(p) for p in serialization.get("ignore_paths", ()))
    return SignedModel(signer=signer, names=names, digests=digests, ignore_paths=ignore)


def _key_fingerprint(public_key: Path) -> str:
    """SHA-256 of the key's PEM SubjectPublicKeyInfo: the hint model_signing puts in its bundles."""
    from cryptography.hazmat.primitives import serialization

    with _foreign_errors(f"public key {public_key} is unreadable"):
        key = serialization.load_pem_public_key(public_key.read_bytes())
        pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _certificate_signer(der: bytes) -> tuple[str, frozenset[str]]:
    """The signing certificate's names: subject alternative names and common name."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_der_x509_certificate(der)
    names: list[str] = []
    with contextlib.suppress(x509.ExtensionNotFound):
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        for kind in (x509.RFC822Name, x509.UniformResourceIdentifier, x509.DNSName):
            names.extend(str(v) for v in san.get_values_for_type(kind))
    names.extend(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME))
    shown = names[0] if names else cert.subject.rfc4514_string()
    return f"certificate {shown}", frozenset(names)


class Signer:
    """A loaded signing key (and certificate): made before a publish uploads anything, so a
    wrong key, password or certificate fails first, not after the upload."""

    def __init__(
        self, private_key: Path, certificate: Path | None = None, certificate_chain: Sequence[Path] = ()
    ) -> None:
        require_library()
        from model_signing._signing import sign_certificate, sign_ec_key

        what = f"{private_key} and {certificate}" if certificate is not None else str(private_key)
        try:
            self._signer = (
                sign_certificate.Signer(private_key, certificate, certificate_chain)
                if certificate is not None
                else sign_ec_key.Signer(private_key)
            )
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(f"cannot sign with {what}: {str(exc).splitlines()[0]}") from None

    def sign(self, model_name: str, sha256s: Sequence[tuple[str, str]], ignore_paths: Sequence[str]) -> bytes:
        """A bundle over `(path, hex SHA-256)` pairs, as `model_signing sign key|certificate` makes."""
        from model_signing import manifest as oms_manifest
        from model_signing._hashing import hashing as oms_hashing
        from model_signing._signing import sign_sigstore_pb, signing

        serialization = oms_manifest.SerializationType.from_args(
            {
                "method": "files",
                "hash_type": HASH_TYPE,
                "allow_symlinks": False,
                "ignore_paths": sorted(ignore_paths),
            }
        )
        items = [
            serialization.new_item(path, oms_hashing.Digest(HASH_TYPE, bytes.fromhex(digest)))
            for path, digest in sha256s
        ]
        payload = signing.Payload(oms_manifest.Manifest(model_name, items, serialization))
        signature = cast(sign_sigstore_pb.Signature, self._signer.sign(payload))  # what these signers make
        bundle_json: str = signature.bundle.to_json()
        return bundle_json.encode()
