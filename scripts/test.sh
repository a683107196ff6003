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
# Browser tests keep their screenshots here (never in git; see .gitignore),
# so a CI run's pages can be looked at after it.
export LMCACHE_TEST_ARTIFACTS="${LMCACHE_TEST_ARTIFACTS:-$PWD/test-artifacts}"
mkdir -p "$LMCACHE_TEST_ARTIFACTS"

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
