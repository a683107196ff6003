#!/usr/bin/env bash
# Installs the pinned versitygw S3 gateway used by the L2 S3 integration tests
# and benchmarks (internal/s3test). Idempotent: a binary that already reports
# the pinned version is kept. Prints the binary's path on stdout.
#
#   scripts/install-versitygw.sh            # installs into $(go env GOPATH)/bin
#   VERSITYGW_BIN_DIR=/opt/bin scripts/install-versitygw.sh
#
# Tests find the binary through $VERSITYGW (a path), then $(go env GOPATH)/bin,
# then $PATH.
set -euo pipefail

VERSION="v1.8.0"
BIN_DIR="${VERSITYGW_BIN_DIR:-$(go env GOPATH)/bin}"
BIN="${BIN_DIR}/versitygw"

# The binary's --version says "git" when built by go install, so read the
# module version recorded in the binary instead.
if [[ -x "${BIN}" ]] && go version -m "${BIN}" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/versity/versitygw[[:space:]]+${VERSION}([[:space:]]|$)"; then
	echo "${BIN}"
	exit 0
fi

mkdir -p "${BIN_DIR}"
echo "installing versitygw ${VERSION} into ${BIN_DIR} (compiles from the module proxy; takes a few minutes)" >&2
GOBIN="${BIN_DIR}" go install "github.com/versity/versitygw/cmd/versitygw@${VERSION}"
echo "${BIN}"
