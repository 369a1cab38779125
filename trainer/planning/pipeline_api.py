"""The pipeline package's public functions the planner uses, imported in one place: the partitioner
(``partition.balanced_bounds`` ...), the schedules as data (``schedule.SCHEDULES``,
``schedule.check_combination``), what a schedule holds over time (``held.peak_held``) and the step
simulator (``simulator.simulate``, ``simulator.StageCosts``)."""

from layers.parallel import partition
from layers.parallel.pipeline import memory as held
from layers.parallel.pipeline import schedule, simulator

__all__ = ["held", "partition", "schedule", "simulator"]
