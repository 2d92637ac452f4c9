#!/usr/bin/env bash
# Builds the example compressor plugin (compressors/example_plugin, "qint8")
# against an installed shoal, the way a plugin author outside the tree would,
# and runs it:
#   1. install the build tree into a temporary prefix;
#   2. configure and build compressors/example_plugin with only
#      -DCMAKE_PREFIX_PATH=<prefix> (find_package(shoal));
#   3. check the .so: exports only shoal_compressor_plugin_v1, does not
#      depend on libshoal, leaves no shoal_* symbol unresolved;
#   4. shoalrun --list-compressors lists qint8 with SHOAL_PLUGIN_PATH set
#      (and refuses nothing), and not without it;
#   5. build tests/install/plugin_consumer.c against the prefix and run it
#      under shoalrun -np 3 with SHOAL_PLUGIN_PATH=<plugin build dir>.
# The prefix is removed on success and kept (its path printed) on failure.
# Registered by tests/install/CMakeLists.txt as install.example_plugin.
set -euo pipefail

die() { echo "plugin test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

build_dir='' config='' source_dir='' cmake=cmake generator='' cc=cc
libdir=lib bindir=bin includedir=include sanitize='' ranks=3
for arg in "$@"; do
  value=${arg#*=}
  case $arg in
    --build-dir=*) build_dir=$value ;;
    --config=*) config=$value ;;
    --source-dir=*) source_dir=$value ;;
    --cmake=*) cmake=$value ;;
    --generator=*) generator=$value ;;
    --cc=*) cc=$value ;;
    --libdir=*) libdir=$value ;;
    --bindir=*) bindir=$value ;;
    --includedir=*) includedir=$value ;;
    --sanitize=*) sanitize=$value ;;
    --ranks=*) ranks=$value ;;
    *) die "unknown argument: $arg" ;;
  esac
done
plugin_src=$source_dir/compressors/example_plugin
consumer_src=$source_dir/tests/install/plugin_consumer.c
[[ -d $build_dir && -f $plugin_src/CMakeLists.txt && -f $consumer_src ]] ||
  die "usage: $0 --build-dir=DIR --source-dir=<shoal checkout> [...]"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shoal-plugin-test.XXXXXX")
