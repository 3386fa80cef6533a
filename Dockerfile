# The one component image (gpulab:dev) for the kind and k3d backends: every component is
# `gpulab <command>` (device-plugin, node-agent, extender, ...), plus the NVML shim.
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/gpulab
COPY pyproject.toml Makefile ./
COPY gpulab gpulab
COPY harness harness
COPY demos demos
COPY fake-gpu fake-gpu
COPY manifests manifests
RUN make -C fake-gpu && pip install --no-cache-dir -e . \
 && python -c "import gpulab.deviceplugin.api"  # generate the gRPC stubs into the image
# pynvml loads libnvidia-ml.so.1 from the library path: the shim stands in for the driver
ENV LD_LIBRARY_PATH=/opt/gpulab/fake-gpu/build
ENTRYPOINT ["gpulab"]
