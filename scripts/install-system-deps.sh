#!/usr/bin/env bash
# Install the system packages nbdist's tests need (Debian): Chromium at /usr/bin/chromium, driven
# by Python Playwright with executable_path=/usr/bin/chromium (Playwright never downloads a browser
# of its own); sshd for the remote-hosts tests; Slurm (slurmctld, slurmd, the client commands) and
# munge for the Slurm tests, which start a private single-node Slurm of their own (tests/slurm.py:
# no system service is started or configured here); Open MPI's mpiexec for the MPI tests.
# Idempotent: does nothing when everything is already there.
# Needs root, or sudo.
set -euo pipefail

packages=(
  chromium fonts-dejavu-core
  openssh-server        # sshd: the remote-hosts tests
  slurm-wlm munge       # slurmctld, slurmd, sbatch...: the Slurm tests
  openmpi-bin           # mpiexec: the MPI tests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ] && [ -x /usr/bin/chromium ]; then
  echo "install-system-deps: nothing to do (chromium: $(/usr/bin/chromium --version 2>/dev/null))"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-system-deps: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-system-deps: installed ${missing[*]} ($(/usr/bin/chromium --version))"
