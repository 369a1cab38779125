"""The ways of cutting a model across devices: a pipeline of stages (pipeline/), a DTensor mesh
(mesh.py), local parallelism (local.py); how layers are cut (partition.py) and onto which devices
(device_choice.py)."""
