#!/usr/bin/env bash
# Installs a shoal build tree into a temporary prefix and checks the result
# the way a downstream user would consume it:
#   1. the installed layout (headers, versioned libshoal.so symlinks, tools,
#      CMake package files, shoal.pc) and the tools' RPATH;
#   2. find_package(shoal) from tests/install/consumer, build, run;
#   3. find_package with an incompatible major version must fail;
#   4. `cc consumer.c $(pkg-config --cflags --libs shoal)`, run without
#      LD_LIBRARY_PATH (shoal.pc's Libs carry the RPATH);
#   5. the README's install sequence as written: its C example, built with
#      pkg-config, run by the installed shoalrun -np 4, no LD_LIBRARY_PATH.
# Any failing step exits non-zero. The prefix is removed on success and kept
# (its path printed) on failure. Registered by tests/install/CMakeLists.txt.
set -euo pipefail

die() { echo "install test: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

# Arguments are --name=value so that empty values (e.g. no sanitizer) survive.
build_dir='' config='' consumer_dir='' cmake=cmake generator='' cc=cc tools=''
libdir=lib bindir=bin includedir=include version='' soversion='' sanitize='' readme=''
for arg in "$@"; do
  value=${arg#*=}
  case $arg in
    --build-dir=*) build_dir=$value ;;
    --config=*) config=$value ;;
    --consumer-dir=*) consumer_dir=$value ;;
    --cmake=*) cmake=$value ;;
    --generator=*) generator=$value ;;
    --cc=*) cc=$value ;;
    --libdir=*) libdir=$value ;;
    --bindir=*) bindir=$value ;;
    --includedir=*) includedir=$value ;;
    --version=*) version=$value ;;
    --soversion=*) soversion=$value ;;
    --sanitize=*) sanitize=$value ;;
    --tools=*) tools=$value ;; # comma-separated tool targets that were built
    --readme=*) readme=$value ;;
    *) die "unknown argument: $arg" ;;
  esac
done
[[ -d $build_dir && -d $consumer_dir && -n $version && -n $soversion ]] ||
  die "usage: $0 --build-dir=DIR --consumer-dir=DIR --version=X.Y.Z --soversion=X [...]"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shoal-install-test.XXXXXX")
