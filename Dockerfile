# The one component image (gpulab:dev) for the kind and k3d backends: every component is
# `gpulab <command>` (device-plugin, extender, ...), plus the NVML shim.
# BASE_IMAGE: python:3.11-slim where a registry answers; offline, the lab's Debian
# bookworm base (harness/images), whose python3 is 3.11 from Debian's packages.
ARG BASE_IMAGE=python:3.11-slim

# the NVML shim, compiled in a stage of its own: the image carries no compiler (kind loads
# the image into every node, so its size is paid at each cluster start)
FROM ${BASE_IMAGE} AS shim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      gcc libc6-dev make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY fake-gpu fake-gpu
RUN make -C fake-gpu

FROM ${BASE_IMAGE}
RUN if ! command -v python3 >/dev/null; then \
      apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
           python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /opt/gpulab
# the dependencies first, in a layer of their own: a code change does not reinstall them.
# host-ca.pem: `gpulab build --images` puts the host's CA bundle there (a TLS-inspecting
# proxy's CA reaches pip); empty in the repository, so a plain `docker build .` uses pip's.
COPY pyproject.toml ./
COPY harness/images/host-ca.pem /etc/gpulab/host-ca.pem
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && if [ -s /etc/gpulab/host-ca.pem ]; then export PIP_CERT=/etc/gpulab/host-ca.pem; fi \
 && pip install --no-cache-dir --quiet --progress-bar off -r /tmp/requirements.txt
COPY Makefile ./
COPY fake-gpu fake-gpu
COPY --from=shim /src/fake-gpu/build fake-gpu/build
COPY gpulab gpulab
COPY harness harness
COPY demos demos
COPY manifests manifests
# the gRPC stubs are generated into the image; `nvidia-smi` is the shim's (no real driver)
RUN if [ -s /etc/gpulab/host-ca.pem ]; then export PIP_CERT=/etc/gpulab/host-ca.pem; fi \
 && pip install --no-cache-dir --quiet --no-deps -e . \
 && python -c "import gpulab.deviceplugin.api" \
 && ln -s "$(command -v fake-nvidia-smi)" /usr/local/bin/nvidia-smi
# pynvml loads libnvidia-ml.so.1 from the library path: the shim stands in for the driver
ENV LD_LIBRARY_PATH=/opt/gpulab/fake-gpu/build PYTHONUNBUFFERED=1
ENTRYPOINT ["gpulab"]
