#!/usr/bin/env bash
# Builds everything scripts/gpu-check.sh needs into one folder to carry to
# a GPU machine that has the NVIDIA driver and Python but no Go, no libzmq
# and no network: the stripped `lmcache` and `lmcache-gpucheck` binaries,
# every shared library they link outside glibc (libzmq and its
# dependencies, found with ldd; the script sets LD_LIBRARY_PATH), the
# check script itself, and the build machine's glibc version for
# diagnosis. CUDA is not linked: libcuda.so.1 is loaded at run time.
#
#   scripts/gpu-check-build.sh [OUT]      # default bin/gpu-check (git-ignored), and OUT.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bin/gpu-check}
rm -rf "$out"
mkdir -p "$out/lib"
go build -trimpath -ldflags "-s -w" -o "$out/lmcache" ./cmd/lmcache
go build -trimpath -ldflags "-s -w" -o "$out/lmcache-gpucheck" ./cmd/lmcache-gpucheck
for bin in lmcache lmcache-gpucheck; do
	ldd "$out/$bin" | awk '/=> \// {print $3}' | while read -r lib; do
		case "$(basename "$lib")" in
		libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | ld-linux*) ;; # glibc: the machine's own
		*) cp -L "$lib" "$out/lib/" ;;
		esac
	done
done
cp scripts/gpu-check.sh "$out/"
ldd --version | sed -n 1p >"$out/BUILT_WITH_GLIBC" # sed reads all: no SIGPIPE under pipefail
# Every library must resolve from the bundle (plus glibc).
if LD_LIBRARY_PATH="$out/lib" ldd "$out/lmcache" "$out/lmcache-gpucheck" | grep "not found"; then
	echo "gpu-check-build: unresolved libraries above" >&2
	exit 1
fi
du -sh "$out"
# The binaries (about 70 MiB) exceed what a device run may carry (64 MiB
# with the working tree); gzipped they are about a third of that.
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
du -sh "$out.tar.gz"
echo "gpu-check-build: carry $out.tar.gz; there: tar xzf $(basename "$out").tar.gz && $(basename "$out")/gpu-check.sh"
