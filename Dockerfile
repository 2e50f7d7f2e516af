# One image for every entroloop service of docker-compose.yml except vLLM (Dockerfile.serving): the
# gateway, the stream workers, both sinks, the action runner, migrate, the fleet and the trainer.
# `store` (chDB/ClickHouse client, pyarrow, the rule engine, runbooks) is always installed: every one
# of these services but the gateway needs it. The heavy training stack is opt-in (EXTRAS=...,train)
# so the streaming services stay small.
FROM python:3.11-slim
ARG EXTRAS="kafka,s3,gateway"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY entroloop ./entroloop
COPY collectors ./collectors
COPY streams ./streams
COPY sinks ./sinks
COPY training ./training
# The runbooks ship inside the package (streams/actions/builtin_runbooks): the build fails if they did not.
RUN pip install --no-cache-dir ".[store,${EXTRAS}]" && mkdir -p /var/lib/entroloop && chown nobody /var/lib/entroloop \
    && cd / && python -c "from entroloop.streams.actions.runbooks import BUILTIN_RUNBOOKS_DIR as d, load_runbooks; load_runbooks(d)"
USER nobody
ENTRYPOINT ["entroloop"]
CMD ["--help"]
