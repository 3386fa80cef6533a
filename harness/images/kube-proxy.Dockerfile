# registry.k8s.io/kube-proxy: the binary plus the tools its iptables/nftables proxiers run,
# and iptables-wrapper (as upstream's distroless-iptables image) choosing the node's
# iptables backend, legacy or nft, on first use.
ARG BASE
FROM ${BASE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      iptables nftables conntrack ipset kmod \
 && rm -rf /var/lib/apt/lists/*
COPY iptables-wrapper /usr/sbin/iptables-wrapper
RUN for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do \
      ln -sf /usr/sbin/iptables-wrapper /usr/sbin/$t; done
COPY kube-proxy /usr/local/bin/kube-proxy
