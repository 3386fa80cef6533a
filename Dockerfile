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
# the gRPC stubs are generated into the image; `nvidia-smi` is the shim's (no real driver)
RUN make -C fake-gpu && pip install --no-cache-dir -e . \
 && python -c "import gpulab.deviceplugin.api" \
 && ln -s "$(command -v fake-nvidia-smi)" /usr/local/bin/nvidia-smi
# pynvml loads libnvidia-ml.so.1 from the library path: the shim stands in for the driver
ENV LD_LIBRARY_PATH=/opt/gpulab/fake-gpu/build
ENTRYPOINT ["gpulab"]
