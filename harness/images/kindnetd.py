#!/usr/bin/python3
"""kindnetd, the lab's stand-in: kind's default CNI for the offline node image.

kind v0.33.0 ships ``docker.io/kindest/kindnetd`` (github.com/aojea/kindnet), built from a
module the Go proxy does not serve, so the node image the lab assembles offline runs this
instead, as the same DaemonSet (``kube-system/kindnet``, hostNetwork, NET_ADMIN). It does
the three things kindnetd's main loop does for a kind cluster on one Docker network:

- writes ``/etc/cni/net.d/10-kindnet.conflist`` for this node: ``ptp`` with ``host-local``
  IPAM over the node's ``spec.podCIDRs``, then ``portmap`` (the CNI plugins v1.9.1 in the
  node image), so kubelet's runtime becomes Ready;
- routes every other node's pod CIDRs via that node's InternalIP;
- masquerades traffic from pods to addresses outside the cluster's pod subnet.

It polls the nodes every few seconds (kindnetd watches them); it talks to the API server at
``CONTROL_PLANE_ENDPOINT`` (kind patches it in) because kube-proxy may not run yet.
Standard library only.
"""

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
CNI_CONFIG = "/etc/cni/net.d/10-kindnet.conflist"
POLL_SECONDS = 5


def log(message: str) -> None:
    print(f"kindnetd: {message}", file=sys.stderr, flush=True)


def api_server() -> str:
    endpoint = os.environ.get("CONTROL_PLANE_ENDPOINT")
    if not endpoint:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
        endpoint = f"{host}:{port}"
    return f"https://{endpoint}"


def list_nodes(server: str, context: ssl.SSLContext) -> list[dict]:
    with open(f"{SERVICE_ACCOUNT}/token") as f:
        token = f.read().strip()
    request = urllib.request.Request(
        f"{server}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return json.load(response)["items"]


def internal_ip(node: dict) -> str | None:
    addresses = node.get("status", {}).get("addresses") or []
    return next((a["address"] for a in addresses if a.get("type") == "InternalIP"), None)


def pod_cidrs(node: dict) -> list[str]:
    spec = node.get("spec", {})
    return list(spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else []))


def cni_config(cidrs: list[str]) -> str:
    config = {
        "cniVersion": "0.4.0",
        "name": "kindnet",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "dataDir": "/run/cni-ipam-state",
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "ranges": [[{"subnet": cidr}] for cidr in cidrs],
                },
                "mtu": 1500,
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(config, indent=2) + "\n"


def write_cni_config(cidrs: list[str]) -> None:
    text = cni_config(cidrs)
    try:
        with open(CNI_CONFIG) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    tmp = CNI_CONFIG + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, CNI_CONFIG)
    log(f"wrote {CNI_CONFIG} for pod CIDRs {', '.join(cidrs)}")


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def ensure_route(cidr: str, via: str, routes: dict[str, str]) -> None:
    if routes.get(cidr) == via:
        return
    proc = run("ip", "route", "replace", cidr, "via", via)
    if proc.returncode == 0:
        routes[cidr] = via
        log(f"route {cidr} via {via}")
    else:
        log(f"ip route replace {cidr} via {via} failed: {proc.stderr.strip()}")


def ensure_masquerade(pod_subnet: str) -> None:
    rule = ["-s", pod_subnet, "!", "-d", pod_subnet, "-j", "MASQUERADE"]
    if run("iptables", "-t", "nat", "-C", "POSTROUTING", *rule).returncode != 0:
        proc = run("iptables", "-t", "nat", "-A", "POSTROUTING", *rule)
        if proc.returncode != 0:
            log(f"masquerade rule failed: {proc.stderr.strip()}")


def main() -> None:
    host_ip = os.environ["HOST_IP"]
    pod_subnet = os.environ["POD_SUBNET"]
    server = api_server()
    context = ssl.create_default_context(cafile=f"{SERVICE_ACCOUNT}/ca.crt")
    log(f"node {host_ip}, pod subnet {pod_subnet}, API server {server}")
    ensure_masquerade(pod_subnet)
    routes: dict[str, str] = {}
    while True:
        try:
            nodes = list_nodes(server, context)
        except (OSError, ValueError) as exc:
            log(f"listing nodes failed: {exc}")
            time.sleep(POLL_SECONDS)
            continue
        for node in nodes:
            ip, cidrs = internal_ip(node), pod_cidrs(node)
            if not ip or not cidrs:
                continue
            if ip == host_ip:
                write_cni_config(cidrs)
            else:
                for cidr in cidrs:
                    ensure_route(cidr, ip, routes)
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    main()
