#!/usr/bin/env python3
"""Checks that a backend-only build with carried headers (-DOOM_CARRIED_DEPS) reads nothing from
Debian's -dev packages, so it builds the same on a GPU machine that has only PyTorch, CMake, ninja
and a compiler.

    scripts/check-carried-build.py BUILD [--headers]

Include paths (always): every -I/-isystem/-iquote/-idirafter of BUILD/compile_commands.json lies
under the source tree, BUILD, the carried folder, the site-packages of the Python whose torch the
build uses (LibTorch, the nvidia-* wheels' NCCL and CUDA headers) or the CUDA toolkit that
LibTorch's CMake package asks for. The compiler's own folders never appear there (CMake leaves
implicit ones out), so a header that only Debian's /usr/include holds would slip through this
check: --headers (after a build) reads every header each object was compiled from
(`ninja -t deps`) and requires those under /usr/include to belong to the C and C++ runtime's
packages (dpkg -S: libc6-dev, linux-libc-dev, libstdc++-N-dev, libgcc-N-dev), not to, say,
libboost-dev.

Exits 1 with one line per offending path (at most 20), 0 with one summary line.
"""
import json
import os
import shlex
import subprocess
import sys

# Packages whose headers every machine with a C++ compiler has (the GPU machines' image too).
RUNTIME_PACKAGE_PREFIXES = ("libc6-dev", "linux-libc-dev", "libstdc++-", "libgcc-", "libcrypt-dev", "gcc-", "g++-")


def cache_values(build):
    values = {}
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith(("#", "//")) or "=" not in line or ":" not in line.split("=", 1)[0]:
                continue
            key, value = line.rstrip("\n").split("=", 1)
            values[key.split(":", 1)[0]] = value
    return values


def allowed_roots(build, cache):
    carried = cache.get("OOM_CARRIED_DEPS", "")
    if not carried:
        sys.exit(f"check-carried-build: {build} is not a carried build (OOM_CARRIED_DEPS is empty)")
    roots = [cache["CMAKE_HOME_DIRECTORY"], build, carried]
    torch_dir = cache.get("Torch_DIR", "")  # SITE/torch/share/cmake/Torch
    if torch_dir:
        roots.append(os.path.normpath(os.path.join(torch_dir, "../../../..")))
    for key in ("CUDAToolkit_INCLUDE_DIR", "CUDAToolkit_ROOT", "CUDAToolkit_BIN_DIR"):
        if cache.get(key):
            root = cache[key]
            if key == "CUDAToolkit_BIN_DIR":
                root = os.path.dirname(root)
            roots.append(root)
    return [os.path.realpath(r) for r in roots if r and not r.endswith("-NOTFOUND")]


def under(path, roots):
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + os.sep) for r in roots)


def include_paths(entry):
    args = shlex.split(entry["command"]) if "command" in entry else entry["arguments"]
    out = []
    i = 0
    while i < len(args):
        a = args[i]
        for flag in ("-isystem", "-iquote", "-idirafter", "-I"):
            if a == flag and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
                break
            if a.startswith(flag) and len(a) > len(flag):
                out.append(a[len(flag):])
                break
        i += 1
    return [p if os.path.isabs(p) else os.path.normpath(os.path.join(entry["directory"], p)) for p in out]


def check_include_paths(build, roots):
    bad, entries = set(), json.load(open(os.path.join(build, "compile_commands.json")))
    for e in entries:
        bad.update(p for p in include_paths(e) if not under(p, roots))
    return len(entries), sorted(bad)


def check_headers(build, roots):
    deps = subprocess.run(["ninja", "-C", build, "-t", "deps"], capture_output=True, text=True, check=True).stdout
    headers = {line.strip() for line in deps.splitlines() if line.startswith("    ")}
    headers = {h if os.path.isabs(h) else os.path.normpath(os.path.join(build, h)) for h in headers}
    outside = sorted(h for h in headers if not under(h, roots))
    system = [h for h in outside if h.startswith("/usr/include/")]
    bad = [h for h in outside if not h.startswith(("/usr/include/", "/usr/lib/gcc/"))]
    if system:
        owners = subprocess.run(["dpkg", "-S", *system], capture_output=True, text=True).stdout
        owned = {}
        for line in owners.splitlines():
            pkgs, path = line.split(": ", 1)
            owned[path] = [p.split(":")[0] for p in pkgs.split(", ")]
        for h in system:
            pkgs = owned.get(h, owned.get(os.path.realpath(h), ["(no package)"]))
            if not any(p.startswith(RUNTIME_PACKAGE_PREFIXES) for p in pkgs):
                bad.append(f"{h} ({', '.join(pkgs)})")
    return len(headers), bad


def main():
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__.strip().splitlines()[3].strip())
    build = os.path.realpath(sys.argv[1])
    roots = allowed_roots(build, cache_values(build))
    n, bad = check_include_paths(build, roots)
    what = f"{n} compile commands' include paths"
    if not bad and "--headers" in sys.argv[2:]:
        n, bad = check_headers(build, roots)
        what += f" and {n} headers read"
    if bad:
        for b in bad[:20]:
            print(f"check-carried-build: outside the carried folder, torch and the compiler: {b}")
        return 1
    print(f"check-carried-build: {what} lie under {', '.join(roots)} or the C/C++ runtime")
    return 0


if __name__ == "__main__":
    sys.exit(main())
