#!/usr/bin/env bash
# `make up`: from a fresh Debian/Ubuntu machine to topologies/local.yaml serving requests.
#   1. OS packages: the libraries the Mooncake transfer engine links (libibverbs1 librdmacm1
#      libnuma1) and python3-venv when `python3 -m venv` cannot work. Installed with apt-get
#      when run as root; otherwise the command to run is printed and nothing else happens.
#   2. The Python environment .venv (`make venv`).
#   3. `pdkit up topologies/local.yaml`, which ends with the endpoint and a curl line.
# PYTHON (default python3) picks the interpreter for .venv, TOPOLOGY another topology.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TOPOLOGY=${TOPOLOGY:-topologies/local.yaml}

packages=(libibverbs1 librdmacm1 libnuma1)
if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  packages+=(python3-venv)
fi
tools/os_packages.sh "${packages[@]}"

make -s venv PYTHON="$PYTHON"
exec .venv/bin/pdkit up "$TOPOLOGY"
