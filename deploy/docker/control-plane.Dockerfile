# syntax=docker/dockerfile:1
# The control plane: the admin API (python -m control_plane.service) on :8090, with the sluice CLI and the
# weight store client (the replicas' init containers and registrar use this image too). It carries the
# llmapi Triton model (model.py + helpers.py) of the pinned TensorRT-LLM release for the render init
# container (TRTLLM_GIT_TAG: build_engines/trtllm_release.py's, tests/deploy/test_trtllm_release.py).
# Context: repo root.
ARG TRTLLM_GIT_TAG=v1.2.0
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/sluice
# Only the sources: never .sluice/ (state, tokens), .venv/ or tests.
COPY pyproject.toml setup.py ./
COPY sluice sluice
COPY sluice_client sluice_client
COPY replicas replicas
COPY gateway gateway
COPY control_plane control_plane
COPY cpu_engine/*.py cpu_engine/*.pyi cpu_engine/
COPY cpu_engine/csrc cpu_engine/csrc
COPY build_engines build_engines
COPY model_repository model_repository
# Editable: the renderers read model_repository/ beside the packages; the kernels build in place.
RUN pip install "numpy>=1.24,<2" "setuptools>=68" wheel \
 && pip install --no-build-isolation -e .

FROM python:3.11-slim-bookworm
ARG TRTLLM_GIT_TAG
# libgomp: the CPU engine's OpenMP kernels.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 sluice \
 && useradd --system --uid 10001 --gid sluice --no-create-home --home-dir /nonexistent sluice
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/sluice /opt/sluice
ADD https://github.com/NVIDIA/TensorRT-LLM.git#${TRTLLM_GIT_TAG}:triton_backend/all_models/llmapi /opt/tensorrt_llm/llmapi
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 SLUICE_STATE_DIR=/var/lib/sluice
WORKDIR /opt/sluice
USER 10001:10001
ENV SLUICE_CONTROL_PLANE_HOST=0.0.0.0
EXPOSE 8090
ENTRYPOINT ["python", "-m", "control_plane.service"]
