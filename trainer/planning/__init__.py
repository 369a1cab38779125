"""The planner's mechanisms (``python -m tools.plan``; docs/plan.md): what each layer of an experiment
costs on this host (``costs``), what each process of a placement holds (``memory``), the placements
the trainer accepts (``candidates``), a step's time and bytes predicted for each (``predict``), and the
chosen one written as a params file (``plan_file``); a hand-off between two TensorFlow processes timed
(``grpc_link``), a plan trained for real (``trial``), and the stage processes' own costs from two such
trials (``calibrate``). ``pipeline_api`` is the one place these modules
import the pipeline package from.
"""
