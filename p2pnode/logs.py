"""Logging setup: readable text or one JSON object per line, to standard error or a file."""

from __future__ import annotations

import json
import logging
import sys
import time

from .config import LogSettings

__all__ = ["configure_logging", "JsonFormatter"]

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


def configure_logging(settings: LogSettings, node_id: str) -> None:
    handler = logging.FileHandler(settings.file) if settings.file else logging.StreamHandler(sys.stderr)
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
