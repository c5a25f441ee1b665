# lm-tuner: the CLI, the API, the runner and Ray (head or worker) in one image.
#   docker build -t lm-tuner .                                   # CPU build of torch
#   docker build -t lm-tuner:cuda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1 \
    LM_TUNER_HOME=/data \
    LM_TUNER_ARTIFACTS=/data/artifacts \
    TORCH_EXTENSIONS_DIR=/opt/torch_extensions

RUN apt-get update \
    && apt-get install -y --no-install-recommends curl g++ \
    && rm -rf /var/lib/apt/lists/*

# torch first, from the index matching the variant, so the project's dependencies never pull another build
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY models models
COPY trainers trainers
COPY tuner tuner
COPY api api
COPY dashboards dashboards
COPY spaces spaces
RUN pip install . && tuner kernels build

RUN useradd --create-home --uid 1000 tuner && mkdir -p /data/artifacts && chown -R tuner /data
USER tuner
VOLUME ["/data"]
EXPOSE 8000
ENTRYPOINT ["tuner"]
CMD ["--help"]
