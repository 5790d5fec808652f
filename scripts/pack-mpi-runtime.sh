#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
# Packs this machine's Open MPI runtime into one tarball, for a GPU node that
# has no MPI, so that a CUDA build with kdnn::cp (kdnn_ENABLE_MPI=ON) can run
# its context-parallel tests and examples there, several ranks sharing the
# node's GPU:
#   scripts/pack-mpi-runtime.sh TARBALL
# The tarball holds mpiexec (orterun) and orted, Open MPI's libraries, its
# MCA plugins and help texts in the installation's own layout below its
# prefix, and in lib/ the shared libraries all of these need beyond the C
# runtime. Open MPI finds its plugins and texts relative to OPAL_PREFIX. On
# the node:
#   mkdir -p M && tar -C M -xzf TARBALL
#   KDNN_MPI_RUNTIME=$PWD/M scripts/gpu-check.sh OUT    (its cp step)
# or by hand: OPAL_PREFIX=$PWD/M PMIX_INSTALL_PREFIX=$PWD/M/pmix
#   PATH=$PWD/M/bin:$PATH LD_LIBRARY_PATH=$PWD/M/lib mpiexec -n 2 PROGRAM
set -euo pipefail
tarball=${1:?usage: scripts/pack-mpi-runtime.sh TARBALL}
command -v ompi_info > /dev/null || {
  echo "pack-mpi-runtime: ompi_info not found (Open MPI is not installed here)" >&2
  exit 2
}
path_of() { ompi_info --path "$1" --parsable | sed -n "s/^path:$1://p"; }
prefix=$(path_of prefix)
bindir=$(path_of bindir)
libdir=$(path_of libdir)
pkglibdir=$(path_of pkglibdir)
pkgdatadir=$(path_of pkgdatadir)
for dir in "$bindir" "$libdir" "$pkglibdir" "$pkgdatadir"; do
  if [[ $dir != "$prefix"/* ]]; then
    echo "pack-mpi-runtime: $dir is not below Open MPI's prefix $prefix (not relocatable)" >&2
    exit 2
  fi
done
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
below() { echo "$stage/${1#"$prefix"/}"; }  # a directory's place in the tarball

mkdir -p "$stage/bin" "$stage/lib" "$(below "$libdir")" "$(below "$pkglibdir")" \
  "$(below "$pkgdatadir")"
cp -L "$bindir/orterun" "$bindir/orted" "$stage/bin/"
ln -s orterun "$stage/bin/mpiexec"
cp -L "$libdir"/lib*.so.* "$(below "$libdir")/" 2> /dev/null || true
cp -L "$pkglibdir"/*.so "$(below "$pkglibdir")/"
cp -rL "$pkgdatadir/." "$(below "$pkgdatadir")/"
# An external PMIx (Open MPI 4's usual one): its plugins and help texts,
# below pmix/ (gpu-check's cp step points PMIX_INSTALL_PREFIX there).
pmix_lib=$(find "$stage" -name 'mca_pmix_*.so' -exec ldd {} \; 2> /dev/null |
  awk '$1 ~ /^libpmix/ {print $3}' | head -n 1)
if [[ -n $pmix_lib ]]; then
  pmix_prefix=$(dirname "$(dirname "$(readlink -f "$pmix_lib")")")
  mkdir -p "$stage/pmix/lib" "$stage/pmix/share"
  [[ -d $pmix_prefix/lib/pmix ]] && cp -rL "$pmix_prefix/lib/pmix" "$stage/pmix/lib/"
  [[ -d $pmix_prefix/share ]] && cp -rL "$pmix_prefix/share/." "$stage/pmix/share/"
fi
# What the executables, libraries and plugins load from outside the C
# runtime (Open MPI's own libraries included, wherever the system keeps them).
find "$stage" -type f \( -perm -u+x -o -name '*.so*' \) -exec ldd {} \; 2> /dev/null |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libdl|libpthread|librt)\.so' |
  while read -r lib; do
    [[ -e "$stage/lib/$(basename "$lib")" ]] || cp -L "$lib" "$stage/lib/"
  done
tar -C "$stage" -czf "$tarball" .
echo "$tarball: $(du -h "$tarball" | cut -f1) (Open MPI $(ompi_info --version 2> /dev/null |
  sed -n 's/.*v\([0-9.]*\).*/\1/p' | head -n 1), prefix $prefix)"
