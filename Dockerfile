# p2pnode on CPU (docs/deploy.md). Build: docker build -t p2pnode .
# Run: the config at /etc/p2pnode/node.toml (read-only), key and state in the /var/lib/p2pnode volume.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
# PyPI's torch for Linux x86_64 is the CUDA build (several GB of nvidia-* packages); the CPU
# wheel of the same version comes from PyTorch's own index. It is installed first, then the
# project with constraints.txt (the versions the tests ran with), whose `torch==2.13.0` the
# CPU wheel (2.13.0+cpu) satisfies. torchvision then comes from PyPI as in `make venv`, a CUDA
# build whose C++ ops cannot load on CPU torch: algorithms/torchvision_compat.py handles that.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
RUN python -m venv /opt/p2pnode \
    && /opt/p2pnode/bin/pip install --index-url "$TORCH_INDEX_URL" "torch==$(sed -n 's/^torch==//p' constraints.txt)"
COPY protocol protocol
COPY algorithms algorithms
COPY p2pnode p2pnode
COPY testnet testnet
COPY tools tools
COPY p2pnode_cli p2pnode_cli
RUN /opt/p2pnode/bin/pip install -c constraints.txt . \
    && /opt/p2pnode/bin/python -c "import torch; from algorithms.torchvision_compat import torchvision; \
print('torch', torch.__version__, 'torchvision', torchvision.__version__)" \
    && /opt/p2pnode/bin/p2pnode --version

FROM python:${PYTHON_VERSION}-slim
COPY --from=build /opt/p2pnode /opt/p2pnode
ENV PATH=/opt/p2pnode/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# A dedicated user; its state directory (key, lock, sequence reservation, checkpoint, control
# socket) is private to it, as `p2pnode keygen` and the node expect (docs/config.md).
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/p2pnode --shell /usr/sbin/nologin p2pnode \
    && install -d -o p2pnode -g p2pnode -m 0700 /var/lib/p2pnode /var/lib/p2pnode/node \
    && install -d -m 0755 /etc/p2pnode
USER p2pnode
WORKDIR /var/lib/p2pnode
VOLUME ["/var/lib/p2pnode"]
# [node].listen; add -p for [metrics].listen, and use --network host for the LAN beacon (multicast).
EXPOSE 7000/tcp 7001/tcp
# The node stops cleanly on SIGTERM (BYE to its peers, sockets closed, lock released).
STOPSIGNAL SIGTERM
# `status` asks the running node over its control socket; it exits 1 if no node answers.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD p2pnode status --config /etc/p2pnode/node.toml > /dev/null || exit 1
ENTRYPOINT ["p2pnode"]
CMD ["start", "--config", "/etc/p2pnode/node.toml"]
