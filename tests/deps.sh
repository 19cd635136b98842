#!/usr/bin/env bash
# Install the Debian packages embkv needs to build and test, when absent.
set -euo pipefail
pkgs=(gcc g++ make sqlite3 libsqlite3-dev libpmemobj-dev libpmem-dev liburing-dev
      libcjson-dev zlib1g-dev pkg-config python3 python3-numpy python3-torch python3-tqdm python3-matplotlib
      python3-venv python3-pip python3-setuptools python3-wheel valgrind
      clang-14 libclang-rt-14-dev libfuzzer-14-dev wordnet-base)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "deps: installing ${missing[*]}"
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
