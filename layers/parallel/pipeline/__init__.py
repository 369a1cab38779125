"""The GPipe pipeline: the layer (gpipe.py), its schedules as data (schedule.py), the executor that
builds a schedule's units (executor.py), the simulator (simulator.py) and torch.distributed.pipelining's
format (torch_format.py)."""
