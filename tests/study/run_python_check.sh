#!/usr/bin/env bash
# Runs a Python check against Debian's python3 with the built `oom` package on its path
# (PYTHONPATH=BUILD/python: the notebooks themselves edit no path).
# Usage: run_python_check.sh PYTHON_DIR SOURCE_DIR (script | notebook.ipynb) [OUT_DIR [IMAGES]]
# A notebook is executed into OUT_DIR; with IMAGES, the executed notebook must show exactly that
# many PNG images (every chart it draws is displayed, none drawn into nothing).
# Exits 77 (CTest: skipped) only when a needed package is not installed; any other failure fails.
set -euo pipefail
py_dir=$1 src=$2 what=$3 out=${4:-} images=${5:-}
python=/usr/bin/python3
[ -x "$python" ] || { echo "skip: /usr/bin/python3 is not installed"; exit 77; }
need=(matplotlib numpy)
case "$what" in *.ipynb) need+=(nbconvert nbformat ipykernel) ;; esac
for m in "${need[@]}"; do
  "$python" -c "import $m" 2>/dev/null || { echo "skip: python module $m is not installed (scripts/install-deps.sh)"; exit 77; }
done
# The build tree's package (BUILD/python/oom) finds the source tree's configs and studies itself.
export OOM_SOURCE_DIR="$src" MPLBACKEND=Agg PYDEVD_DISABLE_FILE_VALIDATION=1
unset OOM_CONFIG_DIR
export PYTHONPATH="$py_dir${PYTHONPATH:+:$PYTHONPATH}"
case "$what" in
  *.ipynb)
    mkdir -p "$out"
    cd "$(dirname "$what")"
    # A cell may take the test's whole time (CTest's TIMEOUT 600 bounds the notebook): the
    # flat-schedules notebook took 238 s in all on two cores (its composed-schedules study is one
    # cell), and a cell limit of 300 s failed it on a loaded machine.
    "$python" -m nbconvert --to notebook --execute --ExecutePreprocessor.timeout=570 \
      --ExecutePreprocessor.kernel_name=python3 --output-dir "$out" "$what"
    if [ -n "$images" ]; then
      "$python" - "$out/$(basename "$what")" "$images" <<'PY'
import json, sys
nb = json.load(open(sys.argv[1]))
shown = sum("image/png" in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))
if shown != int(sys.argv[2]):
    sys.exit(f"{sys.argv[1]}: shows {shown} images, expected {sys.argv[2]}")
print(f"{sys.argv[1]}: {shown} images shown")
PY
    fi ;;
  *) exec "$python" "$what" ;;
esac
