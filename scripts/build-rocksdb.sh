#!/usr/bin/env bash
# Builds RocksDB 9.10.0 as a static, position-independent library for strom's own RocksDB binding
# (strom/kv/native/rocksdb_binding.c), once per machine.
#
# The source is Debian's upstream tarball (checksum-verified); the result is cached under
#   ${STROM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strom}/rocksdb-9.10.0-<flags hash>/{include,lib}
# keyed by the version and the build flags, so a second install on the same machine costs nothing. The
# first build takes 7-8 minutes on two cores (456 s measured).
#
# Prints the cache directory on its last line. Exits 0 without building (and prints nothing on stdout)
# when it cannot build here: no compiler or cmake and no apt to install them, or no network. setup.py then
# builds strom without the binding and the KV tablet uses rocksdict (the server's start-up line says which).
# STROM_ROCKSDB=off skips the build; --cached-only prints the cached build, if any, and never builds.
set -euo pipefail

CACHED_ONLY=0
[ "${1:-}" = "--cached-only" ] && CACHED_ONLY=1

VERSION=9.10.0
TARBALL="rocksdb_${VERSION}.orig.tar.gz"
SHA256=fdccab16133c9d927a183c2648bcea8d956fb41eb1df2aacaa73eb0b95e43724
URL="${STROM_ROCKSDB_SOURCE_URL:-https://deb.debian.org/debian/pool/main/r/rocksdb/${TARBALL}}"
JOBS="${STROM_BUILD_JOBS:-$(nproc 2> /dev/null || echo 2)}"

CMAKE_FLAGS=(
    -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON
    -DPORTABLE=1
    -DFAIL_ON_WARNINGS=OFF
    -DWITH_GFLAGS=OFF
    -DWITH_TESTS=OFF
    -DWITH_BENCHMARK_TOOLS=OFF
    -DWITH_TOOLS=OFF
    -DWITH_CORE_TOOLS=OFF
    -DWITH_TRACE_TOOLS=OFF
    -DROCKSDB_BUILD_SHARED=OFF
    -DWITH_LZ4=ON
    -DWITH_SNAPPY=ON
    -DWITH_ZSTD=ON
    -DWITH_ZLIB=ON
    -DWITH_BZ2=ON
    -DWITH_JEMALLOC=OFF
    -DWITH_LIBURING=OFF
    -DUSE_RTTI=1
)

say() { echo "build-rocksdb: $*" >&2; }

if [ "${STROM_ROCKSDB:-on}" = "off" ]; then
    say "STROM_ROCKSDB=off: not building (strom uses rocksdict)"
    exit 0
fi

FLAGS_HASH=$(printf '%s\n' "$VERSION" "$SHA256" "${CMAKE_FLAGS[@]}" | sha256sum | cut -c1-12)
CACHE_ROOT="${STROM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strom}"
PREFIX="$CACHE_ROOT/rocksdb-${VERSION}-${FLAGS_HASH}"

if [ -f "$PREFIX/lib/librocksdb.a" ] && [ -f "$PREFIX/include/rocksdb/c.h" ]; then
    [ "$CACHED_ONLY" -eq 1 ] || say "cached: $PREFIX"
    echo "$PREFIX"
    exit 0
fi
if [ "$CACHED_ONLY" -eq 1 ]; then
    exit 0
fi

# build tools and the compression libraries RocksDB links (Debian's packages), where apt is usable
PACKAGES=(cmake ninja-build g++ liblz4-dev libsnappy-dev libzstd-dev zlib1g-dev libbz2-dev)
missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2> /dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    # shellcheck source=scripts/apt-install.sh
    . "$(dirname "$0")/apt-install.sh"
    if ! apt_install "${missing[@]}"; then
        say "the build needs ${missing[*]} (strom uses rocksdict)"
        exit 0
    fi
fi

mkdir -p "$CACHE_ROOT"
WORK=$(mktemp -d "$CACHE_ROOT/rocksdb-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

download() {  # curl where there is one, else Python's urllib
    if command -v curl > /dev/null; then
        curl -sSfL --retry 3 -o "$2" "$1"
    else
        python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$1" "$2"
    fi
}
if ! download "$URL" "$WORK/$TARBALL"; then
    say "could not download $URL (strom uses rocksdict)"
    exit 0
fi
if ! echo "$SHA256  $WORK/$TARBALL" | sha256sum -c --status; then
    say "checksum mismatch for $TARBALL: refusing to build it"
    exit 1
fi

say "building RocksDB $VERSION with $JOBS jobs (7-8 minutes on two cores; cached afterwards)"
started=$(date +%s)
tar -xzf "$WORK/$TARBALL" -C "$WORK"
SRC=$(find "$WORK" -mindepth 1 -maxdepth 1 -type d -name 'rocksdb*' | head -1)
cmake -S "$SRC" -B "$WORK/build" "${CMAKE_FLAGS[@]}" > "$WORK/cmake.log" 2>&1 || {
    tail -30 "$WORK/cmake.log" >&2
    exit 1
}
ninja -C "$WORK/build" -j "$JOBS" rocksdb > "$WORK/ninja.log" 2>&1 || {
    tail -30 "$WORK/ninja.log" >&2
    exit 1
}

# install atomically: a half-copied cache entry is never taken for a finished one
STAGE="$WORK/stage"
mkdir -p "$STAGE/lib" "$STAGE/include"
cp "$WORK/build/librocksdb.a" "$STAGE/lib/"
cp -r "$SRC/include/rocksdb" "$STAGE/include/"
printf 'version=%s\nsha256=%s\nflags=%s\nbuild_seconds=%s\n' \
    "$VERSION" "$SHA256" "${CMAKE_FLAGS[*]}" "$(($(date +%s) - started))" > "$STAGE/BUILD-INFO"
rm -rf "$PREFIX"
mv "$STAGE" "$PREFIX"
say "built in $(($(date +%s) - started)) s: $PREFIX"
echo "$PREFIX"
