"""The `oom` console command of the Python package: runs the C++ program the package holds
(oom/bin/oom) with this environment's site-packages on PYTHONPATH, so the plots it draws through
its embedded interpreter use this environment's matplotlib and numpy."""
import os
import sys
import sysconfig
from pathlib import Path


def main():
    exe = Path(__file__).resolve().parent / "bin" / "oom"
    if not exe.is_file():
        sys.exit(f"error: {exe}: the oom program is not in this package (reinstall it: pip install <checkout>)")
    env = dict(os.environ)
    paths = sysconfig.get_paths()
    site = [p for p in dict.fromkeys((paths["purelib"], paths["platlib"])) if p]
    if env.get("PYTHONPATH"):
        site.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(site)
    os.execve(str(exe), ["oom", *sys.argv[1:]], env)


if __name__ == "__main__":
    main()
