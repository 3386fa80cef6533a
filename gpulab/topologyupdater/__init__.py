"""A topology updater: each node's NUMA zones as a NodeResourceTopology object.

Mirrors kubernetes-sigs/node-feature-discovery v0.19.0 ``nfd-topology-updater``
(``pkg/nfd-topology-updater``, ``pkg/resourcemonitor/noderesourcesaggregator.go``):
``aggregate.py`` is the pure part (zones from the machine and the pods' allocations),
``updater.py`` the process (``gpulab topology-updater``).
"""
