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

# Python packages for kdaguard's PyTorch module and its tests, and universalmutator for the
# mutation testing of the validators (scripts/mutation_test.py), pinned: torch is the GPU
# machine's version. A failed install fails the run.
python_requirements=(torch==2.11.0 pytest==9.2.0 numpy==2.4.6 scikit-build-core==1.1.2
                     universalmutator==1.14.1)
install_python_requirements() {
  local absent=()
  for req in "${python_requirements[@]}"; do
    python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('${req%%==*}') != '${req##*==}')" \
      2>/dev/null || absent+=("$req")
  done
  if [ ${#absent[@]} -eq 0 ]; then
    echo "setup: Python packages present (${python_requirements[*]})"
    return
  fi
  echo "setup: pip installing ${absent[*]}"
  python3 -m pip install --quiet --disable-pip-version-check "${absent[@]}"
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  install_python_requirements
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
install_python_requirements
