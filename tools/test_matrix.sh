#!/usr/bin/env bash
# `make test-matrix`: the suite on the oldest and newest TensorFlow / Keras / Python the
# project claims (pyproject.toml, README.md), each in its own venv under .venv-matrix/.
# Not part of `make test` or every CI run: it downloads two TensorFlow wheels (~600 MB each)
# and runs the whole suite twice. When a claim changes, change the pins here with it.
#
#   tools/test_matrix.sh [oldest|newest ...]   (default: both, oldest first)
#   PYTHON_OLDEST=/path/to/python3.10 PYTHON_NEWEST=/path/to/python3.13 tools/test_matrix.sh
#   MATRIX_PYTEST_ARGS="tests/checkpoint" tools/test_matrix.sh oldest   (a subset)
set -euo pipefail
cd "$(dirname "$0")/.."

# name | python | pins (pip constraints: exact versions)
combo_oldest() { echo "${PYTHON_OLDEST:-python3.10}"; printf '%s\n' tensorflow==2.16.1 keras==3.10.0; }
combo_newest() { echo "${PYTHON_NEWEST:-python3.13}"; printf '%s\n' tensorflow==2.21.0 keras==3.15.1; }

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(oldest newest)
read -r -a pytest_args <<< "${MATRIX_PYTEST_ARGS:-}"
results=()
for name in "${names[@]}"; do
  spec=$("combo_$name")
  python=$(head -n1 <<< "$spec")
  venv=.venv-matrix/$name
  constraints=$venv.constraints.txt
  mkdir -p .venv-matrix
  tail -n +2 <<< "$spec" > "$constraints.new"
  start=$(date +%s)
  if ! cmp -s "$constraints.new" "$constraints" || [ ! -x "$venv/bin/python" ]; then
    echo "== $name: building $venv with $python and $(tr '\n' ' ' < "$constraints.new")"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
  fi
  # every time (quick when nothing changed): pyproject.toml's dependencies may have
  "$venv/bin/python" -m pip install --quiet -c "$constraints.new" -e '.[dev]' tensorflow keras
  mv "$constraints.new" "$constraints"
  "$venv/bin/python" -c 'import sys, tensorflow as tf, keras; print("==", sys.argv[1], "Python", sys.version.split()[0], "TensorFlow", tf.__version__, "Keras", keras.__version__)' "$name" 2>/dev/null
  status=passed
  if [ ${#pytest_args[@]} -gt 0 ]; then
    "$venv/bin/python" -m pytest -q -n auto --maxprocesses=4 --dist worksteal "${pytest_args[@]}" || status=FAILED
  else
    "$venv/bin/python" -m pytest -q -n auto --maxprocesses=4 --dist worksteal || status=FAILED
  fi
  results+=("$name: $status in $(( $(date +%s) - start )) s")
done
printf '== %s\n' "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -q FAILED
