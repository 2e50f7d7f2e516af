#!/usr/bin/env bash
# Local test services: start, readiness check, stop and logs, in one place.
#
#   scripts/services.sh up     [SERVICE...]   start (idempotent: a running service is left alone)
#   scripts/services.sh down   [SERVICE...]   stop cleanly (SIGTERM, then SIGKILL after a grace period)
#   scripts/services.sh status [SERVICE...]   say what runs where; exit 1 if any is down
#   scripts/services.sh clean  [SERVICE...]   stop and delete data and logs
#
# SERVICE defaults to every service in SERVICES. Each service is a set of functions
# `<name>_up`, `<name>_down`, `<name>_status`, `<name>_env` (prints its KEY=VALUE lines for
# .services.env) and `<name>_clean`; to add a service, write those five and append its name to
# SERVICES (MinIO's are thin wrappers of scripts/minio.sh). Everything a service writes lives under
# .services/<name>/ (logs included); downloads are cached outside the clone (Maven: ~/.m2; MinIO's
# Go build: ~/.cache/entroloop). After every `up`/`down`, .services.env in the repo root holds the
# addresses of the running services as settings variables (ENTROLOOP_KAFKA_BOOTSTRAP=...,
# ENTROLOOP_S3_ENDPOINT=...).
#
# Environment knobs:
#   ENTROLOOP_KAFKA_PORT        broker port (default: the port of the last run, else a free port)
#   ENTROLOOP_KAFKA_HEAP        JVM heap of the broker (default 512m)
#   ENTROLOOP_KAFKA_JVM_OPTS    other JVM options of the broker (default: C1 JIT and serial GC)
#   ENTROLOOP_SERVICES_TIMEOUT  seconds to wait for readiness (default 120)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.services"
ENV_FILE="$ROOT/.services.env"
SERVICES=(kafka minio)
TIMEOUT="${ENTROLOOP_SERVICES_TIMEOUT:-120}"

