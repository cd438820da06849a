"""[log] and [metrics]: where the node logs, and the Prometheus endpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..options import CheckContext, FilePath, Integer, Number, Section, Text, option


@dataclass(frozen=True, kw_only=True)
class LogSettings(Section):
    level: str = option(Text(choices=("debug", "info", "warning", "error")), "info", "least severe level written")
    format: str = option(Text(choices=("text", "json")), "text", "`json`: one JSON object per line")
    file: Path | None = option(FilePath(), None, "append logs to this file instead of standard error")


@dataclass(frozen=True, kw_only=True)
class MetricsSettings(Section):
    listen: str | None = option(
        Text(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}", what="HOST:PORT"),
        None,
        "serve Prometheus metrics at `http://HOST:PORT/metrics` (port 0: any); unset: off",
    )
    max_connections: int = option(
        Integer(1, 100_000),
        16,
        "connections served at once; a newcomer beyond it takes the place of the oldest one still "
        "sending its request, which is closed, or is closed itself if all are being answered "
        "(counted in `p2pnode_metrics_connections_closed_total`)",
    )
    request_timeout_s: float = option(
        Number(0.1, 3600), 5.0, "a connection's request and answer must be done within this; slower ones are closed"
    )
    max_request_bytes: int = option(
        Integer(256, 1 << 20),
        8192,
        "bytes of a request read at most (a scrape's is a few hundred); the rest is ignored",
    )

    @property
    def host_port(self) -> tuple[str, int] | None:
        if self.listen is None:
            return None
        host, port = self.listen.rsplit(":", 1)
        return host.strip("[]"), int(port)

    def check(self, context: CheckContext) -> list[str]:
        if self.host_port is not None and self.host_port[1] > 65535:
            return [f"[metrics].listen: port {self.host_port[1]} is not a usable port"]
        return []
