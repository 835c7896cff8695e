# rollout-stream worker image: the `rollout-stream` CLI (run, topics, synth, ...) on Python 3.11.
#
#   docker build -t rollout-stream:local .
#   docker run --rm rollout-stream:local rollout-stream --help
#
# The stage only needs a Kafka broker to talk to (docker-compose.yml starts one); no JVM in here.
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch first, from the CPU-only index: the stage never touches a GPU, and the default PyPI wheel
# drags in several GB of CUDA libraries. A separate layer so code changes do not re-download it.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch>=2.2"

# The package's wheel with its C extensions (setup.py), built with a C compiler that stays in this stage.
# Only what the package needs is copied; `README*` may match nothing, pyproject.toml always matches.
FROM base AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README* ./
COPY core ./core
COPY codec ./codec
COPY stream ./stream
RUN pip wheel --no-deps --wheel-dir /wheels .

# The image: that wheel and its remaining dependencies from PyPI (torch is already satisfied), checked to
# run the C extensions, not their Python fallback (codec/compiled.py).
FROM base
COPY --from=build /wheels /wheels
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu /wheels/*.whl \
    && rm -rf /wheels \
    && rollout-stream --help > /dev/null \
    && python -c "from codec import compiled; print(compiled.status().describe())" | grep -x "C extensions"

# Unprivileged at run time. The compose health check asks the worker's /healthz (--metrics-port);
# a --heartbeat-file, where used instead, lives in /tmp, which this user can write.
RUN useradd --create-home --uid 10001 rollout
USER rollout

CMD ["rollout-stream", "run"]
