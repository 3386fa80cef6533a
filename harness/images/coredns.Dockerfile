# registry.k8s.io/coredns/coredns: kubeadm's Deployment runs the image's entrypoint with
# `-conf /etc/coredns/Corefile`.
FROM scratch
COPY coredns /coredns
EXPOSE 53 53/udp
ENTRYPOINT ["/coredns"]
