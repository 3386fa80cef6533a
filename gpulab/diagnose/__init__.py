"""`gpulab diagnose`: where an object's call chain stops, read from a live cluster.

objects.py  the recorded object set (a dataclass of API objects; JSON for fixtures)
reader.py   the only I/O: read that set from a cluster (GET/LIST, a TCP probe per webhook URL)
chain.py    pure: walk the set link by link and name the first broken one
commands.py the CLI (text table or ``--output json``)
"""
