#!/usr/bin/env bash
# GPU check (issue #18): one command on the GPU machine, done within 8 minutes.
#
#   bash bench/gpu_check.sh             # on the GPU machine (device tool `run`, carry wheels/gpu)
#   bash bench/gpu_check.sh --dry-run   # here, on CPU, in seconds (tests/test_gpu_check.py)
#
# 1. install (not in --dry-run unless --install; --no-install skips it): pydantic and its
#    dependencies from the carried wheels/gpu (`make gpu-wheels`), then rlbatch itself with
#    --no-deps (editable); offline (--no-index). If pip cannot write the interpreter's
#    site-packages, the wheels go to a --target folder on PYTHONPATH instead, and src/ is on
#    PYTHONPATH in any case.
# 2. facts: pip show torch transformers; uname -m; nvidia-smi --query-gpu (read only: no
#    setting of the GPU is changed by anything here).
# 3. python bench/gpu_check.py: the stages, writing gpu_check.json / gpu_check.md /
#    gpu_tests.log under $OUT (default ./out/gpu-check). Extra arguments are passed on.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./out/gpu-check}"
export OUT
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
DRY=0 INSTALL=auto
ARGS=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1; ARGS+=("$a") ;;
    --install) INSTALL=1 ;;
    --no-install) INSTALL=0 ;;
    *) ARGS+=("$a") ;;
  esac
done
[ "$INSTALL" = auto ] && { [ "$DRY" = 1 ] && INSTALL=0 || INSTALL=1; }
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)

if [ "$INSTALL" = 1 ]; then
  echo "[gpu-check] install (offline, wheels/gpu)"
  if ! "$PY" -c "import pydantic" 2>/dev/null; then
    if [ ! -d wheels/gpu ]; then
      echo "[gpu-check] error: pydantic is missing and wheels/gpu was not carried (make gpu-wheels; carry: [\"wheels/gpu\"])" >&2
      exit 3
    fi
    if ! "$PY" -m pip install -q --no-index --no-cache-dir --find-links wheels/gpu pydantic; then
      SITE="${TMPDIR:-/tmp}/rlbatch-site"
      echo "[gpu-check] pip could not install into $PY's site-packages: --target $SITE"
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" wheels/gpu/pydantic*.whl wheels/gpu/annotated_types*.whl \
        wheels/gpu/typing_inspection*.whl wheels/gpu/typing_extensions*.whl || exit 3
      export PYTHONPATH="$SITE:$PYTHONPATH"
    fi
  fi
  "$PY" -m pip install -q --no-deps --no-index --no-cache-dir --find-links wheels/gpu -e . \
    || echo "[gpu-check] editable install failed: running from src/ on PYTHONPATH"
  "$PY" -c "import pydantic, rlbatch.core.config" || { echo "[gpu-check] error: rlbatch does not import" >&2; exit 3; }
  echo "[gpu-check] install done in $(( $(date +%s) - T0 )) s"
fi

{
  echo "uname -m: $(uname -m)"
  "$PY" -m pip show torch transformers 2>/dev/null | grep -E '^(Name|Version|Location):'
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total --format=csv
  else
    echo "nvidia-smi: not found"
  fi
} 2>&1 | tee "$OUT/environment.txt"

# The Python part keeps its own deadline (450 s); this is the backstop for the 8 minutes.
if [ "$DRY" = 1 ]; then LIMIT=120; else LIMIT=$(( 470 - ( $(date +%s) - T0 ) )); fi
if command -v timeout >/dev/null 2>&1; then
  timeout --signal=TERM --kill-after=10 "$LIMIT" \
    "$PY" bench/gpu_check.py --out "$OUT" ${ARGS[@]+"${ARGS[@]}"}
else
  "$PY" bench/gpu_check.py --out "$OUT" ${ARGS[@]+"${ARGS[@]}"}
fi
RC=$?
echo "[gpu-check] exit $RC after $(( $(date +%s) - T0 )) s; results in $OUT"
exit $RC
