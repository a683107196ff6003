#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this):
# dependencies, gofmt, go vet, staticcheck, then every test with the race
# detector. Exits non-zero on the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test

gobin="$(go env GOPATH)/bin"
export PATH="$gobin:$PATH"
export VERSITYGW="$gobin/versitygw"

echo "== gofmt"
unformatted="$(gofmt -l $(git ls-files '*.go'))"
if [[ -n "$unformatted" ]]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
echo "== go vet"
go vet ./...
echo "== staticcheck"
staticcheck ./...
echo "== go test -race"
go test -race -count=1 -timeout 40m ./...
