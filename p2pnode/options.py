"""The option framework of the node's configuration: each setting is declared once, as a dataclass
field with its kind (how a TOML value is checked and read), default and documentation; loading,
error messages and docs/config.md all come from those declarations.

A section is a frozen dataclass of `option(...)` fields deriving from `Section`; a rule between
settings of that one section (`peer_timeout_s` above 2 × `ping_interval_s`) is its `check` method,
beside the declarations it relates. Rules that need two or more sections live in p2pnode/config/checks.py.

This module sits below every part that declares a section (wire/, discovery/, learning/,
operations/ and config/ import it), so it cannot live inside config/, on a floor above them."""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from protocol import MessageType


class ConfigError(Exception):
    """The configuration cannot be used; `problems` holds one line per problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"invalid configuration {source}:\n" + "\n".join(f"  {p}" for p in problems))


class Invalid(ValueError):
    """Raised by a kind's parse(); the message completes "[section].key: ..."."""


# --- kinds of values ------------------------------------------------------------------------


class Kind:
    def parse(self, value: Any, base: Path) -> Any:
        raise NotImplementedError

    def resolvedefault_of(self, default: Any, base: Path) -> Any:
        """The value a missing key takes (paths are made relative to the config file)."""
        return default

    def describe(self) -> str:
        raise NotImplementedError


def type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


class Integer(Kind):
    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high

    def parse(self, value, base):
        if type(value) is not int:
            raise Invalid(f"expected an integer, got {type_name(value)}")
        if not self.low <= value <= self.high:
            raise Invalid(f"must be between {self.low} and {self.high}, got {value}")
        return value

    def describe(self):
        return f"integer, {self.low} to {self.high}"


class Number(Kind):
    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def parse(self, value, base):
        if type(value) not in (int, float):
            raise Invalid(f"expected a number, got {type_name(value)}")
        if not (math.isfinite(value) and self.low <= value <= self.high):
            raise Invalid(f"must be between {self.low:g} and {self.high:g}, got {value}")
        return float(value)

    def describe(self):
        return f"number, {self.low:g} to {self.high:g}"


class IntegerChoice(Kind):
    def __init__(self, *choices: int) -> None:
        self.choices = choices

    def parse(self, value, base):
        if type(value) is not int:
            raise Invalid(f"expected an integer, got {type_name(value)}")
        if value not in self.choices:
            raise Invalid(f"must be {' or '.join(map(str, self.choices))}, got {value}")
        return value

    def describe(self):
        return "integer, " + " or ".join(map(str, self.choices))


class Flag(Kind):
    def parse(self, value, base):
        if type(value) is not bool:
            raise Invalid(f"expected true or false, got {type_name(value)}")
        return value

    def describe(self):
        return "true or false"


class Text(Kind):
    def __init__(self, pattern: str | None = None, choices: tuple[str, ...] = (), what: str = "string") -> None:
        self.pattern = re.compile(pattern) if pattern else None
        self.choices = choices
        self.what = what

    def parse(self, value, base):
        if type(value) is not str:
            raise Invalid(f"expected {self.what}, got {type_name(value)}")
        if self.choices and value not in self.choices:
            raise Invalid(f"must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        if self.pattern and not self.pattern.fullmatch(value):
            raise Invalid(f"{value!r} is not {self.what}")
        return value

    def describe(self):
        if self.choices:
            return "one of " + ", ".join(f'`"{c}"`' for c in self.choices)
        return self.what


class FilePath(Kind):
    """A path; relative paths are taken from the directory of the config file."""

    def parse(self, value, base):
        if type(value) is not str or not value:
            raise Invalid(f"expected a path, got {type_name(value)}")
        path = Path(value).expanduser()
        return path if path.is_absolute() else (base / path)

    def resolvedefault_of(self, default, base):
        return None if default is None else self.parse(str(default), base)

    def describe(self):
        return "path (relative to the config file's directory)"


class Endpoint(Kind):
    """A ZeroMQ TCP endpoint `tcp://HOST:PORT`."""

    _FORM = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):([0-9]{1,5})")

    def __init__(self, bind: bool) -> None:
        self.bind = bind  # binding allows "*" and port 0; advertising needs a reachable address

    def parse(self, value, base):
        if type(value) is not str:
            raise Invalid(f'expected an address like "tcp://127.0.0.1:7000", got {type_name(value)}')
        match = self._FORM.fullmatch(value)
        if not match:
            raise Invalid(f"{value!r} is not an address of the form tcp://HOST:PORT")
        host, port = match.group(1), int(match.group(2))
        if port > 65535 or (port == 0 and not self.bind):
            raise Invalid(f"port {port} is not a usable port")
        if self.bind and host != "*":
            try:
                ipaddress.ip_address(host.strip("[]"))
            except ValueError:
                if host != "localhost":
                    raise Invalid(f'bind to an IP address or "*", not the host name {host!r}') from None
        if not self.bind and (host in ("*", "0.0.0.0", "[::]")):
            raise Invalid(f"{value!r} cannot be dialled by peers; give this node's reachable address")
        return value

    def describe(self):
        return (
            "`tcp://IP:PORT` to bind (`*` for all interfaces, port 0 for any)"
            if self.bind
            else "`tcp://HOST:PORT` peers can dial"
        )


