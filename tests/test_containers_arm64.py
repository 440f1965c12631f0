"""The arm64 image (the DGX Spark pool) built and run under qemu: on demand, `pytest -m arm64 -s`.

scripts/image builds it offline from the arm64 wheels of the lock (scripts/wheelhouse
--arch arm64) on an arm64 stand-in base, every arm64 instruction emulated by
qemu-user-static through binfmt_misc: minutes, hence its own marker. Then, in the image:
`modelsync --version`, and a cold and a warm pull of a small model from SeaweedFS as the
read-only identity, as uid 10001 with a read-only root. The amd64 image runs the same
steps natively beside it, for comparison. Each prints its figures (build time, size, the
venv's size, wall times inside the image); emulated code runs several times slower than
a Spark node, so the arm64 figures bound the image's behaviour, not its speed there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.objects import upload
from support.podman import Podman, build_image, fill_wheelhouse, stand_in_base, unavailable_reason
from support.pods import prepare_cache
from support.s3env import S3Env
from support.safetensors import shard

pytestmark = [pytest.mark.arm64, pytest.mark.timeout(7200)]

BINFMT = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
MiB = 1024 * 1024
#: runs ARGV in the container and prints its exit code and wall time as JSON
TIMED = (
    "import json, subprocess, sys, time; t = time.monotonic(); "
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "print(json.dumps({'code': done.returncode, 's': time.monotonic() - t, 'out': done.stdout, "
    "'err': done.stderr[-2000:]}))"
)


@pytest.mark.parametrize("arch", ["arm64", "amd64"])
def test_the_image_builds_from_the_locks_wheels_of_its_arch_and_pulls_a_model_in_it(
    tmp_path: Path, seaweed_admin: S3Env, seaweed_reader: S3Env, seaweed_bucket: str, arch: str
) -> None:
    emulated = arch == "arm64" and not BINFMT.exists()
    reason = unavailable_reason() or ("qemu-aarch64 is not registered (binfmt)" if emulated else None)
    if reason:
        pytest.skip(reason)
    files = {"config.json": b"{}", "model.safetensors": shard(4 * MiB)}
    upload(seaweed_admin, seaweed_bucket, "org/tiny/r1/", files)
    podman = Podman()
    try:
        wheelhouse = tmp_path / "wheelhouse"
        fill_wheelhouse(wheelhouse, arch)
        started = time.monotonic()
        base = stand_in_base(podman, arch)
        base_s = time.monotonic() - started
        image, build_s = build_image(podman, arch, wheelhouse, base)
        found = podman.inspect(image)
        assert found["Architecture"] == arch
        script = "python -c 'import platform; print(platform.machine())'; du -sk /opt/venv"
        machine = podman("run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", script)
        assert machine.stdout.split()[0] == {"arm64": "aarch64", "amd64": "x86_64"}[arch]
        venv_mb = int(machine.stdout.split()[1]) * 1024 / 1e6

        cache = prepare_cache(tmp_path / "model-cache")
        source = f"s3://{seaweed_bucket}/org/tiny/r1/"
        run = ("run", "--rm", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
               "--security-opt", "no-new-privileges", "--entrypoint", "python")  # fmt: skip
        version = timed(podman, *run, "--network", "none", image, "-c", TIMED, "modelsync", "--version")
        assert version["code"] == 0 and version["out"].strip() == "modelsync 0.1.0", version
        store = ("--network", "host", "-v", f"{cache}:/model-cache",
                 "-e", f"AWS_ENDPOINT_URL={seaweed_reader.endpoint_url}",
                 "-e", f"AWS_ACCESS_KEY_ID={seaweed_reader.access_key_id}",
                 "-e", f"AWS_SECRET_ACCESS_KEY={seaweed_reader.secret_access_key}")  # fmt: skip
        pulls = [timed(podman, *run, *store, image, "-c", TIMED, "modelsync", "pull", source, "--quiet")
                 for _ in ("cold", "warm")]  # fmt: skip
        for pull in pulls:
            assert pull["code"] == 0 and pull["out"] == f"/model-cache/{seaweed_bucket}/org/tiny/r1\n", pull
        ready = cache / seaweed_bucket / "org/tiny/r1"
        assert {p.name: p.read_bytes() for p in ready.iterdir()} == files
        print(f"\n{arch} stand-in base {base_s:.0f} s; {image}: built in {build_s:.0f} s, "
              f"{found['Size'] / 1e6:.0f} MB (/opt/venv {venv_mb:.0f} MB); in the image: --version "
              f"{version['s']:.2f} s, "
              f"cold pull of {sum(map(len, files.values())) / MiB:.0f} MiB {pulls[0]['s']:.2f} s, "
              f"warm pull {pulls[1]['s']:.2f} s")
    finally:
        left = podman.cleanup()
        assert not left, f"left behind: {left}"


def timed(podman: Podman, *args: str) -> dict[str, object]:
    done = podman(*args, timeout_s=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout)
    return result
