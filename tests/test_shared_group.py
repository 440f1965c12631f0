"""A daemon and init containers share the cache as different uids of one group.

Root creates the cache the way a daemon would, under a restrictive umask; a
forked child then drops to another uid in the cache's group and must be able to
use everything: read the index, record a use, pin, take locks, evict.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_warm import SOURCE, make_ready

from modelsync.adapters.cache import Cache
from modelsync.core.refs import parse_source
from modelsync.engine.catalog import open_catalog
from modelsync.engine.evict import evict

OTHER_UID, SHARED_GID = 54321, 54321


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other uids can reach (pytest's own tmp tree is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="modelsync-shared-", dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_other_user(work: Callable[[], None]) -> int:
    """Run `work` in a forked child as another uid of the shared group; its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        status = 1
        try:
            os.setgroups([])
            os.setgid(SHARED_GID)
            os.setuid(OTHER_UID)
            work()
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch uids")
def test_another_uid_of_the_cache_group_can_use_and_evict_what_root_created(shared_dir: Path) -> None:
    root = shared_dir / "cache"
    root.mkdir()
    os.chown(root, 0, SHARED_GID)
    os.chmod(root, 0o2775)
    old = os.umask(0o022)
    try:
        make_ready(root)
        with open_catalog(Cache(root)):
            pass  # the index exists, created by root
    finally:
        os.umask(old)
    ref = parse_source(SOURCE)

    def use_and_evict() -> None:
        cache = Cache(root)
        cache.touch(ref)
        assert cache.last_used(ref) is not None
        cache.pin(ref, True)
        cache.pin(ref, False)
        with open_catalog(cache) as catalog:
            assert [v.model for v in catalog.views()] == [ref.model_id]
            assert evict(cache, catalog, [ref.model_id]).evicted == (ref.model_id,)

    assert as_other_user(use_and_evict) == 0
    assert not (root / ref.cache_path).exists()
    assert Cache(root).load_record(ref) is None
