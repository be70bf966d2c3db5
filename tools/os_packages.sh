#!/usr/bin/env bash
# Ensure Debian packages are installed: `tools/os_packages.sh PACKAGE...`.
# As root, installs the missing ones with apt-get; otherwise prints the apt-get line to run and
# exits 1, so `make up` and `make test` stop naming what is missing instead of failing later.
# On a system without dpkg it says what to install and goes on.
set -euo pipefail
[ $# -gt 0 ] || exit 0
if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "note: not a Debian-like system; make sure these (or your system's equivalents) are installed: $*" >&2
  exit 0
fi
missing=()
for package in "$@"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
  echo "Installing OS packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "pdkit needs these OS packages: ${missing[*]}. Install them, then run make again:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
