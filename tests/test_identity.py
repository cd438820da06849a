import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from p2pnode.wire.keystore import KeyFileError, load_key, write_key
from p2pnode_cli import main
from protocol import Identity, node_id

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keygen_writes_a_private_key_and_prints_the_node_id(tmp_path, capsys):
    key = tmp_path / "keys" / "node.pem"
    assert main(["keygen", "--out", str(key)]) == 0
    out, err = capsys.readouterr()
    printed_id = out.strip()
    # The id of the key written, as docs/protocol.md §9 derives it, from the file itself (not
    # through load_key and node_id, which would agree with a wrong id as well).
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert printed_id == hashlib.sha256(b"p2pnode.node-id\x00" + public).hexdigest()[:16]  # 64 bits
    assert mode(key) == 0o600
    assert load_key(key).node_id == printed_id
    assert f"public key {public.hex()}" in err


def test_keygen_ignores_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        write_key(tmp_path / "k.pem", Identity.generate())
    finally:
        os.umask(old)
    assert mode(tmp_path / "k.pem") == 0o600


def test_keygen_never_replaces_a_key_unless_forced(tmp_path, capsys):
    key = tmp_path / "node.pem"
    assert main(["keygen", "--out", str(key)]) == 0
    first = load_key(key).node_id
    assert main(["keygen", "--out", str(key)]) == 1
    assert "already exists" in capsys.readouterr().err
    assert load_key(key).node_id == first
    assert main(["keygen", "--out", str(key), "--force"]) == 0
    assert load_key(key).node_id != first and mode(key) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["node.pem"]  # no temporary files left


@pytest.mark.parametrize("bits", [0o644, 0o640, 0o604, 0o660, 0o601, 0o610])
def test_loading_refuses_keys_others_can_access(tmp_path, bits):
    key = write_key(tmp_path / "node.pem", Identity.generate())
    key.chmod(bits)
    with pytest.raises(KeyFileError) as caught:
        load_key(key)
    assert f"mode {bits:04o}" in str(caught.value) and f"chmod 600 {key}" in str(caught.value)


def test_loading_explains_a_missing_or_unusable_key(tmp_path):
    with pytest.raises(KeyFileError, match="p2pnode keygen --out"):
        load_key(tmp_path / "absent.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a key")
    garbage.chmod(0o600)
    with pytest.raises(KeyFileError, match="not usable"):
        load_key(garbage)
    other = tmp_path / "ec.pem"
    other.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    other.chmod(0o600)
    with pytest.raises(KeyFileError, match="expected an Ed25519 key"):
        load_key(other)
    with pytest.raises(KeyFileError, match="not a regular file"):
        load_key(tmp_path)


def test_keyinfo_prints_id_and_public_key(tmp_path, capsys):
    identity = Identity.generate()
    key = write_key(tmp_path / "k.pem", identity)
    assert main(["keyinfo", str(key)]) == 0
    assert json.loads(capsys.readouterr().out) == {"node_id": identity.node_id, "public_key": identity.public_key.hex()}


def test_pem_round_trip_and_node_ids():
    identity = Identity.generate()
    again = Identity.from_pem(identity.to_pem())
    assert again.public_key == identity.public_key and again.node_id == identity.node_id
    assert node_id(identity.public_key) == identity.node_id != Identity.generate().node_id
    with pytest.raises(ValueError):
        node_id(b"short")
