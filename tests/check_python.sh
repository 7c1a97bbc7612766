#!/bin/sh
# check_python.sh: the Python package's tests (python/tests, pytest) against this build's
# cavs and libcavs. The package is installed first as a user installs it (pip install
# ./python, offline: --no-build-isolation --no-deps, from a copy so the source tree gets
# no build files) into a scratch directory, where pip and setuptools are there; else the
# tests import it from the source. Skipped (77) without a Python 3 that has NumPy and
# pytest, in a sanitizer build (an ASan-built libcavs loads into Python only with the
# ASan runtime preloaded) and under valgrind (Python under memcheck is far too slow).
top=${TOP_SRCDIR:-.}
build=${BUILDDIR:-.}
if [ -n "$SAN_CFLAGS" ]; then echo "check_python: skipped in a sanitizer build"; exit 77; fi
if [ -n "$CAVS_TEST_WRAPPER" ]; then echo "check_python: skipped under valgrind"; exit 77; fi
# bootstrap's virtual environment (Debian's NumPy and pytest, safetensors from PyPI),
# then Debian's Python, then whatever python3 is first on PATH
py=
for cand in "$PYTHON" "$build/python-venv/bin/python" /usr/bin/python3 python3; do
  [ -n "$cand" ] || continue
  if "$cand" -c 'import numpy, pytest' >/dev/null 2>&1; then py=$cand; break; fi
done
[ -n "$py" ] || { echo "check_python: skipped: no Python 3 with NumPy and pytest"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cavs-python.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pypath=$top/python
if "$py" -m pip --version >/dev/null 2>&1 && "$py" -c 'import setuptools' >/dev/null 2>&1; then
  cp -R "$top/python" "$tmp/src"
  if ! "$py" -m pip install -q --no-build-isolation --no-deps --no-index --target "$tmp/site" "$tmp/src" \
      >"$tmp/pip.log" 2>&1; then
    cat "$tmp/pip.log"
    echo "check_python: pip install ./python failed"
    exit 1
  fi
  pypath=$tmp/site
fi
echo "check_python: $("$py" --version 2>&1) at $py; the package from $pypath"
CAVS=$build/cavs CAVS_LIB=$build/.libs/libcavs.so.2 CAVS_CACHE=$tmp/cache PYTHONPATH=$pypath \
  PYTHONDONTWRITEBYTECODE=1 TOP_SRCDIR=$top \
  "$py" -m pytest -q -p no:cacheprovider --rootdir "$tmp" "$top/python/tests" || exit 1
# The package on the cuda backend (python/tests/test_cuda.py), against the cpu backend:
# libcavs built on the emulated device (tests/libcavs-emu, make check's), and the cavs
# command built on it, whose `build --target cuda` compiles MODEL.cu for that device.
emu=$build/tests/.libs/libcavs-emu.so.0
if [ -x "$build/tests/cavs-emu" ] && [ -f "$emu" ]; then
  echo "check_python: the package on the emulated cuda device ($emu)"
  CAVS=$build/tests/cavs-emu CAVSC=$build/cavsc CAVS_LIB=$emu CAVS_TEST_CUDA=1 CAVS_CACHE=$tmp/cache-emu \
    PYTHONPATH=$pypath PYTHONDONTWRITEBYTECODE=1 TOP_SRCDIR=$top \
    "$py" -m pytest -q -p no:cacheprovider --rootdir "$tmp" "$top/python/tests/test_cuda.py"
else
  echo "check_python: no emulated cuda device built: the package on cuda not tested"
fi
