from gpulab.deviceplugin.config import parse as parse_config
from harness import addons
from harness.addons.device_plugin import expected_resources, extra_configs, plugin_config
from harness.apply import MANIFESTS, load_documents
from harness.spec import device_plugin_config_name, node_labels, node_object, parse


def _node(profile: str, **plugin: object):
    return parse({"nodes": [{"name": "n", "profile": profile, "devicePlugin": plugin}]}).nodes[0]


def test_whole_gpus_times_replicas() -> None:
    assert expected_resources(_node("a100-sxm4-40gb-x8")) == {"nvidia.com/gpu": 8}
    assert expected_resources(_node("t4-x4", replicas=4)) == {"nvidia.com/gpu": 16}


def test_mig_mixed_counts_each_profile() -> None:
    # GPUs 0-3: 3g.40gb + 2g.20gb + 2x 1g.10gb; GPUs 4-7: 7x 1g.10gb
    assert expected_resources(_node("a100-80gb-mig-x8", migStrategy="mixed")) == {
        "nvidia.com/mig-3g.40gb": 4,
        "nvidia.com/mig-2g.20gb": 4,
        "nvidia.com/mig-1g.10gb": 4 * 2 + 4 * 7,
    }


def test_mig_single_counts_what_the_plugin_counts() -> None:
    # strategy single on a node with no MIG-enabled GPU: whole GPUs (the old harness
    # counted a non-MIG GPU as 1 MIG device each, which the plugin never did)
    assert expected_resources(_node("h100-80gb-x8", migStrategy="single")) == {"nvidia.com/gpu": 8}


def test_each_setting_is_a_named_config_in_upstreams_format() -> None:
    nodes = [
        _node("t4-x4", replicas=4),
        _node("a100-80gb-mig-x8", migStrategy="mixed"),
        _node("t4-x4", replicas=3, migStrategy="single"),
    ]
    names = [device_plugin_config_name(n.device_plugin) for n in nodes]
    assert names == ["time-slicing-4", "mig-mixed", "mig-single-time-slicing-3"]
    # each node selects its config through the label the config-manager reads
    assert [node_labels(n)["nvidia.com/device-plugin.config"] for n in nodes] == names
    shipped = next(
        d["data"]
        for d in load_documents([MANIFESTS / "device-plugin"])
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "nvidia-device-plugin-configs"
    )
    extra = extra_configs(nodes)
    assert set(extra) == {"mig-single-time-slicing-3"}  # only what the shipped ones lack
    data = {**shipped, **extra}
    for node in nodes:
        assert parse_config(data[device_plugin_config_name(node.device_plugin)]) == plugin_config(
            node.device_plugin
        )


def test_hami_nodes_get_hamis_label_not_nvidias() -> None:
    labels = node_labels(_node("t4-x4", hami=True))
    assert labels["gpu"] == "on"
    assert (
        "nvidia.com/gpu.present" not in labels and "nvidia.com/device-plugin.config" not in labels
    )
    assert labels["feature.node.kubernetes.io/pci-10de.present"] == "true"


def test_with_a_device_plugin_the_node_starts_without_gpu_capacity() -> None:
    node = _node("t4-x4")
    assert "nvidia.com/gpu" not in node_object(node, static_gpus=False)["status"]["capacity"]
    assert node_object(node)["status"]["capacity"]["nvidia.com/gpu"] == "4"


def test_real_kubelets_get_a_device_plugin_where_the_spec_deploys_none() -> None:
    # the Volcano cluster's spec: kwok Nodes carry the GPUs, a real kubelet needs a plugin
    assert addons.for_real_kubelets(["volcano"], gpu_nodes=True) == ["device-plugin", "volcano"]
    for providing in (["device-plugin", "kueue"], ["hami"], ["gpu-operator"]):
        assert addons.for_real_kubelets(providing, gpu_nodes=True) == providing
    assert addons.for_real_kubelets(["volcano"], gpu_nodes=False) == ["volcano"]