trap 'rc=$?; if ((rc == 0)); then rm -rf "$tmp"; else echo "install test: kept $tmp for inspection" >&2; fi' EXIT
prefix=$tmp/prefix
# An absolute CMAKE_INSTALL_<dir> is used as is; a relative one is under the prefix.
abs() { if [[ $1 == /* ]]; then echo "$1"; else echo "$prefix/$1"; fi; }
lib=$(abs "$libdir")
bin=$(abs "$bindir")
inc=$(abs "$includedir")

# A sanitized libshoal needs its runtime loaded first: build consumers the same way.
# (The CMake consumer sets C11 itself; the pkg-config build adds -std=c11.)
cflags="-Wall -Wextra -Wpedantic -Werror"
if [[ -n $sanitize ]]; then
  cflags+=" -fsanitize=$sanitize -fno-omit-frame-pointer"
fi

# Keep the consumer honest: no paths inherited from the caller's environment
# may help it find shoal, its headers or its library.
unset CMAKE_PREFIX_PATH PKG_CONFIG_PATH CPATH C_INCLUDE_PATH LIBRARY_PATH shoal_DIR || true
# Only the "memory://" store is used, but never let the environment redirect it.
unset SHOAL_STORE SHOAL_RANK SHOAL_WORLD_SIZE || true

# ---- 1. install and check the layout -------------------------------------
step "install $build_dir into $prefix"
install_args=(--install "$build_dir" --prefix "$prefix")
[[ -n $config ]] && install_args+=(--config "$config")
"$cmake" "${install_args[@]}" || die "cmake --install failed (is the tree built?)"

step "check installed files"
for f in "$inc/shoal/shoal.h" "$inc/shoal/status.h" \
         "$lib/cmake/shoal/shoalConfig.cmake" \
         "$lib/cmake/shoal/shoalConfigVersion.cmake" \
         "$lib/cmake/shoal/shoalTargets.cmake" \
         "$lib/pkgconfig/shoal.pc" \
         "$lib/libshoal.so.$version"; do
  [[ -f $f ]] || die "missing $f"
done
[[ -L $lib/libshoal.so.$soversion && $(readlink "$lib/libshoal.so.$soversion") == "libshoal.so.$version" ]] ||
  die "$lib/libshoal.so.$soversion is not a symlink to libshoal.so.$version"
[[ -L $lib/libshoal.so && $(readlink "$lib/libshoal.so") == "libshoal.so.$soversion" ]] ||
  die "$lib/libshoal.so is not a symlink to libshoal.so.$soversion"
soname=$(readelf -d "$lib/libshoal.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
[[ $soname == "libshoal.so.$soversion" ]] || die "SONAME is '$soname', expected libshoal.so.$soversion"

# libshoal's private dependencies must not leak into the package: no
# find_dependency in the config, no fmt/UCX/Threads in the link interface,
# no Requires in shoal.pc. (The consumer build below is the real proof.)
if grep -nE '^[^#]*find_dependency' "$lib/cmake/shoal/shoalConfig.cmake"; then
  die "shoalConfig.cmake calls find_dependency: consumers would need libshoal's private deps"
fi
if grep -nE 'INTERFACE_LINK_LIBRARIES.*(fmt|UCX|Threads)' "$lib/cmake/shoal"/shoalTargets*.cmake; then
  die "shoal::shoal's link interface names a private dependency"
fi
if grep -nE '^Requires' "$lib/pkgconfig/shoal.pc"; then
  die "shoal.pc has Requires: consumers would need libshoal's private deps' .pc files"
fi

# Installed tools must find the installed libshoal by themselves (RPATH),
# without LD_LIBRARY_PATH.
IFS=, read -ra tool_list <<<"$tools"
for tool in "${tool_list[@]}"; do
  [[ -n $tool ]] || continue
  [[ -x $bin/$tool ]] || die "$tool is built but was not installed to $bin"
  resolved=$(env -u LD_LIBRARY_PATH ldd "$bin/$tool" | awk '/libshoal\.so/ {print $3}')
  [[ -n $resolved && $resolved -ef $lib/libshoal.so.$soversion ]] ||
    die "$bin/$tool resolves libshoal to '$resolved', not $lib (RPATH not set?)"
  echo "$tool -> $resolved"
done

# The consumers link the installed libshoal; the loader needs to know where it is.
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- 2. find_package(shoal) ----------------------------------------------
# CMAKE_PREFIX_PATH is how users point at a prefix. CMake searches
# <prefix>/lib/cmake and <prefix>/lib/<arch>/cmake everywhere but
# <prefix>/lib64/cmake only on lib64 platforms, so for any other libdir name
# also say where the package is.
find_args=(-DCMAKE_PREFIX_PATH="$prefix")
if [[ $libdir != lib && $libdir != lib/* ]]; then
  find_args+=(-Dshoal_DIR="$lib/cmake/shoal")
fi
step "configure and build the consumer with find_package(shoal)"
cfg_args=(-S "$consumer_dir" -B "$tmp/consumer-build" "${find_args[@]}"
          -DCMAKE_C_COMPILER="$cc"
          -DCMAKE_BUILD_TYPE=Release
          -DCMAKE_C_FLAGS="$cflags"
          -DSHOAL_REQUEST_VERSION="$version"
          -DSHOAL_EXPECT_VERSION="$version")
[[ -n $generator ]] && cfg_args+=(-G "$generator")
"$cmake" "${cfg_args[@]}" || die "configuring the consumer failed"
"$cmake" --build "$tmp/consumer-build" --verbose || die "building the consumer failed"

step "run the CMake-built consumer"
"$tmp/consumer-build/consumer" || die "the CMake-built consumer failed"

# ---- 3. an incompatible version must be refused --------------------------
step "find_package(shoal $((soversion + 1)).0) must fail (SameMajorVersion)"
bad_args=(-S "$consumer_dir" -B "$tmp/consumer-badversion" "${find_args[@]}"
          -DCMAKE_C_COMPILER="$cc"
          -DSHOAL_REQUEST_VERSION="$((soversion + 1)).0")
[[ -n $generator ]] && bad_args+=(-G "$generator")
if "$cmake" "${bad_args[@]}" >"$tmp/badversion.log" 2>&1; then
  cat "$tmp/badversion.log"
  die "find_package(shoal $((soversion + 1)).0) accepted shoal $version"
fi
grep -q 'considered but not accepted' "$tmp/badversion.log" ||
  { cat "$tmp/badversion.log"; die "find_package failed, but not for the version"; }

# ---- 4. pkg-config --------------------------------------------------------
step "build the consumer with pkg-config"
command -v pkg-config >/dev/null || die "pkg-config not found"
export PKG_CONFIG_PATH="$lib/pkgconfig"
pc_version=$(pkg-config --modversion shoal) || die "pkg-config cannot find shoal.pc"
[[ $pc_version == "$version" ]] || die "shoal.pc says version $pc_version, expected $version"
pc_flags=$(pkg-config --cflags --libs shoal) || die "pkg-config --cflags --libs shoal failed"
echo "pkg-config --cflags --libs shoal: $pc_flags"
# Word splitting of the flags is intended: this is how a Makefile uses them.
# shellcheck disable=SC2086
"$cc" -std=c11 $cflags -o "$tmp/consumer-pkgconfig" "$consumer_dir/consumer.c" $pc_flags ||
  die "compiling the consumer with pkg-config flags failed"

step "run the pkg-config-built consumer (no LD_LIBRARY_PATH: the RPATH from shoal.pc)"
env -u LD_LIBRARY_PATH "$tmp/consumer-pkgconfig" ||
  die "the pkg-config-built consumer failed (does shoal.pc's Libs carry -Wl,-rpath?)"

# ---- 5. the README's sequence, as written ---------------------------------
if [[ -n $readme && " ${tool_list[*]} " == *" shoalrun "* ]]; then
  step "the README's example: cc example.c \$(pkg-config ...), shoalrun -np 4 ./example"
  # The first C block after the "A short C example" heading.
  sed -n '/^## A short C example/,$p' "$readme" | sed -n '/^```c$/,/^```$/p' | sed '1d;/^```$/,$d' >"$tmp/example.c"
  [[ -s $tmp/example.c ]] || die "no C example found in $readme"
  # shellcheck disable=SC2046
  (cd "$tmp" && env -u LD_LIBRARY_PATH "$cc" example.c ${sanitize:+-fsanitize=$sanitize} \
     $(PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --cflags --libs shoal) -o example) ||
    die "building the README's example as the README says failed"
  (cd "$tmp" && env -u LD_LIBRARY_PATH -u SHOAL_STORE -u SHOAL_TOKEN timeout 120 "$bin/shoalrun" -np 4 ./example) ||
    die "the README's example under the installed shoalrun -np 4 failed"
fi

echo "install test: PASS"
