#!/usr/bin/env bash
# Installs what building and testing lmcache-go needs on a Debian machine, as
# root. Idempotent: what is already present is kept, and apt is only asked
# when a package is missing.
#
#   scripts/install-deps.sh          # build deps only (libzmq for cgo)
#   scripts/install-deps.sh test     # plus test deps: staticcheck, versitygw,
#                                    # Debian python3-zmq/msgpack for interop,
#                                    # prometheus (promtool) for deploy/,
#                                    # etcd-server for internal/leader,
#                                    # python3-confluent-kafka for internal/kafkaevents,
#                                    # chromium for the /ui browser tests
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION="v0.8.2"
mode="${1:-build}"

pkgs=(libzmq3-dev pkg-config gcc)
if [[ "$mode" == "test" ]]; then
	pkgs+=(python3 python3-zmq python3-msgpack)
	# promtool (Debian ships it in prometheus) checks deploy/prometheus rules.
	pkgs+=(prometheus)
	# /usr/bin/etcd: internal/leader's tests start a three-member etcd cluster.
	pkgs+=(etcd-server)
	# librdkafka via confluent-kafka (upstream's Kafka client): internal/kafkaevents
	# interop tests.
	pkgs+=(python3-confluent-kafka)
	# Headless Chromium (/usr/bin/chromium) for the web console's browser
	# tests (internal/e2e TestWebConsoleFleet); a font so pages render text.
	pkgs+=(chromium fonts-liberation)
fi
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "apt: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[[ "$mode" == "test" ]] || exit 0

gobin="$(go env GOPATH)/bin"
if ! "$gobin/staticcheck" -version 2>/dev/null | grep -q "${STATICCHECK_VERSION#v}"; then
	echo "installing staticcheck ${STATICCHECK_VERSION}" >&2
	GOBIN="$gobin" go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION}"
fi
scripts/install-versitygw.sh >/dev/null
