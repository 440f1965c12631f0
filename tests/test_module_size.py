"""No module of the package grows past what a reader takes in at one sitting (about 400 lines).

A module that long is doing several jobs; split it by job, as config.py,
core/schedule.py, core/plan.py, the cache adapter and the data plane were.
"""

from __future__ import annotations

from pathlib import Path

import modelsync

PACKAGE = Path(modelsync.__file__).parent
MAX_LINES = 420


def test_no_module_is_longer_than_about_400_lines() -> None:
    too_long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            too_long[name] = lines
    assert too_long == {}
