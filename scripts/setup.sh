#!/usr/bin/env bash
# Installs the Debian packages kdaguard builds with, when they are missing. Safe to re-run: it does
# nothing when everything is present. Needs root or sudo only when something must be installed.
set -euo pipefail

packages=(
  cmake g++ make python3
  clang-14 libclang-rt-14-dev          # libFuzzer and the sanitizers (fuzz preset)
  libgtest-dev libgmock-dev            # GoogleTest
  librapidcheck-dev                    # RapidCheck properties
  libbenchmark-dev libbenchmark-tools  # Google Benchmark and compare.py
  nlohmann-json3-dev libfmt-dev libcli11-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
