#!/usr/bin/env bash
# Builds librdkafka's test-runner for `make conformance`:
#   build-librdkafka.sh VERSION DEST   (the Makefile passes the version the list names)
#
# The source comes from the npm registry, pinned: the package
# @confluentinc/kafka-javascript bundles librdkafka's whole source tree, tests/ included,
# under deps/librdkafka/ (npm pack only downloads it; nothing is installed or run). npm
# checks the registry's own sha512 of the tarball; the sha256 below pins its bytes.
#
# The build goes to DEST (configure; make libs; make -C tests build). It is done once:
# when DEST/tests/test-runner exists and DEST/.ledgerd-build names this script's
# sha256 (so a change here rebuilds), this only touches it. A build that stopped half
# way has no stamp, so the next run starts again from a fresh tree.
set -euo pipefail

version=${1:?usage: build-librdkafka.sh VERSION DEST}
dest=${2:?usage: build-librdkafka.sh VERSION DEST}
runner=$dest/tests/test-runner
stamp=$dest/.ledgerd-build
recipe=$(sha256sum "$0" | cut -d' ' -f1)

if [ -x "$runner" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$recipe" ]; then
    touch "$runner"
    exit 0
fi

case $version in
    2.15.1)
        package=@confluentinc/kafka-javascript@1.10.1
        tarball=confluentinc-kafka-javascript-1.10.1.tgz
        sha256=ada7d703bb1d3237e2292bfabf438d663b6160c9f1ac2a2406b5dc4257c81b66
        ;;
    *)
        echo "build-librdkafka.sh: no pinned source for librdkafka $version; add its npm" \
             "package, tarball and sha256 here" >&2
        exit 1
        ;;
esac

for tool in npm g++ make; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build-librdkafka.sh: $tool is missing (make conformance-deps installs it)" >&2
        exit 1
    fi
done

download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
echo "fetching librdkafka $version's source: npm pack $package"
(cd "$download" && npm pack --silent "$package" </dev/null >/dev/null)
if ! echo "$sha256  $download/$tarball" | sha256sum --check --status; then
    echo "build-librdkafka.sh: $tarball does not have the pinned sha256 $sha256" >&2
    exit 1
fi

rm -rf "$dest"
mkdir -p "$dest"
tar -xzf "$download/$tarball" -C "$dest" --strip-components=3 package/deps/librdkafka
got=$(sed -n 's/^#define RD_KAFKA_VERSION *0x\(..\)\(..\)\(..\)ff$/\1 \2 \3/p' "$dest/src/rdkafka.h")
read -r major minor patch <<<"${got:-0 0 0}"
if [ "$((16#$major)).$((16#$minor)).$((16#$patch))" != "$version" ]; then
    echo "build-librdkafka.sh: $package holds librdkafka $got, not $version" >&2
    exit 1
fi

jobs=$(nproc)
echo "building librdkafka $version and its test-runner in $dest ($jobs jobs)"
cd "$dest"
# With OpenSSL (some tests set SSL properties even without an SSL broker), zlib and zstd
# (compression tests; lz4 and snappy are built in) and RapidJSON (tests that check the
# statistics JSON skip themselves without it); without Kerberos or OIDC, whose tests
# need servers this harness does not run.
./configure --disable-gssapi --disable-curl \
    >ledgerd-configure.out 2>&1 || { tail -30 ledgerd-configure.out >&2; exit 1; }
make -j"$jobs" libs >ledgerd-build.out 2>&1 || { tail -30 ledgerd-build.out >&2; exit 1; }
# `make -C tests` alone would also run the tests; `build` is the test-runner and the
# interceptor plugin it loads.
make -j"$jobs" -C tests build >>ledgerd-build.out 2>&1 || { tail -30 ledgerd-build.out >&2; exit 1; }
test -x tests/test-runner
grep -q 'WITH_RAPIDJSON' tests/../config.h || echo "warning: built without RapidJSON" >&2
cd - >/dev/null
echo "$recipe" >"$stamp"
echo "built $dest/tests/test-runner"
