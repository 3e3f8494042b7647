# syntax=docker/dockerfile:1
# A CPU replica: tritonserver from the nvidia-pytriton wheel serving the CPU engine's repository (rendered
# into /var/lib/sluice/model_repository by an init container, e.g. python -m replicas.render).
# Build on the CPU family that runs it: the kernels are compiled -march=native. Context: repo root.
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
# libgomp: the CPU engine's OpenMP kernels.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 sluice \
 && useradd --system --uid 10001 --gid sluice --no-create-home --home-dir /nonexistent sluice
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/sluice /opt/sluice
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 SLUICE_STATE_DIR=/var/lib/sluice
WORKDIR /opt/sluice
USER 10001:10001
EXPOSE 8000 8001 8002
ENTRYPOINT ["python", "-m", "replicas.launcher"]
CMD ["--model-repository", "/var/lib/sluice/model_repository", "--host", "0.0.0.0", "--state-dir", "/var/lib/sluice/triton"]
