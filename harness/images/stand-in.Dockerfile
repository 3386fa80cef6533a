# A stand-in for a workload image no registry here serves (harness/images STAND_INS): the
# lab's image with the upstream image's default command, so a pod naming the upstream image
# runs; its nvidia-smi reads the NVML shim (the GPUs the device plugin gave the container).
ARG LAB
FROM ${LAB}
ARG LAB_ID
LABEL io.gpulab.stand-in="true" io.gpulab.lab-image="${LAB_ID}"
ENTRYPOINT []
CMD ["/bin/bash"]