log() { printf '[services] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

port_open() {  # port_open PORT: true if something accepts TCP connections on 127.0.0.1:PORT
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

pid_alive() {  # pid_alive PIDFILE: the recorded process runs and is still ours (not a recycled pid)
    [[ -f "$1" ]] || return 1
    local pid
    pid="$(cat "$1")"
    kill -0 "$pid" 2>/dev/null || return 1
    # Every service is started with its state folder on its command line.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$STATE/"
}

stop_pid() {  # stop_pid PIDFILE NAME GRACE_SECONDS
    local pidfile="$1" name="$2" grace="$3" pid
    if ! pid_alive "$pidfile"; then
        rm -f "$pidfile"
        return 0
    fi
    pid="$(cat "$pidfile")"
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 $((grace * 10))); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name did not stop within ${grace}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

# --- Kafka: one KRaft node (broker + controller combined) on loopback --------------------------------
KAFKA_DIR="$STATE/kafka"
KAFKA_POM="$ROOT/services/kafka/pom.xml"
# A test broker lives minutes and shares a small machine: the client JIT (C1) and the serial GC
# start it faster and use fewer threads than the server defaults; throughput is ample for tests.
KAFKA_JVM_OPTS="-XX:+UseSerialGC -XX:TieredStopAtLevel=1"

kafka_port() {
    if [[ -n "${ENTROLOOP_KAFKA_PORT:-}" ]]; then
        echo "$ENTROLOOP_KAFKA_PORT"
    elif [[ -f "$KAFKA_DIR/port" ]]; then
        cat "$KAFKA_DIR/port"
    else
        free_port
    fi
}

kafka_classpath() {
    # Resolve the broker's jars into ~/.m2 once; re-resolve only when the pom changes.
    local cp="$KAFKA_DIR/classpath.txt"
    if [[ ! -s "$cp" || "$KAFKA_POM" -nt "$cp" ]]; then
        command -v mvn >/dev/null || die "Maven (mvn) is needed to fetch the Kafka broker jars"
        log "resolving Kafka broker jars from Maven Central (cached in ~/.m2)"
        mvn -q -B -f "$KAFKA_POM" dependency:build-classpath -Dmdep.outputFile="$cp.tmp" \
            >"$KAFKA_DIR/maven.log" 2>&1 || { cat "$KAFKA_DIR/maven.log" >&2; die "Maven resolution failed"; }
        mv "$cp.tmp" "$cp"
    fi
    cat "$cp"
}

kafka_write_config() {  # kafka_write_config PORT CONTROLLER_PORT
    cat >"$KAFKA_DIR/server.properties" <<EOF
# Written by scripts/services.sh: a single-node KRaft cluster for tests, loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$2
listeners=PLAINTEXT://127.0.0.1:$1,CONTROLLER://127.0.0.1:$2
advertised.listeners=PLAINTEXT://127.0.0.1:$1
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$KAFKA_DIR/data
num.partitions=6
auto.create.topics.enable=true
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Tests create many short-lived consumer groups: do not wait 3 s before the first rebalance.
group.initial.rebalance.delay.ms=0
log.retention.hours=24
log.segment.bytes=67108864
EOF
    cat >"$KAFKA_DIR/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $KAFKA_DIR/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
EOF
}

kafka_up() {
    mkdir -p "$KAFKA_DIR"
    if pid_alive "$KAFKA_DIR/kafka.pid" && port_open "$(cat "$KAFKA_DIR/port")"; then
        log "kafka already up on 127.0.0.1:$(cat "$KAFKA_DIR/port") (pid $(cat "$KAFKA_DIR/kafka.pid"))"
        return 0
    fi
    stop_pid "$KAFKA_DIR/kafka.pid" kafka 10   # a half-started leftover
    command -v java >/dev/null || die "Java 17+ is needed to run the Kafka broker"
    local started port cport cp
    started=$(date +%s.%N)
    port="$(kafka_port)"
    port_open "$port" && die "port $port is taken by another process; set ENTROLOOP_KAFKA_PORT"
    # Keep the controller port across restarts too (the KRaft voter set names it).
    if [[ -f "$KAFKA_DIR/controller_port" ]] && ! port_open "$(cat "$KAFKA_DIR/controller_port")"; then
        cport="$(cat "$KAFKA_DIR/controller_port")"
    else
        cport="$(free_port)"
    fi
    echo "$cport" >"$KAFKA_DIR/controller_port"
    cp="$(kafka_classpath)"
    kafka_write_config "$port" "$cport"
    echo "$port" >"$KAFKA_DIR/port"
    if [[ ! -f "$KAFKA_DIR/data/meta.properties" ]]; then
        # KRaft storage must be formatted once with a cluster id; the data survives down/up so a
        # broker restart (fault tests) keeps its topics and committed offsets.
        local cluster_id
        cluster_id="$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>>"$KAFKA_DIR/format.log")"
        java -cp "$cp" -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
            kafka.tools.StorageTool format -t "$cluster_id" -c "$KAFKA_DIR/server.properties" \
            >>"$KAFKA_DIR/format.log" 2>&1 || { cat "$KAFKA_DIR/format.log" >&2; die "formatting KRaft storage failed"; }
    fi
    log "starting kafka on 127.0.0.1:$port (controller :$cport), logs in ${KAFKA_DIR#"$ROOT"/}/"
    # setsid: the broker outlives this script and is not hit by the caller's Ctrl-C.
    # shellcheck disable=SC2086  # ENTROLOOP_KAFKA_JVM_OPTS is a list of options
    setsid java -Xms256m -Xmx"${ENTROLOOP_KAFKA_HEAP:-512m}" ${ENTROLOOP_KAFKA_JVM_OPTS:-$KAFKA_JVM_OPTS} \
        -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
        -cp "$cp" kafka.Kafka "$KAFKA_DIR/server.properties" \
        >"$KAFKA_DIR/stdout.log" 2>&1 </dev/null &
    echo $! >"$KAFKA_DIR/kafka.pid"
    local deadline=$(( $(date +%s) + TIMEOUT ))
    until port_open "$port" && grep -q "Kafka Server started" "$KAFKA_DIR/server.log" 2>/dev/null; do
        if ! pid_alive "$KAFKA_DIR/kafka.pid"; then
            tail -n 40 "$KAFKA_DIR/stdout.log" "$KAFKA_DIR/server.log" >&2 2>/dev/null || true
            die "kafka exited during start (logs above)"
        fi
        (( $(date +%s) < deadline )) || die "kafka not ready after ${TIMEOUT}s (see $KAFKA_DIR/server.log)"
        sleep 0.2
    done
    log "kafka ready on 127.0.0.1:$port in $(python3 -c "import time; print(f'{time.time() - $started:.1f}')") s"
}

kafka_down() { stop_pid "$KAFKA_DIR/kafka.pid" kafka 30; }

kafka_status() {
    if pid_alive "$KAFKA_DIR/kafka.pid" && port_open "$(cat "$KAFKA_DIR/port")"; then
        echo "kafka: up on 127.0.0.1:$(cat "$KAFKA_DIR/port") (pid $(cat "$KAFKA_DIR/kafka.pid"))"
    else
        echo "kafka: down"
        return 1
    fi
}

kafka_env() {
    kafka_status >/dev/null 2>&1 && echo "ENTROLOOP_KAFKA_BOOTSTRAP=127.0.0.1:$(cat "$KAFKA_DIR/port")"
    return 0
}

kafka_clean() { kafka_down; rm -rf "$KAFKA_DIR"; }

# --- MinIO (S3 with Object Lock): scripts/minio.sh owns build, start, readiness and stop -------------
minio_up() { bash "$ROOT/scripts/minio.sh" up; }
minio_down() { bash "$ROOT/scripts/minio.sh" down; }
minio_status() { bash "$ROOT/scripts/minio.sh" status; }
minio_env() { bash "$ROOT/scripts/minio.sh" env; }
minio_clean() { bash "$ROOT/scripts/minio.sh" clean; }

# --- driver --------------------------------------------------------------------------------------------
write_env_file() {
    local lines="" svc
    for svc in "${SERVICES[@]}"; do lines+="$("${svc}_env")"$'\n'; done
    lines="$(printf '%s' "$lines" | sed '/^$/d')"
    if [[ -n "$lines" ]]; then
        printf '# Written by scripts/services.sh: addresses of the running test services.\n%s\n' "$lines" >"$ENV_FILE"
    else
        rm -f "$ENV_FILE"
    fi
}

main() {
    local cmd="${1:-}"
    shift || true
    local targets=("$@") svc rc=0
    [[ ${#targets[@]} -gt 0 ]] || targets=("${SERVICES[@]}")
    for svc in "${targets[@]}"; do
        [[ " ${SERVICES[*]} " == *" $svc "* ]] || die "unknown service '$svc' (known: ${SERVICES[*]})"
    done
    mkdir -p "$STATE"
    case "$cmd" in
        up)     for svc in "${targets[@]}"; do "${svc}_up"; done; write_env_file ;;
        down)   for svc in "${targets[@]}"; do "${svc}_down"; done; write_env_file ;;
        clean)  for svc in "${targets[@]}"; do "${svc}_clean"; done; write_env_file ;;
        status) for svc in "${targets[@]}"; do "${svc}_status" || rc=1; done; return $rc ;;
        *)      sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2 ;;
    esac
}

main "$@"
