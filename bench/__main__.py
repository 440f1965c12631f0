"""`python -m bench [ENTRY] [OPTIONS]`: the entry points behind `scripts/bench`.

No entry (or an option first) is `compare`, so `scripts/bench --only ...` keeps working.
"""

from __future__ import annotations

import importlib
import os
import sys

ENTRIES = {"compare": "compare", "curves": "curves", "scale": "scale", "cache-scale": "cache_scale",
           "signature": "signature", "signature-tail": "signature_tail",
           "signature-probe": "signature_probe", "startup": "startup",
           "ceiling": "ceiling", "page-cache": "page_cache"}


def main(argv: list[str]) -> int:
    if (argv and argv[0] in ("-h", "--help")) or not argv or argv[0].startswith("-"):
        entry, rest = "compare", argv
    elif argv[0] in ENTRIES:
        entry, rest = argv[0], argv[1:]
    else:
        print(f"bench: error: unknown entry point {argv[0]!r}; choose from {', '.join(ENTRIES)} "
              "(or options for compare)", file=sys.stderr)
        return 2
    # scripts/bench put the repository on PYTHONPATH for this process only: contenders and
    # their children start from the caller's environment, as a user's pull would.
    os.environ.pop("PYTHONPATH", None)
    module = importlib.import_module(f"bench.{ENTRIES[entry]}")
    code: int = module.main(rest)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
