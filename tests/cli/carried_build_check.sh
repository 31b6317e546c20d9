#!/usr/bin/env bash
# scripts/check-carried-build.py on a made-up carried build: include paths under the source tree,
# the build, the carried folder and torch pass; one of Debian's (/usr/include/eigen3) fails, named.
set -u
checker="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src" "$tmp/build" "$tmp/carry/include" "$tmp/site/torch/share/cmake/Torch"
cat > "$tmp/build/CMakeCache.txt" <<CACHE
CMAKE_HOME_DIRECTORY:INTERNAL=$tmp/src
OOM_CARRIED_DEPS:PATH=$tmp/carry
Torch_DIR:PATH=$tmp/site/torch/share/cmake/Torch
CACHE
commands() {  # commands EXTRA_FLAG: one compile command with the allowed paths and EXTRA_FLAG
  cat > "$tmp/build/compile_commands.json" <<JSON
[{"directory": "$tmp/build", "file": "$tmp/src/a.cc",
  "command": "/usr/bin/c++ -I$tmp/src -I../src -isystem $tmp/carry/include -isystem $tmp/site/torch/include $1 -c $tmp/src/a.cc"}]
JSON
}
commands ""
python3 "$checker" "$tmp/build" || { echo "expected the allowed paths to pass"; exit 1; }
commands "-isystem /usr/include/eigen3"
out="$(python3 "$checker" "$tmp/build")"
rc=$?
echo "exit $rc: $out"
[ "$rc" -eq 1 ] || { echo "expected exit 1"; exit 1; }
grep -q "/usr/include/eigen3" <<<"$out" || { echo "expected the path named"; exit 1; }
