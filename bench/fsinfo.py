"""File-system facts for the benchmark's destinations: type, free space, fresh loop-mounted XFS and ext4.

The nodes write to XFS on NVMe; a benchmark that only writes to the directory it
happens to run in measures whatever file system that is. As root, `loop_mount`
makes a sparse image, attaches it to a loop device with direct I/O,
formats it and mounts it; it unmounts and deletes it on exit
(also when the body raises). Without root it says why, so a harness can skip that
destination with a line instead of a traceback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.data import GiB
from bench.harness import BenchError

#: ext4 is initialised whole by mkfs: by default its inode tables are zeroed after mount by a kernel
#: thread (ext4lazyinit), 320 MiB for a 20 GiB image written while the first round runs, which
#: made that round the slow one for whoever ran in it; a node's cache was formatted long before
MKFS = {
    "xfs": ["mkfs.xfs", "-q", "-f"],
    "ext4": ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"],
}


def resident_bytes(paths: Sequence[Path]) -> int | None:
    """Bytes of the files in the page cache, as util-linux's fincore sees them; None without fincore."""
    if shutil.which("fincore") is None:
        return None
    if not paths:
        return 0
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(x) for x in out.split())


def why_not(kind: str) -> str | None:
    """Why a loop-mounted `kind` file system cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return f"a loop-mounted {kind} needs root (mount -o loop); run as root to measure it"
    if shutil.which(MKFS[kind][0]) is None:
        package = "xfsprogs" if kind == "xfs" else "e2fsprogs"
        return f"{MKFS[kind][0]} is missing (apt-get install -y {package})"
    return None


@contextlib.contextmanager
def loop_mount(kind: str, size_bytes: int, under: Path) -> Iterator[Path]:
    """A freshly formatted `kind` file system of `size_bytes` (sparse image in `under`), mounted."""
    if reason := why_not(kind):
        raise RuntimeError(reason)
    under.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"loop-{kind}-", dir=under))
    image, point = work / "image", work / "mnt"
    point.mkdir()
    device, mounted = "", False
    try:
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        # Direct I/O to the image: without it every page is cached twice (the loop file
        # system's and the image file's), which no NVMe device does and which doubles the
        # dirty pages the kernel throttles on.
        device = _run("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096",
                      str(image)).strip()
        _run(*MKFS[kind], device)
        _run("mount", device, str(point))
        mounted = True
        yield point
    finally:
        if mounted:
            _unmount(point)
        if device:
            subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def _unmount(point: Path) -> None:
    """Unmount, waiting a little for a killed writer's files to close; lazily as a last resort."""
    for _ in range(20):
        if subprocess.run(["umount", str(point)], check=False, capture_output=True).returncode == 0:
            return
        time.sleep(0.25)
    subprocess.run(["umount", "--lazy", str(point)], check=False, capture_output=True)


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def fs_type(path: Path) -> str:
    """The type of the filesystem holding `path`, from the longest matching /proc/mounts entry."""
    best, kind = "", "unknown"
    real = str(path.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            parts = line.split()
            point = parts[1].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) > len(best):
                best, kind = point, parts[2]
    return kind


def need_space(path: Path, want: int, what: str) -> None:
    free = shutil.disk_usage(path).free
    if free < want:
        raise BenchError(f"{what}: need {want / GiB:.1f} GiB free in {path}, "
                         f"have {free / GiB:.1f} GiB (try --small or free some space)")
