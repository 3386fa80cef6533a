"""The local backend's kubelet for the lab's own pods (see runner.py).

main()  `gpulab pod-runner`: the runner and its service proxy until SIGTERM
"""
