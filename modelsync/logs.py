"""The daemon's log lines on stderr (the container log): JSON for collectors, text for people.

Either way an error carries its `code` (`internal` when none was given), so an
alert can match on it; every `extra` field of a record is logged as a field.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: attributes every LogRecord has; anything else was passed in `extra` and is logged as a field
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every `extra` field (e.g. `code`)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS})
        if record.levelno >= logging.ERROR:
            entry.setdefault("code", "internal")
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """`time level message [code=...]`: the code of an error stays visible without JSON."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        code = getattr(record, "code", None)
        if code is None and record.levelno >= logging.ERROR:
            code = "internal"
        return text if code is None else f"{text} [code={code}]"


def configure_logging(json_logs: bool) -> None:
    """Logs go to stderr (the container log); the root logger gets one handler, set here only."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for noisy in ("aiobotocore", "botocore", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