trap 'rc=$?; if ((rc == 0)); then rm -rf "$tmp"; else echo "plugin test: kept $tmp for inspection" >&2; fi' EXIT
prefix=$tmp/prefix
abs() { if [[ $1 == /* ]]; then echo "$1"; else echo "$prefix/$1"; fi; }
lib=$(abs "$libdir")
bin=$(abs "$bindir")
inc=$(abs "$includedir")

# Nothing from the caller's environment may help find shoal or pick a compressor.
unset CMAKE_PREFIX_PATH PKG_CONFIG_PATH CPATH C_INCLUDE_PATH LIBRARY_PATH shoal_DIR || true
unset SHOAL_STORE SHOAL_RANK SHOAL_WORLD_SIZE SHOAL_TOKEN SHOAL_PLUGIN_PATH || true
unset SHOAL_COMPRESSOR SHOAL_COMPRESSOR_OPTS SHOAL_COMPRESS_MIN_BYTES || true
export SHOAL_TIMEOUT_S=60

# ---- 1. install ------------------------------------------------------------
step "install $build_dir into $prefix"
install_args=(--install "$build_dir" --prefix "$prefix")
[[ -n $config ]] && install_args+=(--config "$config")
"$cmake" "${install_args[@]}" >"$tmp/install.log" || { cat "$tmp/install.log"; die "cmake --install failed"; }
[[ -f $inc/shoal/compressor.h ]] || die "the plugin ABI header $inc/shoal/compressor.h was not installed"
[[ -x $bin/shoalrun ]] || die "$bin/shoalrun was not installed"

# ---- 2. build the plugin against the prefix --------------------------------
# Not sanitized even when libshoal is: a plugin is an ordinary .so that any
# process may dlopen, and -Wl,--no-undefined would reject sanitizer symbols.
step "configure and build compressors/example_plugin with find_package(shoal)"
plugin_build=$tmp/plugin-build
cfg_args=(-S "$plugin_src" -B "$plugin_build" -DCMAKE_PREFIX_PATH="$prefix"
          -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="-Werror")
if [[ $libdir != lib && $libdir != lib/* ]]; then
  cfg_args+=(-Dshoal_DIR="$lib/cmake/shoal")
fi
[[ -n $generator ]] && cfg_args+=(-G "$generator")
"$cmake" "${cfg_args[@]}" || die "configuring the plugin failed"
"$cmake" --build "$plugin_build" --verbose || die "building the plugin failed"
plugin=$plugin_build/libshoal-compressor-qint8.so
[[ -f $plugin ]] || die "the build did not produce $plugin"

# ---- 3. what the .so exports and needs ---------------------------------------
step "check $plugin's symbols and dependencies"
exported=$(nm -D --defined-only "$plugin" | awk '$2 ~ /^[TDRBVW]$/ {print $3}' | grep -v '^_' | sort || true)
[[ $exported == shoal_compressor_plugin_v1 ]] ||
  die "the plugin must export exactly shoal_compressor_plugin_v1, exports: $(echo $exported)"
if readelf -d "$plugin" | grep -E 'NEEDED.*libshoal'; then
  die "the plugin depends on libshoal; it should need only the headers"
fi
if nm -D --undefined-only "$plugin" | grep -E ' shoal_'; then
  die "the plugin leaves shoal_* symbols to resolve at load time"
fi

# ---- 4. shoalrun --list-compressors ------------------------------------------
step "shoalrun --list-compressors with and without SHOAL_PLUGIN_PATH"
SHOAL_PLUGIN_PATH=$plugin_build "$bin/shoalrun" --list-compressors >"$tmp/list.txt" 2>&1 ||
  { cat "$tmp/list.txt"; die "shoalrun --list-compressors failed"; }
cat "$tmp/list.txt"
grep -qE '^qint8 .*libshoal-compressor-qint8\.so' "$tmp/list.txt" ||
  die "shoalrun --list-compressors does not list qint8 (from its file) with SHOAL_PLUGIN_PATH=$plugin_build"
grep -q 'block=<int>' "$tmp/list.txt" || die "shoalrun --list-compressors does not show qint8's options"
if grep -q 'refused' "$tmp/list.txt"; then die "a plugin was refused"; fi
"$bin/shoalrun" --list-compressors >"$tmp/list-none.txt" 2>&1 ||
  { cat "$tmp/list-none.txt"; die "shoalrun --list-compressors failed without SHOAL_PLUGIN_PATH"; }
if grep -q '^qint8' "$tmp/list-none.txt"; then die "qint8 is listed without SHOAL_PLUGIN_PATH"; fi
grep -q '^fp16' "$tmp/list-none.txt" || { cat "$tmp/list-none.txt"; die "built-in fp16 is not listed"; }

# ---- 5. run it through an application ------------------------------------------
step "build tests/install/plugin_consumer.c against $prefix"
cflags=(-std=c11 -Wall -Wextra -Wpedantic -Werror)
[[ -n $sanitize ]] && cflags+=("-fsanitize=$sanitize" -fno-omit-frame-pointer)
"$cc" "${cflags[@]}" -I"$inc" -o "$tmp/plugin_consumer" "$consumer_src" -L"$lib" -lshoal -lm -Wl,-rpath,"$lib" ||
  die "compiling plugin_consumer.c failed"

step "shoalrun -np $ranks plugin_consumer with SHOAL_PLUGIN_PATH=$plugin_build"
SHOAL_PLUGIN_PATH=$plugin_build "$bin/shoalrun" -np "$ranks" --timeout-s 120 "$tmp/plugin_consumer" \
  >"$tmp/run.txt" 2>&1 || { cat "$tmp/run.txt"; die "plugin_consumer failed under shoalrun -np $ranks"; }
cat "$tmp/run.txt"
passed=$(grep -c 'plugin consumer: PASS' "$tmp/run.txt" || true)
((passed == ranks)) || die "$passed of $ranks ranks printed PASS"

step "without SHOAL_PLUGIN_PATH, qint8 is unknown"
if "$bin/shoalrun" -np 1 "$tmp/plugin_consumer" >"$tmp/run-none.txt" 2>&1; then
  cat "$tmp/run-none.txt"
  die "plugin_consumer succeeded without the plugin"
fi
grep -qE "unknown compressor 'qint8'; available: .*fp16" "$tmp/run-none.txt" ||
  { cat "$tmp/run-none.txt"; die "the lookup failure does not say which compressors are available"; }

echo "plugin test: PASS"
