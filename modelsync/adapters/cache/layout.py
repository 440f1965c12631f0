"""Where everything of the cache lives (docs/ARCHITECTURE.md, on-disk layout version 1).

<root>/<bucket>/<prefix>/          ready models, read-only files
<root>/.modelsync/records/<slug>.json
<root>/.modelsync/staging/<slug>/  and  staging/<slug>.journal
<root>/.modelsync/locks/<slug>.lock
<root>/.modelsync/{pins,used,verified,leases,reservations}/<slug>
<root>/.modelsync/quarantine/<slug>/, <slug>.json
<root>/.modelsync/trash/
"""

from __future__ import annotations

from pathlib import Path

from modelsync.adapters import fs
from modelsync.core.refs import ModelRef

STATE_DIR = ".modelsync"
LAYOUT_VERSION = "1"


class Layout:
    """The paths of one cache root; `ensure` creates them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state_dir = root / STATE_DIR
        self.records_dir = self.state_dir / "records"
        self.staging_dir = self.state_dir / "staging"
        self.locks_dir = self.state_dir / "locks"
        self.trash_dir = self.state_dir / "trash"
        self.quarantine_dir = self.state_dir / "quarantine"
        #: pins/<slug>: the operator asked to keep the model
        self.pins_dir = self.state_dir / "pins"
        #: used/<slug>: its mtime is when the model was last pulled or touched
        self.used_dir = self.state_dir / "used"
        #: verified/<slug>: its mtime is when `verify` last found the model intact (kept
        #: beside the records, so rebuilding the index does not forget it)
        self.verified_dir = self.state_dir / "verified"
        #: leases/<slug>: a consumer holds the model until the time written inside
        self.leases_dir = self.state_dir / "leases"
        #: reservations/<slug>: disk space claimed by a running pull (valid while its lock is held)
        self.reservations_dir = self.state_dir / "reservations"
        self.index_path = self.state_dir / "index.sqlite"

    def ensure(self) -> None:
        """Create the layout; fails with LocalStorageError when the root is unusable."""
        with fs.storage_errors(self.root):
            for d in (
                self.records_dir,
                self.staging_dir,
                self.locks_dir,
                self.trash_dir,
                self.quarantine_dir,
                self.pins_dir,
                self.used_dir,
                self.verified_dir,
                self.leases_dir,
                self.reservations_dir,
            ):
                fs.make_dirs(d, up_to=self.root)
            layout = self.state_dir / "layout"
            if not layout.exists():
                fs.write_atomic(layout, LAYOUT_VERSION.encode() + b"\n")

    def exists(self) -> bool:
        """Whether a cache was ever made here (its state directory is there)."""
        return self.state_dir.is_dir()

    def ready_path(self, ref: ModelRef) -> Path:
        return self.root / ref.cache_path

    def record_path(self, ref: ModelRef) -> Path:
        return self.records_dir / f"{ref.slug}.json"
