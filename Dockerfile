# syntax=docker/dockerfile:1
# topoguard admission webhook image.
#
#   docker build -t ghcr.io/topoguard/topoguard:0.1.0 .
#
# Two stages on the same base (so the virtualenv's interpreter path is valid in both): the builder
# installs topoguard and its dependencies into /opt/venv from wheels; the runtime copies only that
# venv, removes pip/setuptools, and runs as an unprivileged user with nothing to write (the chart
# mounts the root filesystem read-only). Nothing at runtime needs a shell or package tools.
# Pin the base by digest in release builds (python:3.11-slim@sha256:…).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, from the lock (exact versions, hash-checked wheels; the same lock `make install`
# uses for the dev extras): this layer is reused while only app/ changes.
COPY requirements/runtime.lock ./requirements/runtime.lock
RUN /opt/venv/bin/pip install --require-hashes --only-binary=:all: -r requirements/runtime.lock
COPY pyproject.toml README.md ./
COPY app ./app
RUN /opt/venv/bin/pip install --no-deps . \
 && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
 && /opt/venv/bin/topoguard --version \
 && /opt/venv/bin/pip uninstall --yes pip setuptools wheel || true

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="topoguard" \
      org.opencontainers.image.description="Admission webhook keeping distributed GPU training jobs in one zone with open network paths" \
      org.opencontainers.image.source="https://github.com/topoguard/topoguard" \
      org.opencontainers.image.licenses="Apache-2.0"
# The system pip is not needed at runtime; leave no installer behind.
RUN python -m pip uninstall --yes pip setuptools wheel || true \
 && rm -rf /root/.cache /usr/local/lib/python3.11/ensurepip
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# 65532: the conventional "nonroot" uid/gid (distroless); matches the chart's runAsUser.
USER 65532:65532
WORKDIR /tmp
EXPOSE 8443
ENTRYPOINT ["topoguard", "serve"]
CMD ["--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key"]
