"""Logging setup: readable text or one JSON object per line, to standard error or a file."""

from __future__ import annotations

import json
import logging
import sys
import time

from ..files import describe_os_error
from ..operations.settings import LogSettings

__all__ = ["configure_logging", "JsonFormatter", "LogFile"]

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """{"ts": ..., "level": ..., "logger": ..., "msg": ..., **extra fields}."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class LogFile(logging.FileHandler):
    """`[log].file`. A record that cannot be written (a full disk) is lost, and said so once on
    standard error, not with logging's traceback for every record; again after a good write."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._failing = False
        self._failed = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed = False
        super().emit(record)
        if not self._failed:
            self._failing = False

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self._failed = True
        if not self._failing:
            self._failing = True
            print(
                f"p2pnode: [log].file: cannot write {self.baseFilename}: {describe_os_error(error)}; "
                "log records are lost until it can",
                file=sys.stderr,
            )


def configure_logging(settings: LogSettings, node_id: str) -> None:
    """Raises OSError if `[log].file` cannot be opened."""
    handler = LogFile(settings.file) if settings.file else logging.StreamHandler(sys.stderr)
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        formatter = logging.Formatter(
            f"%(asctime)s.%(msecs)03d {node_id} %(levelname)s %(name)s: %(message)s", "%H:%M:%S"
        )
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger("p2pnode")
    root.handlers[:] = [handler]
    root.setLevel(settings.level.upper())
    root.propagate = False
