"""Entry point: answer a warm `pull` without importing the full command line, else run it."""

import os
import sys


def main() -> None:
    from modelsync.warm import try_warm_pull

    path = try_warm_pull(sys.argv[1:], os.environ)
    if path is not None:
        print(path)
        return
    from modelsync.cli import app

    app()


if __name__ == "__main__":
    main()