class ListOf(Kind):
    def __init__(self, item: Kind, max_len: int, unique: bool = True) -> None:
        self.item, self.max_len, self.unique = item, max_len, unique

    def parse(self, value, base):
        if type(value) is not list:
            raise Invalid(f"expected a list, got {type_name(value)}")
        if len(value) > self.max_len:
            raise Invalid(f"at most {self.max_len} entries, got {len(value)}")
        items = []
        for index, entry in enumerate(value):
            try:
                items.append(self.item.parse(entry, base))
            except Invalid as exc:
                raise Invalid(f"entry {index + 1}: {exc}") from None
        if self.unique and len(set(items)) != len(items):
            raise Invalid("entries repeat")
        return tuple(items)

    def describe(self):
        return f"list of at most {self.max_len} × {self.item.describe()}"


class BootstrapEntry(Kind):
    """A peer's address, optionally with its Ed25519 public key: `[KEY@]tcp://HOST:PORT`."""

    def parse(self, value, base):
        if type(value) is str and "@" in value and not value.startswith("tcp://"):
            key, address = value.split("@", 1)
            PublicKey().parse(key, base)
            return f"{key.lower()}@{Endpoint(bind=False).parse(address, base)}"
        return Endpoint(bind=False).parse(value, base)

    def describe(self):
        return "`tcp://HOST:PORT` peers can dial, or `KEY@tcp://HOST:PORT` with the peer's public key"


def split_bootstrap(entry: str) -> tuple[str, bytes | None]:
    """A bootstrap entry's address and the peer's Ed25519 key, if the entry names one."""
    if "@" not in entry or entry.startswith("tcp://"):
        return entry, None
    key, address = entry.split("@", 1)
    return address, bytes.fromhex(key)


class PublicKey(Kind):
    def parse(self, value, base):
        if type(value) is not str or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise Invalid(f"expected 64 hex digits of an Ed25519 public key (p2pnode keyinfo), got {value!r}")
        return bytes.fromhex(value)

    def describe(self):
        return "64 hex digits (an Ed25519 public key, as `p2pnode keyinfo` prints it)"


