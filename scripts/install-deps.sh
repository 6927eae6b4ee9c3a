#!/usr/bin/env bash
# Installs the Debian packages shardbench needs, only those missing: a no-op when all are
# present. Run as root (CI, containers) or with sudo available.
set -euo pipefail
packages=(
  g++ make pkg-config
  openmpi-bin libopenmpi-dev           # MPI
  libhdf5-openmpi-dev hdf5-tools       # parallel HDF5 (traces)
  libopenblas-dev                      # BLAS for the CPU backend
  libcli11-dev                         # command-line options
  libgtest-dev libbenchmark-dev        # tests, micro-benchmarks
  time                                 # tests: /usr/bin/time -f %M, a plan's resident high-water mark
  xz-utils                             # tests: the GPU window's bundles (tar -J)
  python3-numpy python3-h5py python3-matplotlib python3-pandas  # analysis (/usr/bin/python3)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
