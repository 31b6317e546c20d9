#!/usr/bin/env bash
# Gathers what the backend-only build (-DOOM_SIMULATOR=OFF) needs besides PyTorch, CMake and ninja
# into one folder that can travel to a GPU machine without Debian's -dev packages: the header-only
# libraries (nlohmann_json, fmt, CLI11, Eigen, the Boost.Graph headers the planner includes and
# what they include), Gloo's headers (c10d's Gloo header needs them; PyPI's torch ships none) and
# GoogleTest's sources. Run here, where scripts/install-deps.sh installed them.
#
#   scripts/carry-deps.sh [DIR]     (default .carry; configure with -DOOM_CARRIED_DEPS=$PWD/DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.carry}"
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
echo "carry-deps: $(du -sh "$dir" | cut -f1) in $dir"
