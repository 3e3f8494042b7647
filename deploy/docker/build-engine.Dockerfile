# syntax=docker/dockerfile:1
# The engine-build Job's image: NGC's TensorRT-LLM Triton image (tensorrt_llm, trtllm-build) with Sluice
# installed on top and TensorRT-LLM's own examples/ (convert_checkpoint.py, quantize.py) of the same
# release at /opt/tensorrt_llm/examples (the Triton TensorRT-LLM images have been reported without
# /app: tensorrtllm_backend#721), run as its non-root triton-server user. Both ARGs are
# build_engines/trtllm_release.py's TRITON_TAG and TRTLLM_GIT_TAG (tests/deploy/test_trtllm_release.py):
# an engine loads only under the TensorRT-LLM that built it. Context: the repository root.
ARG TRITON_TAG=26.03-trtllm-python-py3
ARG TRTLLM_GIT_TAG=v1.2.0
FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG} AS build
# --system-site-packages: sluice build-engine imports the image's tensorrt_llm.
RUN python3 -m venv --system-site-packages /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/sluice
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
RUN pip install "numpy>=1.24,<2" "setuptools>=68" wheel \
 && pip install --no-build-isolation -e .

FROM nvcr.io/nvidia/tritonserver:${TRITON_TAG}
ARG TRTLLM_GIT_TAG
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/sluice /opt/sluice
ADD https://github.com/NVIDIA/TensorRT-LLM.git#${TRTLLM_GIT_TAG}:examples /opt/tensorrt_llm/examples
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /opt/sluice
USER 1000:1000
ENTRYPOINT ["sluice"]
CMD ["build-engine", "--help"]
