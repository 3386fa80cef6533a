# The lab's kindnetd (kindnetd.py): kind's default CNI daemon is built from a module the
# Go proxy does not serve, so the offline node image runs this small stand-in.
ARG BASE
FROM ${BASE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 iproute2 iptables \
 && rm -rf /var/lib/apt/lists/*
COPY iptables-wrapper /usr/sbin/iptables-wrapper
RUN for t in iptables iptables-save iptables-restore; do \
      ln -sf /usr/sbin/iptables-wrapper /usr/sbin/$t; done
COPY kindnetd.py /bin/kindnetd
ENTRYPOINT ["/bin/kindnetd"]
