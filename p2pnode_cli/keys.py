"""`keygen` and `keyinfo`: a node's Ed25519 key file."""

from __future__ import annotations

import argparse
import json
import sys

from p2pnode.exits import EXIT_OK

from .errors import EXIT_USAGE, CommandError


def _keygen(args: argparse.Namespace) -> int:
    from p2pnode.wire.keystore import KeyFileError, write_key
    from protocol import Identity

    identity = Identity.generate()
    try:
        path = write_key(args.out, identity, overwrite=args.force)
    except KeyFileError as exc:
        raise CommandError(str(exc)) from None
    print(identity.node_id)  # stdout holds only the node id, for scripts: ID=$(p2pnode keygen ...)
    print(f"wrote {path} (mode 0600); public key {identity.public_key.hex()}", file=sys.stderr)
    return EXIT_OK


def _keyinfo(args: argparse.Namespace) -> int:
    from p2pnode.wire.keystore import KeyFileError, load_key

    try:
        identity = load_key(args.key)
    except KeyFileError as exc:  # a key `start` would refuse as [node].key: exit 2 here as there
        raise CommandError(str(exc), EXIT_USAGE) from None
    print(json.dumps({"node_id": identity.node_id, "public_key": identity.public_key.hex()}))
    return EXIT_OK


def add_parsers(commands) -> None:
    keygen = commands.add_parser(
        "keygen",
        help="create a node key (Ed25519, PEM, mode 0600) and print its node id",
        description="Writes an Ed25519 key as PKCS#8 PEM, mode 0600, and prints the node id alone on stdout, for "
        "scripts: ID=$(p2pnode keygen --out k.pem). A key file that group or others can access is refused when "
        "loaded (exit 2).",
    )
    keygen.add_argument("--out", required=True, metavar="PATH", help="key file to create")
    keygen.add_argument("--force", action="store_true", help="replace an existing key file")
    keygen.set_defaults(run=_keygen)

    keyinfo = commands.add_parser("keyinfo", help="print the node id and public key of a key file, as JSON")
    keyinfo.add_argument(
        "key", metavar="PATH", help='a key file; prints {"node_id": ..., "public_key": HEX} (exit 2 if unusable)'
    )
    keyinfo.set_defaults(run=_keyinfo)
