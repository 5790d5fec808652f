#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# The Kokkos and Kokkos Kernels 3.4.01 sources of Debian's `trilinos` source
# package (the release the distribution's Serial build is made from),
# unmodified: downloads the package's tarball once into the work directory,
# extracts packages/kokkos and packages/kokkos-kernels only, and prints the
# directory that holds both. Adds a deb-src entry for the distribution's
# `main` when apt has none for trilinos.
#
#   src=$(bash scripts/kokkos-sources.sh WORK_DIR)
set -euo pipefail
work=${1:?kokkos-sources: give the work directory}
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
mkdir -p "$work"
cd "$work"
if ! ls trilinos_*.orig.tar.* >/dev/null 2>&1; then
  if ! apt-get source --print-uris trilinos >/dev/null 2>&1; then
    $sudo tee /etc/apt/sources.list.d/kdnn-src.sources >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    $sudo apt-get update -qq >&2
  fi
  apt-get source --download-only trilinos 2>&1 | grep -v "^W: " >&2 || true
fi
src=$(ls -d Trilinos-*/packages 2>/dev/null | head -n 1 || true)
if [[ -z $src ]]; then
  tar xf trilinos_*.orig.tar.* --wildcards '*/packages/kokkos/*' '*/packages/kokkos-kernels/*'
  src=$(ls -d Trilinos-*/packages | head -n 1)
fi
echo "$work/$src"
