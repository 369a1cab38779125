"""Views of a pipelined step: --mode=profile_pipeline (profiling.py), pictures (picture.py) and
Chrome/Perfetto traces (trace.py), of a measured or a simulated step; and the device grid of the
trainer's placement, --mode=inspect_placement (placement_grid.py)."""
