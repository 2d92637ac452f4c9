#!/usr/bin/env bash
# The Python tests (tests/python, pytest) against a build tree's libshoal.
# Usage: scripts/test_python.sh [build dir]   (default: build)
#
# Runs Debian's /usr/bin/python3 (the one python3-torch, python3-numpy and
# python3-pytest install into; the python3 first on PATH may be another one);
# PYTHON=... overrides it. torch tests skip only where torch is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
python=${PYTHON:-/usr/bin/python3}

export SHOAL_LIBRARY="$build/lib/libshoal.so"
export PYTHONPATH="$PWD/bindings/python"
export OMP_NUM_THREADS=1
[ -f "$SHOAL_LIBRARY" ] || { echo "test_python.sh: $SHOAL_LIBRARY not found; build the shoal target first" >&2; exit 1; }
[ -x "$build/bin/shoalrun" ] || { echo "test_python.sh: $build/bin/shoalrun not found; build the shoalrun target" >&2; exit 1; }
"$python" -c "import numpy, pytest" 2>/dev/null || {
  echo "test_python.sh: $python lacks numpy or pytest; run scripts/setup.sh (python3-numpy python3-pytest)" >&2; exit 1; }

if [ "${SHOAL_TEST_WHEEL:-0}" = 1 ]; then
  # Opt-in (a full library compile): build and install the wheel in a fresh venv that
  # sees Debian's numpy/torch, then test the installed package, not the build tree.
  venv=$(mktemp -d)/venv
  echo "== wheel: pip install . into $venv =="
  "$python" -m venv --system-site-packages "$venv"
  start=$SECONDS
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$venv/bin/pip" install -q .
  echo "== wheel built and installed in $((SECONDS - start)) s =="
  (cd tests/python && env -u SHOAL_LIBRARY -u PYTHONPATH TEST_INSTALLED_WHEEL=1 \
     timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider test_installed.py test_core.py)
  rm -rf "$(dirname "$venv")"
  exit 0
fi

echo "== Python tests ($python, $SHOAL_LIBRARY; the 10 slowest are listed at the end) =="
status=0
(cd tests/python && timeout 900 "$python" -m pytest -q -p no:cacheprovider --durations=10 "${@:2}") || status=$?
# pytest exits 5 when it collected no tests: that is a failure too, not a pass.
if [ "$status" -eq 5 ]; then echo "test_python.sh: pytest collected no tests" >&2; fi
exit "$status"
