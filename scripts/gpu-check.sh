#!/usr/bin/env bash
# GPU check of the lmcache-driven CUDA path (fits in 8 minutes on one
# H200). Runs the prebuilt binaries that scripts/gpu-check-build.sh put
# next to this script (no Go, no libzmq, no network needed): starts
# `lmcache server --supported-transfer-mode lmcache_driven` on loopback,
# then the Go stand-in vLLM worker (`lmcache-gpucheck`), which allocates a
# paged KV cache with cuMemAlloc (NHD, then MLA), registers it over ZMQ
# with CUDA IPC handles, stores and retrieves it byte-exact and prints the
# store / retrieve GB/s beside raw D2H / H2D copies of the same bytes.
#
#   gpu-check.sh                 # on the GPU machine, from the bundle folder
#   gpu-check.sh --fake-driver   # rehearsal without a GPU (kvcuda.Fake)
#
# Environment: GPU_CHECK_GIB (NHD size, default 4; MLA gets half),
# GPU_CHECK_OUT (logs, default $OUT or ./gpu-check-out), GPU_CHECK_PORT
# (default 15555). Exit: 0 all passed, 2 no GPU, 1 a check failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
fake=0
[[ "${1:-}" == "--fake-driver" ]] && fake=1
gib=${GPU_CHECK_GIB:-4}
out=${GPU_CHECK_OUT:-${OUT:-$here/gpu-check-out}}
port=${GPU_CHECK_PORT:-15555}
mkdir -p "$out"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

fail() {
	echo "gpu-check: FAIL: $*" | tee -a "$out/summary.txt" >&2
	exit 1
}

for b in lmcache lmcache-gpucheck; do
	[[ -x "$here/$b" ]] || fail "$here/$b is missing: build the bundle with scripts/gpu-check-build.sh"
done

if ((!fake)); then
	# A GPU means: the driver library loads and a device is visible.
	if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$out/gpus.txt" 2>&1 || ! grep -q "^GPU " "$out/gpus.txt"; then
		echo "gpu-check: no GPU here (nvidia-smi lists no device; see $out/gpus.txt). This check needs an NVIDIA GPU and its driver; use --fake-driver to rehearse without one." | tee "$out/summary.txt" >&2
		exit 2
	fi
	cat "$out/gpus.txt"
fi

# The server: private L1 memory (no /dev/shm needed), big enough for the
# NHD run, lmcache-driven only.
l1=$((gib + 2))
"$here/lmcache" server --host 127.0.0.1 --port "$port" --http-host 127.0.0.1 --http-port $((port + 1)) \
	--l1-size-gb "$l1" --l1-init-size-gb "$l1" --chunk-size 256 --supported-transfer-mode lmcache_driven \
	>"$out/server.log" 2>&1 &
srv=$!
stop() {
	kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
}
trap stop EXIT
# Wait (at most 60 s) for the data path to listen.
for _ in $(seq 600); do
	grep -q "data path listening" "$out/server.log" 2>/dev/null && break
	kill -0 "$srv" 2>/dev/null || fail "lmcache server exited at start-up:$(tail -20 "$out/server.log")"
	sleep 0.1
done
grep -q "data path listening" "$out/server.log" || fail "lmcache server did not listen within 60 s"
echo "gpu-check: lmcache server listening on tcp://127.0.0.1:$port (log: $out/server.log)"

runs=()
run() { # name, flags...
	local name=$1
	shift
	echo "== $name"
	timeout 180 "$here/lmcache-gpucheck" "$@" 2>&1 | tee "$out/$name.txt"
	local rc=${PIPESTATUS[0]}
	if ((rc == 3)); then
		echo "gpu-check: no GPU usable by the driver API (libcuda.so.1 or device missing; see $out/$name.txt)" | tee -a "$out/summary.txt" >&2
		exit 2
	fi
	((rc == 0)) || fail "$name exited $rc (see $out/$name.txt and $out/server.log)"
	runs+=("$out/$name.txt")
	grep -q "round trip byte-exact" "$out/$name.txt" || fail "$name did not report a byte-exact round trip"
}

if ((fake)); then
	# The fake driver cannot cross processes: each run has its own
	# in-process server on kvcuda.Fake; the external server above only
	# rehearses start-up and shutdown. No figure is a GPU figure.
	run nhd-fake --fake-driver --layout nhd --gib 0.25 --layers 8
	run mla-fake --fake-driver --layout mla --gib 0.25 --layers 8
else
	run nhd --endpoint "tcp://127.0.0.1:$port" --layout nhd --gib "$gib"
	run mla --endpoint "tcp://127.0.0.1:$port" --layout mla --gib "$(awk -v g="$gib" 'BEGIN{print g/2}')"
fi
grep -h "GB/s" "${runs[@]}" | tee -a "$out/summary.txt"
if grep -q "level=ERROR\|panic" "$out/server.log"; then
	fail "the server logged errors (see $out/server.log)"
fi
echo "gpu-check: PASS" | tee -a "$out/summary.txt"
