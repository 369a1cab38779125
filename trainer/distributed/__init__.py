"""Training on several processes: where this process is in the cluster (roles.py), TensorFlow's
strategies (strategies.py), one process's part of a cluster (jobs.py), waiting for peers (peers.py),
the parameter-server placement (parameter_servers.py) and the DTensor mesh placement
(mesh_placement.py)."""
