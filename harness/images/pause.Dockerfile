# registry.k8s.io/pause: the sandbox every pod's containers join, built statically from
# kubernetes' build/pause/linux/pause.c as upstream's Makefile does.
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
