#!/bin/sh
# docker-compose one-shot service `check-secrets`: refuse to start the stack with placeholder or
# short passwords. `${VAR:?}` in docker-compose.yml only catches an empty value; this also catches
# what people paste from examples (`change-me-*`, `changeme`, `password`, `minioadmin`, ...), so
# ClickHouse, MinIO and Grafana never come up with a password everybody knows. The entroloop
# services check their own secrets again when they load their settings (ENTROLOOP_MODE=production).
# It also checks that Kafka's advertised address and its port binding agree.
#
# Usage: CHECK_SECRETS="VAR1 VAR2" check-secrets.sh   (POSIX sh and builtins only: it runs in the
# minio/mc image, which has no coreutils to speak of). Values are never printed.
set -eu

MIN_LENGTH="${CHECK_SECRETS_MIN_LENGTH:-16}"
failed=0

fail() {
    printf 'check-secrets: %s\n' "$*" >&2
    failed=1
}

for name in ${CHECK_SECRETS:?set CHECK_SECRETS to the names of the variables to check}; do
    eval "value=\${$name:-}"
    fix="set a random value in .env, e.g. \`openssl rand -base64 32 | tr -d /+=\`"
    if [ -z "$value" ]; then
        fail "$name is empty; $fix"
        continue
    fi
    # case-insensitive without tr: fold the few letters the placeholders use
    case "$value" in
        [Cc][Hh][Aa][Nn][Gg][Ee][-_]*[Mm][Ee]*|[Cc][Hh][Aa][Nn][Gg][Ee][Mm][Ee]*|[Rr][Ee][Pp][Ll][Aa][Cc][Ee][-_]*[Mm][Ee]*|\
        [Pp][Aa][Ss][Ss][Ww][Oo0][Rr][Dd]*|[Ss][Ee][Cc][Rr][Ee][Tt]|[Mm][Ii][Nn][Ii][Oo][Aa][Dd][Mm][Ii][Nn]|\
        [Aa][Dd][Mm][Ii][Nn]|[Dd][Ee][Ff][Aa][Uu][Ll][Tt]|[Yy][Oo][Uu][Rr][-_]*|"<"*|"\${"*)
            fail "$name is a placeholder (as in .env.example or a tutorial), not a password; $fix"
            continue
            ;;
    esac
    if [ "${#value}" -lt "$MIN_LENGTH" ]; then
        fail "$name is shorter than $MIN_LENGTH characters; $fix"
    fi
done

# the limited MinIO users must not be the root user under another name
for pair in "MINIO_AUDIT_WRITER_USER" "MINIO_AUDIT_READER_USER"; do
    eval "user=\${$pair:-}"
    if [ -n "$user" ] && [ "$user" = "${MINIO_ROOT_USER:-}" ]; then
        fail "$pair equals MINIO_ROOT_USER; the audit services must use their own limited user"
    fi
done

# Kafka's EXTERNAL listener: advertising a host that serving nodes elsewhere resolve, while the port
# is published on the loopback address only, gives them an address they can never connect to
case "${KAFKA_ADVERTISED_HOST:-localhost}" in
    localhost|127.*|::1) ;;
    *)
        case "${KAFKA_BIND_ADDRESS:-127.0.0.1}" in
            127.*|localhost|::1)
                fail "KAFKA_ADVERTISED_HOST is ${KAFKA_ADVERTISED_HOST} but KAFKA_BIND_ADDRESS is ${KAFKA_BIND_ADDRESS:-127.0.0.1}: remote serving nodes could not connect; set KAFKA_BIND_ADDRESS=0.0.0.0 (or this host's address) in .env"
                ;;
        esac
        ;;
esac

if [ "$failed" -ne 0 ]; then
    printf 'check-secrets: refusing to start the stack (see .env.example)\n' >&2
    exit 1
fi
printf 'check-secrets: %s ok\n' "$CHECK_SECRETS"
