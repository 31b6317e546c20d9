#!/usr/bin/env bash
# `cmake --install` of a build into a temporary prefix, then that prefix used as a user would,
# from another folder, with OOM_CONFIG_DIR unset and the build-tree fallbacks off
# (OOM_NO_BUILD_TREE_FALLBACK=1: an install that lacks its data fails instead of reading the
# checkout): `oom --version`, `oom model show mixtral-8x7b`, `oom whatif --smallest` (the default
# study's smallest workloads), the plugin where the build has one, the Python package, and a C++
# program built against find_package(oom). The source folder is not touched.
# Usage: install_check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/oom-install-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
start=$(date +%s)
cmake --install "$build" --prefix "$prefix" >/dev/null
oom=$prefix/bin/oom
[ -x "$oom" ] || { echo "FAIL: $oom was not installed"; exit 1; }
unset OOM_CONFIG_DIR OOM_BACKEND_LIBRARY
export OOM_NO_BUILD_TREE_FALLBACK=1
mkdir "$work/elsewhere" && cd "$work/elsewhere"
fail() { echo "FAIL: $*"; exit 1; }

version=$("$oom" --version)
echo "$version"
grep -q "^configs: $prefix/share/oom/configs (beside the program" <<<"$version" || fail "--version does not name the install's configs"
grep -q "^commit: " <<<"$version" || fail "--version has no commit line"

"$oom" model show mixtral-8x7b | grep -q "^mixtral-8x7b" || fail "oom model show mixtral-8x7b"
"$oom" whatif --smallest -o "$work/whatif" >"$work/whatif.log" 2>&1 || { cat "$work/whatif.log"; fail "oom whatif --smallest"; }
grep -q '"oom_version"' "$work/whatif/study.json" || fail "study.json carries no oom_version"
# Every shipped study and the published records are installed.
for d in experiments/paper traces/paper; do
  [ "$(ls "$src/$d" | wc -l)" -eq "$(ls "$prefix/share/oom/$d" | wc -l)" ] || fail "share/oom/$d differs from the source's"
done

# The backend plugin, where this build has one: installed under lib/oom and loadable (LibTorch on its RPATH).
if [ -e "$build/cli/liboom_torch.so" ]; then
  [ -e "$prefix/lib/oom/liboom_torch.so" ] || fail "the plugin is not installed in lib/oom"
  grep -q "^backend: present ($prefix/lib/oom/liboom_torch.so)" <<<"$version" || fail "--version does not find the installed plugin"
  "$oom" train --help >/dev/null || fail "the installed plugin does not load"
else
  grep -q "^backend: absent" <<<"$version" || fail "--version should say the backend is absent"
fi

# The Python package, where this build has it: its own data, without the checkout.
if [ -d "$build/python/oom" ]; then
  site=$(find "$prefix/lib" -maxdepth 3 -type d -name site-packages | head -1)
  [ -n "$site" ] && [ -f "$site/oom/__init__.py" ] || fail "the Python package is not installed"
  PYTHONPATH=$site /usr/bin/python3 -c "
import oom, sys
assert oom.__version__ == '$(sed -n 's/^version: //p' <<<"$version")', oom.__version__
assert oom.data_path() == '$prefix/share/oom', oom.data_path()
assert 'mixtral-8x7b' in oom.model_names()
print('python: oom', oom.__version__, oom.version_text(), 'data', oom.data_path())
" || fail "the installed Python package"
fi

# A C++ program that embeds the planner through find_package(oom).
if [ -f "$prefix/lib/cmake/oom/oomConfig.cmake" ]; then
  export CCACHE_BASEDIR=$work
  cmake -S "$src/tests/install/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$work/consumer" >/dev/null
  OOM_CONFIG_DIR=$prefix/share/oom/configs "$work/consumer/oom_consumer" mixtral-8x7b | grep -q "^mixtral-8x7b: 46" || fail "the find_package(oom) program"
fi
echo "install check: passed in $(( $(date +%s) - start )) s"
