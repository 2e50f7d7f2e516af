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
RUN pip install --no-cache-dir ".[${EXTRAS}]" && mkdir -p /var/lib/entroloop && chown nobody /var/lib/entroloop
USER nobody
ENTRYPOINT ["entroloop"]
CMD ["--help"]
