#!/usr/bin/env bash
# Runs a Python check against Debian's python3 with the built `oom` module on its path.
# Usage: run_python_check.sh PYTHON_DIR SOURCE_DIR (script | notebook.ipynb) [OUT_DIR]
# Exits 77 (CTest: skipped) only when a needed package is not installed; any other failure fails.
set -euo pipefail
py_dir=$1 src=$2 what=$3 out=${4:-}
python=/usr/bin/python3
[ -x "$python" ] || { echo "skip: /usr/bin/python3 is not installed"; exit 77; }
need=(matplotlib numpy)
case "$what" in *.ipynb) need+=(nbconvert nbformat ipykernel) ;; esac
for m in "${need[@]}"; do
  "$python" -c "import $m" 2>/dev/null || { echo "skip: python module $m is not installed (scripts/install-deps.sh)"; exit 77; }
done
export OOM_PYTHON_DIR="$py_dir" OOM_SOURCE_DIR="$src" OOM_CONFIG_DIR="$src/configs" MPLBACKEND=Agg PYDEVD_DISABLE_FILE_VALIDATION=1
export PYTHONPATH="$py_dir:$src/python${PYTHONPATH:+:$PYTHONPATH}"
case "$what" in
  *.ipynb)
    mkdir -p "$out"
    cd "$(dirname "$what")"
    exec "$python" -m nbconvert --to notebook --execute --ExecutePreprocessor.timeout=300 \
      --ExecutePreprocessor.kernel_name=python3 --output-dir "$out" "$what" ;;
  *) exec "$python" "$what" ;;
esac
