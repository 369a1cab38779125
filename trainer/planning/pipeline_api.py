"""The pipeline package's public functions the planner uses, imported in one place: the partitioner
(``partition.balanced_bounds`` ...), the schedules as data (``schedule.build``, ``SCHEDULES``,
``held_over_time``, ``peak_held``, ``check_combination``) and the step simulator
(``simulator.simulate``, ``simulator.StageCosts``)."""

from layers.parallel import partition
from layers.parallel.pipeline import schedule, simulator

__all__ = ["partition", "schedule", "simulator"]
