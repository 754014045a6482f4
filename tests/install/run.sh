#!/usr/bin/env bash
# tests/install/run.sh BUILD_DIR SOURCE_DIR
#
# Installs BUILD_DIR into a temporary prefix and checks that an external
# project can use it:
#   1. the expected files are installed; the shared library exports only sw_*
#      symbols; every public header compiles on its own (C11, and C++ if a
#      C++ compiler is present);
#   2. tests/install as a CMake project (find_package(streamwire), shared and
#      static targets) builds and runs;
#   3. main.c compiled with `pkg-config --cflags --libs streamwire` links and
#      runs against the installed libstreamwire.so (LD_LIBRARY_PATH).
#   4. the installed streamwire.pc is relocatable: its prefix resolves to the
#      install prefix.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
HERE="$SRC/tests/install"
CC=${CC:-cc}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/sw-install.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PREFIX="$TMP/prefix"

step() { echo "--- install_consumer: $*"; }
fail() { echo "FAIL install_consumer: $*" >&2; exit 1; }
warn() { echo "WARNING install_consumer: $*" >&2; }

# ------------------------------------------------------------ 1. install
step "cmake --install $BUILD --prefix $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" 2>&1 ||
  { cat "$TMP/install.log"; fail "cmake --install failed"; }

PC=$(find "$PREFIX" -name streamwire.pc -path '*/pkgconfig/*')
PC=${PC%%$'\n'*}
[ -n "$PC" ] || fail "streamwire.pc not installed"
LIBDIR=$(dirname "$(dirname "$PC")")
echo "libdir: $LIBDIR"
for f in "$PREFIX/include/streamwire/streamwire.h" \
         "$PREFIX/include/streamwire/errors.h" \
         "$PREFIX/include/streamwire/export.h" \
         "$LIBDIR/libstreamwire.so" \
         "$LIBDIR/libstreamwire.a" \
         "$LIBDIR/cmake/streamwire/streamwireConfig.cmake" \
         "$LIBDIR/cmake/streamwire/streamwireConfigVersion.cmake" \
         "$LIBDIR/cmake/streamwire/streamwireTargets.cmake"; do
  [ -e "$f" ] || fail "not installed: ${f#"$PREFIX"/}"
done
# the shared library follows its SONAME
soname=$(objdump -p "$LIBDIR/libstreamwire.so" | awk '/SONAME/ {print $2}')
[ "$soname" = "libstreamwire.so.0" ] || fail "SONAME is '$soname', want libstreamwire.so.0"
[ -e "$LIBDIR/$soname" ] || fail "$soname not installed"
# nothing internal is installed
internal=$(find "$PREFIX/include" -name 'sw_*.h')
[ -z "$internal" ] || fail "internal headers installed: $(tr '\n' ' ' <<<"$internal")"

step "exported symbols"
exports=$(nm -D --defined-only "$LIBDIR/libstreamwire.so" | awk 'NF == 3 {print $3}')
bad=$(printf '%s\n' "$exports" | grep -v '^sw_' || true)
[ -z "$bad" ] || fail "libstreamwire.so exports non-API symbols: $(tr '\n' ' ' <<<"$bad")"
for s in sw_version sw_strerror sw_err_name sw_validate_endpoint; do
  grep -qx "$s" <<<"$exports" || fail "libstreamwire.so does not export $s"
done
echo "$(printf '%s\n' "$exports" | wc -l) sw_* symbols exported"

step "public headers compile on their own"
for h in "$PREFIX"/include/streamwire/*.h; do
  name="streamwire/$(basename "$h")"
  printf '#include <%s>\n#include <%s>\nint sw_consumer_dummy;\n' "$name" "$name" >"$TMP/hdr.c"
  "$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$PREFIX/include" "$TMP/hdr.c" ||
    fail "$name does not compile standalone as C11"
  if command -v c++ >/dev/null 2>&1; then
    cp "$TMP/hdr.c" "$TMP/hdr.cc"
    c++ -std=c++11 -Wall -Wextra -Werror -fsyntax-only -I"$PREFIX/include" "$TMP/hdr.cc" ||
      fail "$name does not compile as C++"
  fi
done

# ------------------------------------------------------------ 2. CMake package
step "CMake consumer (find_package(streamwire))"
cmake -S "$HERE" -B "$TMP/consumer" -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_BUILD_TYPE=Release >"$TMP/consumer-configure.log" 2>&1 ||
  { cat "$TMP/consumer-configure.log"; fail "consumer: configure failed"; }
cmake --build "$TMP/consumer" -j2 >"$TMP/consumer-build.log" 2>&1 ||
  { cat "$TMP/consumer-build.log"; fail "consumer: build failed"; }
"$TMP/consumer/consumer" || fail "consumer (shared) failed"
# (ldd output captured first: `ldd | grep -q` can fail with SIGPIPE under pipefail)
deps=$(ldd "$TMP/consumer/consumer")
grep -qF "$LIBDIR/libstreamwire.so.0" <<<"$deps" ||
  fail "consumer is not linked against the installed libstreamwire: $deps"
"$TMP/consumer/consumer_static" || fail "consumer_static failed"
deps=$(ldd "$TMP/consumer/consumer_static")
if grep -q libstreamwire <<<"$deps"; then
  fail "consumer_static links libstreamwire dynamically"
fi

# ------------------------------------------------------------ 3. pkg-config
step "pkg-config consumer"
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
unset PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR || true
modver=$(pkg-config --modversion streamwire) || fail "pkg-config does not find streamwire"
[ "$modver" = "$("$TMP/consumer/consumer" | sed -n 's/^streamwire \([^:]*\):.*/\1/p')" ] ||
  fail "streamwire.pc Version $modver differs from sw_version()"
pc_prefix=$(pkg-config --variable=prefix streamwire)
# compare resolved paths: a relocatable .pc says ${pcfiledir}/../..
pc_prefix_real=$(cd "$pc_prefix" 2>/dev/null && pwd -P || echo "$pc_prefix")
if [ "$pc_prefix_real" != "$(cd "$PREFIX" && pwd -P)" ]; then
  fail "installed streamwire.pc says prefix=$pc_prefix, not the install prefix $PREFIX"
fi
flags=$(pkg-config --cflags --libs streamwire)
echo "pkg-config --cflags --libs streamwire: $flags"
# shellcheck disable=SC2086  # word splitting of the flags is intended
"$CC" -std=c11 -Wall -Wextra -Werror -o "$TMP/pc_consumer" "$HERE/main.c" $flags ||
  fail "compiling main.c with pkg-config flags failed"
LD_LIBRARY_PATH="$LIBDIR" "$TMP/pc_consumer" || fail "pkg-config consumer failed"
deps=$(LD_LIBRARY_PATH="$LIBDIR" ldd "$TMP/pc_consumer")
grep -qF "$LIBDIR/libstreamwire.so.0" <<<"$deps" ||
  fail "pkg-config consumer did not load the installed libstreamwire: $deps"

echo "install_consumer: ok"
