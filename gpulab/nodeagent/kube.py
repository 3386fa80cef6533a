"""The node agent's API-server side (:class:`manager.NodeAPI` over the official client).

What kubelet does through its node status updater (capacity/allocatable of device-plugin
resources via the status subresource) and its status manager (a rejected pod becomes
``Failed`` / ``UnexpectedAdmissionError``). The pods come from a :mod:`gpulab.informer`
with kubelet's ``spec.nodeName`` field selector (see ``commands.py``).
"""

from __future__ import annotations

from kubernetes import client


class KubeNodeAPI:
    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)

    def patch_node_resources(
        self, node: str, capacity: dict[str, str], allocatable: dict[str, str]
    ) -> None:
        body = {"status": {"capacity": capacity, "allocatable": allocatable}}
        self._core.patch_node_status(node, body)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})

    def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> None:
        body = {"status": {"phase": "Failed", "reason": reason, "message": message}}
        self._core.patch_namespaced_pod_status(name, namespace, body)
