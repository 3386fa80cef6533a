# kind v0.33.0's base image (images/base/Dockerfile), assembled offline: the lab's Debian
# bookworm base instead of debian:trixie-slim, kind's own files from its module, and
# containerd, runc, crictl and the CNI plugins built here from their Go modules instead of
# cloned. Left out: nfs-common, open-iscsi, e2fsprogs (storage e2e tests) and
# containerd-fuse-overlayfs (rootless), which the lab does not use.
ARG BASE
FROM ${BASE}
COPY kind/usr/local/bin/ /usr/local/bin/
COPY kind/kind/ /kind/
COPY kind/etc/ /etc/
RUN chmod 0755 /usr/local/bin/* /kind /kind/bin /kind/bin/* \
 && echo "Installing Packages ..." \
 && DEBIAN_FRONTEND=noninteractive clean-install \
      systemd dbus \
      conntrack iptables nftables iproute2 ethtool util-linux mount kmod \
      libseccomp2 pigz \
      bash ca-certificates curl jq procps \
 && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* \
 && rm -f /etc/systemd/system/*.wants/* \
 && rm -f /lib/systemd/system/local-fs.target.wants/* \
 && rm -f /lib/systemd/system/sockets.target.wants/*udev* \
 && rm -f /lib/systemd/system/sockets.target.wants/*initctl* \
 && rm -f /lib/systemd/system/basic.target.wants/* \
 && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
 && ln -sf /usr/lib/systemd/systemd /sbin/init
RUN systemctl enable kubelet.service \
 && systemctl enable containerd.service \
 && systemctl enable undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service \
 && mkdir -p /etc/kubernetes/manifests
COPY bin/containerd bin/ctr bin/containerd-shim-runc-v2 /usr/local/bin/
RUN ctr oci spec \
      | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
      | jq 'del(.process.rlimits)' \
      > /etc/containerd/cri-base.json \
 && containerd --version
COPY bin/runc /usr/local/sbin/runc
COPY bin/crictl /usr/local/bin/crictl
COPY cni/ /opt/cni/bin/
RUN runc --version && crictl --version
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]
