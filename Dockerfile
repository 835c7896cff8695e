# rollout-stream worker image: the `rollout-stream` CLI (run, topics, synth, ...) on Python 3.11.
#
#   docker build -t rollout-stream:local .
#   docker run --rm rollout-stream:local rollout-stream --help
#
# The stage only needs a Kafka broker to talk to (docker-compose.yml starts one); no JVM in here.
FROM python:3.11-slim AS base

# ROLLOUT_STREAM_CACHE: where the compiled hot path is looked for (codec/compiled.py), outside any home.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ROLLOUT_STREAM_CACHE=/opt/rollout-stream

WORKDIR /app

# torch first, from the CPU-only index: the stage never touches a GPU, and the default PyPI wheel
# drags in several GB of CUDA libraries. A separate layer so code changes do not re-download it.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.2"

# Then the package and its remaining dependencies from PyPI (torch is already satisfied).
# Only what the package needs is copied; `README*` may match nothing, pyproject.toml always matches.
COPY pyproject.toml README* ./
COPY core ./core
COPY codec ./codec
COPY stream ./stream
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu . \
    && rollout-stream --help > /dev/null

# The compiled hot path (`make compiled` on a checkout): mypyc builds the per-record modules with a C compiler
# that stays in this stage (mypy pinned as in pyproject.toml's test extras; setuptools drives the build). A
# build is keyed by the modules' sources, the same files here in /app and in site-packages.
FROM base AS compiled
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install "mypy>=2.4,<2.5" "setuptools>=68" \
    && python -m stream.tools.compile --quiet \
    && python -m stream.tools.compile --status | grep "compiled (mypyc)"

# The image: the package and the build only (keyed by the installed sources, so exactly these).
FROM base
COPY --from=compiled /opt/rollout-stream/compiled /opt/rollout-stream/compiled
RUN python -m stream.tools.compile --status | grep "compiled (mypyc)"

# Unprivileged at run time. The compose health check asks the worker's /healthz (--metrics-port);
# a --heartbeat-file, where used instead, lives in /tmp, which this user can write.
RUN useradd --create-home --uid 10001 rollout
USER rollout

CMD ["rollout-stream", "run"]
