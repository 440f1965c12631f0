"""A pull's last word before the model is made ready: the model's signature and its safetensors headers.

The signature policy (core/signature.py) decides whether the model's `model.sig`
is looked at. When it is, the pull hashes every file with SHA-256 as its parts
land (adapters/digest.py) and this module compares those digests with the ones
the verified signature lists. A resumed pull takes the SHA-256s its journal kept;
only files this pull neither downloaded nor journaled with one (hard-linked copies
of cached files, a ready model checked again) are hashed here from disk. When the
policy is off, nothing here costs anything and `model-signing` is never imported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from modelsync.adapters.model_files import ModelDir
from modelsync.core.parts import FileWork, RemoteFile
from modelsync.core.record import CompletionRecord
from modelsync.core.refs import ModelRef
from modelsync.core.signature import Mode, SignatureRule, SignedModel, check_contents, check_identity
from modelsync.engine.ready import Problem, full_check
from modelsync.engine.scrub import raise_first, scrub
from modelsync.errors import LocalStorageError, SignatureError, UnreadableFileError, UnsignedModelError


class SignatureCheck:
    """One pull's signature work: find the signature, verify its envelope once, compare digests."""

    def __init__(self, ref: ModelRef, rule: SignatureRule, signature_name: str) -> None:
        self.ref = ref
        self.rule = rule
        self.name = signature_name
        #: whether this pull has a signature to check, so it must compute SHA-256s
        self.active = False
        self._signed: SignedModel | None = None

    def select(self, files: list[RemoteFile]) -> list[RemoteFile]:
        """The model's files, after refusing an unsigned one under `required` (before any byte is
        fetched) and noting whether there is a signature to check."""
        if self.rule.mode is Mode.OFF:
            return files
        signature = [f for f in files if f.path == self.name]
        if not signature:
            if self.rule.mode is Mode.REQUIRED:
                raise UnsignedModelError(
                    f"{self.ref.uri} is unsigned: no {self.name} under the prefix, and the signature "
                    "policy for it is required; sign it (modelsync publish --sign-key) or change the policy"
                )
            return files
        from modelsync.adapters.oms import require_library

        require_library()
        self.active = True
        return files

    def ordered(self, works: Iterable[FileWork]) -> list[FileWork]:
        """The signature's file first, so a bad signature fails the pull before the weights arrive."""
        return sorted(works, key=lambda w: w.file.path != self.name)

    def signed(self, staging_dir: Path) -> SignedModel:
        """The verified signature (blocking: reads the staged bundle and checks it once)."""
        if self._signed is None:
            from modelsync.adapters.oms import verify_bundle

            signed = verify_bundle(staging_dir / self.name, self.rule.trust, f"{self.ref.uri}{self.name}")
            check_identity(signed, self.rule.trust)
            self._signed = signed
        return self._signed


def final_check(
    staging_dir: Path,
    files: Iterable[RemoteFile],
    signature: SignatureCheck,
    sha256s: Mapping[str, str],
) -> str | None:
    """Refuse to make ready a model whose signature or safetensors headers do not hold; the signer.

    Blocking (run it in a thread). `sha256s` are the digests computed while the
    files downloaded; any file without one is hashed here.
    """
    sizes = {f.path: f.size_bytes for f in files}
    signer = None
    if signature.active:
        signed = signature.signed(staging_dir)
        digests = dict(sha256s)
        for path in sorted(set(sizes) - set(digests)):
            digests[path] = _sha256(staging_dir, path, sizes[path])
        check_contents(signed, digests, signature.name)
        signer = signed.signer
    raise_first(scrub(staging_dir, sizes.items()))
    return signer


def _sha256(root: Path, path: str, size_bytes: int) -> str:
    with ModelDir(root) as model:
        try:
            digest = model.digest(path, size_bytes, sha256=True)
        except UnreadableFileError as exc:
            raise LocalStorageError(f"{root / path}: {exc}") from None
    return digest.sha256 or ""


def full_recheck(
    ref: ModelRef, root: Path, record: CompletionRecord, rule: SignatureRule, signature_name: str
) -> list[Problem]:
    """`verify --full` of a ready model: every byte against the record, the safetensors headers,
    and, when the policy looks at signatures, the signature against every file (one read each)."""
    paths = {f.path for f in record.files}
    signed = rule.mode is not Mode.OFF and signature_name in paths
    sha256s: dict[str, str] | None = {} if signed else None
    problems = full_check(root, record, sha256s)
    bad = {p.path for p in problems}  # gone, not a file, unreadable: reported once, never opened again
    problems += scrub(root, [(f.path, f.size_bytes) for f in record.files if f.path not in bad])
    if rule.mode is Mode.REQUIRED and signature_name not in paths:
        problems.append(Problem(signature_name, "missing, and the signature policy requires one"))
    if not signed or sha256s is None or any(p.path == signature_name for p in problems):
        return problems  # a missing, resized or planted (symlinked) signature is reported already
    check = SignatureCheck(ref, rule, signature_name)
    try:
        verified = check.signed(root)
        if set(sha256s) == paths:  # files that failed to hash are already reported
            check_contents(verified, sha256s, signature_name)
    except SignatureError as exc:
        problems.append(Problem(signature_name, str(exc)))
    return problems
