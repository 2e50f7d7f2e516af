#!/usr/bin/env bash
# `make test`: start the real services this suite needs, run every test, stop the services.
#
#   1. the light suite in .venv (unit tests, chDB, Kafka, MinIO tests);
#   2. the heavy suite (markers vllm, training, intent) in .venv-ml, which holds torch and the vLLM
#      CPU build and is built from nothing by scripts/install_ml_env.sh (cached, idempotent);
#   3. the acceptance suite (marker acceptance, tests/acceptance): the whole stack as a user runs
#      it, driven by the official openai SDK. The test process and the vLLM server run in .venv-ml
#      (openai comes with vLLM); the gateway, worker, sinks, actions and report in .venv.
# Set ENTROLOOP_SKIP_ML=1 to run only the light suite while developing (CI never sets it).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

HEAVY="vllm or training or intent"

stop_services() { bash scripts/services.sh down || true; }
trap stop_services EXIT

# the report test opens the HTML page in headless Chromium (Debian's package; about 3 minutes once)
if ! command -v chromium >/dev/null 2>&1 && [[ -z "${ENTROLOOP_CHROMIUM:-}" ]]; then
    echo "make test: installing Debian's chromium for the browser tests" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null \
        || { echo "make test: could not install chromium (apt-get install chromium)" >&2; exit 1; }
fi

bash scripts/services.sh up || { echo "make test: could not start the test services (see .services/*/)" >&2; exit 1; }
set -a
# shellcheck disable=SC1091
source .services.env
set +a

status=0
.venv/bin/python -m pytest -m "not ($HEAVY or acceptance)" "$@" || status=$?

if [[ "${ENTROLOOP_SKIP_ML:-0}" != "1" ]]; then
    bash scripts/install_ml_env.sh || { echo "make test: building .venv-ml failed" >&2; exit 1; }
    .venv-ml/bin/python -m pytest -m "$HEAVY" "$@"
    heavy=$?
    # exit 5 = no test selected: allowed only while no heavy test exists yet
    if [[ $heavy -ne 0 && $heavy -ne 5 ]]; then status=$heavy; fi
    ENTROLOOP_LIGHT_PYTHON="$ROOT/.venv/bin/python" .venv-ml/bin/python -m pytest -m acceptance "$@"
    acceptance=$?
    # exit 5 = no test selected: only when the arguments narrowed the run to other tests
    if [[ $acceptance -ne 0 && ! ( $acceptance -eq 5 && $# -gt 0 ) ]]; then status=$acceptance; fi
fi
exit $status
