# registry.k8s.io/kube-apiserver, kube-controller-manager, kube-scheduler and etcd as
# kubeadm's static pods run them: the binary on PATH. Upstream's images are distroless;
# these are the lab's Debian base with the binary built here from the pinned module.
ARG BASE
FROM ${BASE}
ARG BINARY
COPY ${BINARY} /usr/local/bin/${BINARY}
