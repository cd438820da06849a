"""Wire test vectors, also listed in docs/protocol.md.

Key: Ed25519 private key bytes 01 02 03 ... 20 (hex). Network "test", timestamp_us
1_700_000_000_000_000, round 3. Ed25519 signatures are deterministic, so the frames are exact.
"""

PRIVATE_KEY_SEED = 1  # tests.conftest.fixed_identity(1): bytes 0x01..0x20
PUBLIC_KEY = "79b5562e8fe654f94078b112e8a98ba7901f853ae695bed7e0e3910bad049664"
NODE_ID = "29a72a2391e2ae35"

# PING {nonce: 9}, seq 7
PING_FRAME = (
    "ad7032706e6f64652e6672616d65"  # tag: msgpack str "p2pnode.frame"
    "98"  # array of 8
    "01"  # version 1
    "a474657374"  # network "test"
    "a450494e47"  # type "PING"
    "c420"
    + PUBLIC_KEY  # sender: bin 32
    + "07"  # seq 7
    "cf00060a24181e4000"  # timestamp_us, uint64
    "03"  # round 3
    "81a56e6f6e636509"  # body {"nonce": 9}
    "382b23661f847c8dc472a7aa2026bd45dae3638c7815794eab631dce3e2eb293"  # signature
    "38640ba8804bb1a6a987fb0c191912d2a095ba594a8a5a145df79e4d122e8f09"
)

# PROTOTYPES {classes: [3], counts: [25], prototypes: float32 [[0.5, -1.0]], head: nil}, seq 8
PROTOTYPES_FRAME = (
    "ad7032706e6f64652e6672616d65"
    "98"
    "01"
    "a474657374"
    "aa50524f544f5459504553"  # type "PROTOTYPES"
    "c420" + PUBLIC_KEY + "08"
    "cf00060a24181e4000"
    "03"
    "84"  # body: map of 4
    "a7636c6173736573"
    "9103"  # "classes": [3]
    "a6636f756e7473"
    "9119"  # "counts": [25]
    "aa70726f746f7479706573"  # "prototypes":
    "83"
    "a56474797065"
    "a7666c6f61743332"  # {"dtype": "float32",
    "a57368617065"
    "920102"  # "shape": [1, 2],
    "a464617461"
    "c408"
    "0000003f"
    "000080bf"  # "data": bin 8 = 0.5, -1.0 little-endian}
    "a468656164"
    "c0"  # "head": nil
    "d1aa6ce9c7b45ac9e0c4da8d290bce430af87b8fc4cb3083ea87929cc39bc894"  # signature
    "179629a0668a11fe104a25de1fc1615afb6ad5565af67023bb5015fd8307910c"
)

# The PING above sealed by its key to the key of seed 02 03 ... 21 (protocol/sealing.py), seq 7.
SECOND_PUBLIC_KEY = "43cdc023d22d5f9e107d1a0693457d35d1d10eb7d21c721192f56f5de40665d3"
SEALED_PING = (
    "0000000000000007"  # seq 7, the nonce's last 8 bytes
    "1f946af3e1c0fa88f8634385d950759e6d52b91efd3d1519e2cbb2ddb34fb007532ac44b10086f66380fdfea25deef6bc0"
    "f34e3a2d7e2fcd03a2ae667afc659c9f65e3d753cf7a57518e880d707deade94f12ef7ea2b8e73edfc2ad4f93277d8164f"
    "6549dab295c4d8aa40a08f154a9711f021b15d3eb6c084d7b94260001e5c03e334e52a57a7e3b864fcfb59cb4a4bd3a2e8"
    "a91ce06389342bc327d69873"  # the PING, encrypted, then the 16-byte tag
)