class Network(Kind):
    """An IP network in CIDR notation, e.g. `127.0.0.0/8`."""

    def parse(self, value, base):
        if type(value) is not str:
            raise Invalid(f'expected a network like "127.0.0.0/8", got {type_name(value)}')
        try:
            return str(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise Invalid(f"{value!r} is not an IP network in CIDR notation") from None

    def describe(self):
        return "IP network, e.g. `10.0.0.0/8`"


class FrameSizes(Kind):
    """A table from message type to a size bound in bytes."""

    def parse(self, value, base):
        if type(value) is not dict:
            raise Invalid(f"expected a table like {{ MODEL = 67108864 }}, got {type_name(value)}")
        sizes = {}
        for name, size in value.items():
            try:
                kind = MessageType(name)
            except ValueError:
                raise Invalid(
                    f"unknown message type {name!r} (known: {' '.join(t.value for t in MessageType)})"
                ) from None
            sizes[kind] = Integer(1, 1 << 40).parse(size, base)
        return sizes

    def describe(self):
        return "table of message type → bytes, e.g. `{ MODEL = 16777216 }`"


class Overrides(Kind):
    """A table of algorithm hyper-parameters, dotted keys for nested ones: `{ "graph.l2_weight" = 15 }`."""

    def parse(self, value, base):
        if type(value) is not dict:
            raise Invalid(f"expected a table like {{ warmup_rounds = 10 }}, got {type_name(value)}")
        flat: dict[str, str] = {}

        def walk(table: dict, prefix: str) -> None:
            for key, entry in table.items():
                if type(entry) is dict:  # [algorithm.settings.graph] is the same as "graph.x" keys
                    walk(entry, f"{prefix}{key}.")
                elif type(entry) in (str, int, float, bool):
                    flat[prefix + key] = str(entry).lower() if type(entry) is bool else str(entry)
                else:
                    raise Invalid(f"{prefix}{key}: expected a string, number or boolean, got {type_name(entry)}")

        walk(value, "")
        return flat

    def describe(self):
        return "table of hyper-parameter → value (docs/learning.md), e.g. `{ warmup_rounds = 10 }`"


# --- sections and their own rules -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CheckContext:
    """What a section's rules may look at besides its own values."""

    given: frozenset[str]  # the keys the file gave in the section (a rule may be about giving one at all)
    base: Path  # the config file's folder
    # The node learns ([algorithm].name is not "none") and the loader checks learning (`status` and
    # `stop` do not): only then do the rules that read files or import the learning stack run.
    learns: bool


class Section:
    """The base of a settings section: its rules between its own settings, run once every
    section has loaded on its own (a setting of the wrong kind is reported instead)."""

    def check(self, context: CheckContext) -> list[str]:
        """One line per broken rule, "[section].key: ..." as parse_section says a key's problem."""
        return []


_REQUIRED = dataclasses.MISSING


def option(kind: Kind, default: Any = _REQUIRED, doc: str = "") -> Any:
    """Declare a setting: its kind, its default (none: required) and one line of documentation."""
    if isinstance(default, dict):  # a fresh (empty) table per instance
        return field(default_factory=lambda: dict(default), metadata={"kind": kind, "doc": doc})
    return field(default=default, metadata={"kind": kind, "doc": doc})


def is_required(spec: dataclasses.Field) -> bool:
    return spec.default is _REQUIRED and spec.default_factory is _REQUIRED


def default_of(spec: dataclasses.Field) -> Any:
    return spec.default_factory() if spec.default_factory is not _REQUIRED else spec.default


def unknown_key(key: str, known: list[str], what: str = "key") -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
    return f"unknown {what}{hint}"


def parse_section(
    name: str, cls: type, table: Any, base: Path, problems: list[str], removed: Mapping[tuple[str, str], str]
) -> Any:
    if not isinstance(table, dict):
        problems.append(f"[{name}]: expected a table, got {type_name(table)}")
        table = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in table:
        if key not in fields:
            problems.append(f"[{name}].{key}: {removed.get((name, key)) or unknown_key(key, list(fields))}")
    values = {}
    for key, spec in fields.items():
        if key not in table:
            if is_required(spec):
                problems.append(f"[{name}].{key}: required ({spec.metadata['kind'].describe()})")
            else:
                values[key] = spec.metadata["kind"].resolvedefault_of(default_of(spec), base)
            continue
        try:
            values[key] = spec.metadata["kind"].parse(table[key], base)
        except Invalid as exc:
            problems.append(f"[{name}].{key}: {exc}")
    try:
        return cls(**values)
    except TypeError:
        return None  # a required value is missing; already reported


def toml_literal(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (str, Path)):
        return f'`"{value}"`'
    if isinstance(value, (tuple, Mapping)) and not value:
        return "`[]`" if isinstance(value, tuple) else "`{}`"
    return f"`{value}`"
