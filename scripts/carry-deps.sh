#!/usr/bin/env bash
# Gathers what the backend-only build (-DOOM_SIMULATOR=OFF) needs besides PyTorch, CMake and ninja
# into one folder that can travel to a GPU machine without Debian's -dev packages: the header-only
# libraries (nlohmann_json, fmt, CLI11, Eigen, the Boost.Graph headers the planner includes and
# what they include), Gloo's headers (c10d's Gloo header needs them; PyPI's torch ships none),
# GoogleTest's sources, and Google Benchmark's header and library (CI's backend build compiles the
# LibTorch benchmarks with them; a GPU check builds none). Run here, where scripts/install-deps.sh
# installed them.
#
#   scripts/carry-deps.sh [DIR]     (default .carry; configure with -DOOM_CARRIED_DEPS=$PWD/DIR)
#
# Made afresh each time, in DIR.new; an existing DIR with the same contents is kept as it is, so
# that a build against it does not recompile for new file times.
set -euo pipefail
cd "$(dirname "$0")/.."
final="${1:-.carry}"
dir="$final.new"
rm -rf "$dir"
mkdir -p "$dir/include"
for d in nlohmann fmt CLI gloo; do cp -r "/usr/include/$d" "$dir/include/"; done
mkdir -p "$dir/include/eigen3"
cp -r /usr/include/eigen3/Eigen "$dir/include/eigen3/"
# Boost: only the headers the planner's Boost.Graph include reaches (about 5 MB of 160).
probe="$(mktemp --suffix=.cc)"
grep -rh "#include <boost/" costmodel planner traces backend cli experiments | sort -u > "$probe"
g++ -std=c++20 -M "$probe" | tr ' \\' '\n\n' | grep '^/usr/include/boost/' | sort -u |
  while read -r h; do mkdir -p "$dir/$(dirname "${h#/usr/}")"; cp "$h" "$dir/${h#/usr/}"; done
rm -f "$probe"
cp -r /usr/src/googletest "$dir/googletest"
cp -r /usr/include/benchmark "$dir/include/"
mkdir -p "$dir/lib"
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so "$dir/lib/"
ln -s libbenchmark.so "$dir/lib/$(objdump -p "$dir/lib/libbenchmark.so" | awk '$1 == "SONAME" {print $2}')"
if [ -d "$final" ] && diff -rq --no-dereference "$final" "$dir" >/dev/null 2>&1; then
  rm -rf "$dir"
  echo "carry-deps: $final is up to date ($(du -sh "$final" | cut -f1))"
else
  rm -rf "$final"
  mv "$dir" "$final"
  echo "carry-deps: $(du -sh "$final" | cut -f1) in $final"
fi
