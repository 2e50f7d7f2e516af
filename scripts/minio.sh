#!/usr/bin/env bash
# MinIO (S3 with Object Lock) for the audit-log tests, on loopback.
#
#   scripts/minio.sh up       build (once, cached) and start MinIO; wait until ready; write .services.env lines
#   scripts/minio.sh down     stop it (SIGTERM, then SIGKILL after a grace period); remove its .services.env lines
#   scripts/minio.sh status   say where it runs; exit 1 if it does not
#   scripts/minio.sh env      print its ENTROLOOP_S3_* lines (for scripts/services.sh's minio_env)
#   scripts/minio.sh build    only build the binary (prints its path)
#   scripts/minio.sh clean    stop and delete its data and logs
#
# The server is built from its Go module at a pinned version with the machine's Go (no prebuilt
# download), into a cache outside the clone: $ENTROLOOP_CACHE_DIR/bin/minio-<version>/minio
# (default ~/.cache/entroloop). A cold build takes minutes (see BENCHMARKS/the sinks report); later
# runs reuse the binary. Data, log and pid live under .services/minio/.
#
# Environment knobs:
#   ENTROLOOP_MINIO_PORT        S3 API port (default: the port of the last run, else a free port)
#   ENTROLOOP_CACHE_DIR         build cache (default ~/.cache/entroloop)
#   ENTROLOOP_SERVICES_TIMEOUT  seconds to wait for readiness (default 120)
set -euo pipefail

# MinIO publishes no semver tags, so the Go module proxy knows it by pseudo-version; this one is
# the commit of 2026-02-12 (go.mod: go 1.24), which builds with Go 1.24 and newer.
MINIO_MODULE="github.com/minio/minio"
MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.services/minio"
ENV_FILE="$ROOT/.services.env"
CACHE="${ENTROLOOP_CACHE_DIR:-$HOME/.cache/entroloop}"
BIN_DIR="$CACHE/bin/minio-$MINIO_VERSION"
BIN="$BIN_DIR/minio"
TIMEOUT="${ENTROLOOP_SERVICES_TIMEOUT:-120}"
# Test-only credentials for a server that listens on 127.0.0.1 alone.
ACCESS_KEY="entroloop"
SECRET_KEY="entroloop-test-secret"

log() { printf '[minio] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pid_alive() { [[ -f "$STATE/minio.pid" ]] && kill -0 "$(cat "$STATE/minio.pid")" 2>/dev/null; }

port() {
    if [[ -n "${ENTROLOOP_MINIO_PORT:-}" ]]; then
        echo "$ENTROLOOP_MINIO_PORT"
    elif [[ -f "$STATE/port" ]]; then
        cat "$STATE/port"
    else
        free_port
    fi
}

build() {
    if [[ -x "$BIN" ]]; then
        echo "$BIN"
        return 0
    fi
    command -v go >/dev/null || die "Go is needed to build MinIO ($MINIO_MODULE@$MINIO_VERSION)"
    mkdir -p "$BIN_DIR"
    log "building $MINIO_MODULE@$MINIO_VERSION with $(go version | cut -d' ' -f3) (cold build: several minutes)"
    local started=$SECONDS
    # GOTOOLCHAIN=local: build with the installed Go, never fetch a toolchain.
    GOTOOLCHAIN=local GOBIN="$BIN_DIR" CGO_ENABLED=0 GOFLAGS="-buildvcs=false" \
        go install "$MINIO_MODULE@$MINIO_VERSION" >&2 || die "go install of MinIO failed"
    log "built $BIN in $((SECONDS - started))s"
    echo "$BIN"
}

env_lines() {
    local p
    p="$(cat "$STATE/port")"
    cat <<EOF
ENTROLOOP_S3_ENDPOINT=http://127.0.0.1:$p
ENTROLOOP_S3_REGION=us-east-1
ENTROLOOP_S3_ACCESS_KEY=$ACCESS_KEY
ENTROLOOP_S3_SECRET_KEY=$SECRET_KEY
EOF
}

# Replace this script's lines in .services.env (ENTROLOOP_S3_*), keeping every other service's.
write_env() {
    local tmp="$ENV_FILE.minio.$$"
    { [[ -f "$ENV_FILE" ]] && grep -v '^ENTROLOOP_S3_' "$ENV_FILE" || true; } >"$tmp"
    if [[ "${1:-}" == "add" ]]; then
        env_lines >>"$tmp"
    fi
    mv "$tmp" "$ENV_FILE"
}

ready() { curl -fsS -o /dev/null "http://127.0.0.1:$1/minio/health/ready" 2>/dev/null; }

up() {
    mkdir -p "$STATE/data"
    if pid_alive && ready "$(cat "$STATE/port")"; then
        log "already running on 127.0.0.1:$(cat "$STATE/port")"
        write_env add
        return 0
    fi
    local bin p
    bin="$(build)"
    p="$(port)"
    echo "$p" >"$STATE/port"
    log "starting on 127.0.0.1:$p (data: $STATE/data)"
    MINIO_ROOT_USER="$ACCESS_KEY" MINIO_ROOT_PASSWORD="$SECRET_KEY" MINIO_BROWSER=off \
        MINIO_UPDATE=off MINIO_CALLHOME_ENABLE=off \
        nohup "$bin" server "$STATE/data" --address "127.0.0.1:$p" --quiet --anonymous \
        >"$STATE/minio.log" 2>&1 &
    echo $! >"$STATE/minio.pid"
    local waited=0
    until ready "$p"; do
        pid_alive || { tail -20 "$STATE/minio.log" >&2; die "MinIO exited during start (log: $STATE/minio.log)"; }
        ((waited++ < TIMEOUT * 10)) || die "MinIO not ready after ${TIMEOUT}s (log: $STATE/minio.log)"
        sleep 0.1
    done
    log "ready on http://127.0.0.1:$p"
    write_env add
}

down() {
    if pid_alive; then
        local pid
        pid="$(cat "$STATE/minio.pid")"
        log "stopping (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/minio.pid"
    [[ -f "$ENV_FILE" ]] && write_env remove || true
}

status() {
    if pid_alive && ready "$(cat "$STATE/port")"; then
        echo "minio: running on http://127.0.0.1:$(cat "$STATE/port") (pid $(cat "$STATE/minio.pid"))"
    else
        echo "minio: down"
        return 1
    fi
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    env) if pid_alive; then env_lines; fi ;;
    build) build ;;
    clean) down; rm -rf "$STATE" ;;
    *) echo "usage: $0 up|down|status|env|build|clean" >&2; exit 2 ;;
esac
