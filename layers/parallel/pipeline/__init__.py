"""The GPipe pipeline, one mechanism per module.

- gpipe.py: the layer (Params, the partition into stages, delegation to the modules below);
  knobs.py: its Params fields and help text, and the stage-count checks;
- schedule.py: schedules as data (Op, Schedule, the builders, each op's dependencies);
- timeline.py: a schedule placed in time; memory.py: what it holds, and W's byte budgets;
- microbatch.py: split into micro-batches and join, with or without a stage mesh's data axis;
- stage_mesh.py: each stage on a DTensor mesh of its own, and the hand-off between meshes;
- executor.py: the pipeline as one custom gradient (its autograd wiring drawn there);
  step.py: one traced step's units built in the schedule's order (the walk drawn there);
- segment.py: a stage's segments under their tapes; weight_cut.py: where W starts;
  output_grad.py: the output gradients the last stage's backwards start from;
- simulator.py: a step predicted from stage costs; torch_format.py: PyTorch's schedule format.
"""
