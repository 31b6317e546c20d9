#!/usr/bin/env bash
# `pip install` from a wheel, as a user outside the checkout would: builds the wheel of SOURCE_DIR
# (pyproject.toml, scikit-build-core) with BUILDER_PYTHON, simulator only (no torch), in
# WHEEL_BUILD_DIR (kept between runs; beside the build tree, so ccache finds the build's objects),
# installs it into a new virtual environment (Debian's numpy and matplotlib through
# --system-site-packages: nothing is downloaded), and from another folder, with OOM_CONFIG_DIR
# unset and the build-tree fallbacks off, runs `oom --version`, `oom whatif --smallest` (the
# default study's smallest workloads) and `python -c "import oom; print(oom.__version__)"`.
# Exits 77 (skipped) when BUILDER_PYTHON lacks scikit-build-core or pybind11, except under
# CI=true, where that fails: scripts/install-deps.sh installs them.
# Usage: wheel_check.sh BUILDER_PYTHON SOURCE_DIR WHEEL_BUILD_DIR [CXX]
# CXX: the build's compiler, by the same name (ccache hashes the name; scikit-build-core would
# otherwise take Python's, e.g. x86_64-linux-gnu-g++).
set -euo pipefail
builder=$1 src=$2 wheel_build=$3
if [ -n "${4:-}" ]; then export CXX=$4; fi
fail() { echo "FAIL: $*"; exit 1; }
if ! "$builder" -c 'import scikit_build_core, pybind11' 2>/dev/null; then
  [ "${CI:-}" = true ] && fail "$builder has no scikit-build-core or pybind11 (scripts/install-deps.sh installs them)"
  echo "skip: $builder has no scikit-build-core or pybind11 (scripts/install-deps.sh installs them)"
  exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/oom-wheel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
# ccache: paths relative to the checkout, as scripts/test.sh sets them, so a wheel build beside the
# build tree reuses its objects.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$src}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
"$builder" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -q -w "$work/dist" \
  --config-settings=build-dir="$wheel_build" --config-settings=cmake.define.OOM_WITH_TORCH=OFF "$src" >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; fail "building the wheel"; }
built=$(date +%s)
wheel=$(ls "$work"/dist/oom-*.whl)
echo "wheel: $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) built in $((built - start)) s"

/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --no-index --disable-pip-version-check -q "$wheel" || fail "installing the wheel"
unset OOM_CONFIG_DIR OOM_BACKEND_LIBRARY PYTHONPATH
export OOM_NO_BUILD_TREE_FALLBACK=1
mkdir "$work/elsewhere" && cd "$work/elsewhere"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')

version=$("$work/venv/bin/oom" --version) || fail "oom --version"
echo "$version"
grep -q "^configs: $site/oom/share/oom/configs (beside the program" <<<"$version" || fail "--version does not name the package's configs"
grep -q "^backend: absent" <<<"$version" || fail "a wheel built without torch should have no backend"
if "$work/venv/bin/oom" train --steps 1 2>"$work/train.err"; then fail "oom train without the backend succeeded"; fi
grep -q "pip install" "$work/train.err" || { cat "$work/train.err"; fail "oom train does not say how to get the backend"; }

"$work/venv/bin/oom" whatif --smallest -o "$work/whatif" >"$work/whatif.log" 2>&1 || { cat "$work/whatif.log"; fail "oom whatif --smallest"; }
grep -q '"oom_version"' "$work/whatif/study.json" || fail "study.json carries no oom_version"
ls "$work/whatif"/*.png >/dev/null 2>&1 || fail "oom whatif drew no plots"

py_version=$("$work/venv/bin/python" -c "import oom; print(oom.__version__)") || fail "import oom"
[ "$py_version" = "$(sed -n 's/^version: //p' <<<"$version")" ] || fail "oom.__version__ $py_version differs from oom --version"
"$work/venv/bin/python" -c "
import oom
assert oom.data_path() == '$site/oom/share/oom', oom.data_path()
assert 'qwen3.6-35b-a3b' in oom.model_names()
from oom import plots
print('python: oom', oom.__version__, oom.version_text())
" || fail "the installed package's data"
echo "wheel check: passed in $(( $(date +%s) - start )) s (wheel build $((built - start)) s)"
