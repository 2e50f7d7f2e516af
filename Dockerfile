# One image for every entroloop service of docker-compose.yml (worker, sinks, trainer, actions).
# The heavy training stack is an opt-in build argument so the streaming services stay small.
FROM python:3.11-slim
ARG EXTRAS="kafka,s3"
WORKDIR /app
COPY pyproject.toml README.md ./
COPY entroloop ./entroloop
COPY collectors ./collectors
COPY streams ./streams
COPY sinks ./sinks
COPY training ./training
# The runbooks ship inside the package (streams/actions/builtin_runbooks): the build fails if they did not.
RUN pip install --no-cache-dir ".[${EXTRAS}]" && mkdir -p /var/lib/entroloop && chown nobody /var/lib/entroloop \
    && cd / && python -c "from streams.actions.runbooks import BUILTIN_RUNBOOKS_DIR as d, load_runbooks; load_runbooks(d)"
USER nobody
ENTRYPOINT ["entroloop"]
CMD ["--help"]
