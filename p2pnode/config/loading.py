"""Loading a configuration file: every section parsed by its declarations, then each section's own
rules and the rules across sections (checks.py); and the settings reference of docs/config.md,
generated from the same declarations."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

from ..options import (
    ConfigError,
    default_of,
    is_required,
    parse_section,
    toml_literal,
    unknown_key,
)
from ..wire.keystore import KeyFileError, load_key
from .checks import check_config
from .sections import SECTIONS, Config

# Settings that existed once, and why they do not any more: a config naming one is told so.
REMOVED = {
    ("transport", "heartbeat_ivl_ms"): "removed: ZMTP heartbeats made libzmq abort the daemon when a "
    "connection whose queue was full (recv_hwm) broke (libzmq issues 3937, 4364, 4767); see keepalive_s",
    ("transport", "heartbeat_timeout_ms"): "removed with heartbeat_ivl_ms; see keepalive_s",
    ("node", "step_slowdown"): "renamed [node].slowdown: an emulated slower device is slower at the end of "
    "each round (graph step, evaluation) too, and slowdown stretches both",
}


def load_config(path: str | Path, *, load_identity: bool = True, check_learning: bool = True) -> Config:
    """Read, check and return a node configuration; ConfigError lists every problem found.
    `check_learning=False` skips the checks that import the learning stack (torch, seconds of
    CPU) or list `[data].path`: enough for `status` and `stop`, which only look for the running
    node."""
    path = Path(path)
    source = str(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(source, ["file not found"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc.strerror or exc}"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"not valid TOML: {exc}"]) from None

    base = path.resolve().parent
    problems: list[str] = []
    for name in raw:
        if name not in SECTIONS:
            problems.append(f"[{name}]: {unknown_key(name, list(SECTIONS), 'section')}")
    sections = {
        name: parse_section(name, cls, raw.get(name, {}), base, problems, REMOVED) for name, cls in SECTIONS.items()
    }
    if problems:
        raise ConfigError(source, problems)
    config = Config(source=path, **sections)
    problems = check_config(config, raw, base, check_learning)
    identity = None
    if load_identity:
        try:
            identity = load_key(config.node.key)
        except KeyFileError as exc:
            problems.append(f"[node].key: {exc}")
    if problems:
        raise ConfigError(source, problems)
    return dataclasses.replace(config, identity=identity)


def reference_markdown() -> str:
    """The settings reference of docs/config.md, generated from the declarations above."""
    lines = []
    for name, cls in SECTIONS.items():
        lines += [f"### [{name}]", "", "| key | value | default | meaning |", "|---|---|---|---|"]
        for spec in dataclasses.fields(cls):
            default = "*required*" if is_required(spec) else toml_literal(default_of(spec))
            lines.append(f"| `{spec.name}` | {spec.metadata['kind'].describe()} | {default} | {spec.metadata['doc']} |")
        lines.append("")
    return "\n".join(lines)
