"""How the `modelsync` process ends (`modelsync/__main__.py` `run_and_exit`): without the
interpreter's teardown, but with everything that teardown does that a user could notice.

Each case runs a child Python that calls the entry as the console script does, some
with `main` replaced by a stand-in so the exit itself is what is tested.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import IO

import pytest

from modelsync.errors import ExitCode

#: an object whose finalizer says when the interpreter's teardown reaches it
_TEARDOWN_WITNESS = """
import atexit, sys
class Witness:
    def __del__(self):
        sys.stderr.write("teardown ran\\n")
witness = Witness()
atexit.register(lambda: sys.stdout.write("exit handler ran\\n"))
sys.stdout.write("written, not flushed\\n")
sys.argv = ["modelsync", "--version"]
import modelsync.__main__ as entry
"""


def child(code: str, stdout: int | IO[str] = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """Run `code` with stdout buffered, as it is for a command whose output goes to a pipe or file."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60
    )


@pytest.mark.parametrize(("entry", "torn_down"), [("entry.run_and_exit()", False), ("entry.main()", True)])
def test_the_command_ends_without_the_teardown_yet_runs_exit_handlers_and_flushes_its_output(
    entry: str, torn_down: bool
) -> None:
    """`main()` (what tests call in-process) still ends the Python way, which is the control."""
    done = child(_TEARDOWN_WITNESS + entry)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "written, not flushed"
    assert lines[1].startswith("modelsync ")  # the version
    assert lines[-1] == "exit handler ran"
    assert ("teardown ran" in done.stderr) is torn_down


def test_the_exit_code_of_a_failed_command_is_kept() -> None:
    done = child(
        "import sys\nsys.argv = ['modelsync', 'pull', 'not-a-source', '--no-such-flag']\n"
        "import modelsync.__main__ as entry\nentry.run_and_exit()\n"
    )

    assert done.returncode == ExitCode.USAGE, done.stderr


def test_a_thread_still_running_is_waited_for_as_python_would() -> None:
    done = child(
        "import sys, threading, time\nimport modelsync.__main__ as entry\n"
        "def late():\n    time.sleep(0.5)\n    print('thread done')\n"
        "entry.main = lambda: threading.Thread(target=late).start()\nentry.run_and_exit()\n"
    )

    assert (done.returncode, done.stdout) == (0, "thread done\n"), done.stderr


def test_output_that_cannot_be_flushed_ends_with_pythons_status_120() -> None:
    with open("/dev/full", "w") as full:
        done = child(
            "import sys\nimport modelsync.__main__ as entry\n"
            "entry.main = lambda: sys.stdout.write('no room for this')\nentry.run_and_exit()\n",
            stdout=full,
        )

    assert done.returncode == 120, done.stderr
