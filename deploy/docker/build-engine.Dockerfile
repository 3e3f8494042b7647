# syntax=docker/dockerfile:1
# The engine-build Job's image: NGC's TensorRT-LLM Triton image (tensorrt_llm, trtllm-build, examples/ at
# /app/tensorrt_llm/examples) with Sluice installed on top, run as its non-root triton-server user.
# Keep the tag equal to the replicas' (deploy/kubernetes/base/kustomization.yaml): an engine loads only
# under the TensorRT-LLM that built it. Context: the repository root.
ARG TRITON_TAG=25.12-trtllm-python-py3
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG} AS build
# --system-site-packages: sluice build-engine imports the image's tensorrt_llm.
RUN python3 -m venv --system-site-packages /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/sluice
COPY pyproject.toml setup.py ./
COPY sluice sluice
COPY gateway gateway
COPY control_plane control_plane
COPY cpu_engine/*.py cpu_engine/*.pyi cpu_engine/
COPY cpu_engine/csrc cpu_engine/csrc
COPY build_engines build_engines
COPY model_repository model_repository
RUN pip install "numpy>=1.24,<2" "setuptools>=68" wheel \
 && pip install --no-build-isolation -e .

FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/sluice /opt/sluice
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /opt/sluice
USER 1000:1000
ENTRYPOINT ["sluice"]
CMD ["build-engine", "--help"]
