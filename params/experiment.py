"""The experiment contract, and its resolution into the single Params a run is made from.

An experiment class (registered with ``@registry.register``) returns the task's Params from ``task()``
and one input Params per data set from a public method named after it (``train()``, ``dev()``,
``test()``, ...). Its top-level knobs (widths, depths, batch size) are constructor arguments, so gin can
bind them. ``resolve()`` turns a model key and the user's overrides into frozen Params:

    model : 'image.digits.ConvNet'
    cluster.* : devices and threads
    task.*    : the task (model, learner, eval and decode settings)
    input.<dataset>.* : one input generator per data set

Precedence, later wins: experiment defaults < gin (constructor knobs) < --params_file_override <
--params_override.
"""

from __future__ import annotations

import inspect

from params import lingvo_experiment, overrides, registry, text_format
from params.errors import ConfigError, UserError
from params.hyperparams import Params, clip, coerce_value


def cluster_params() -> Params:
    """Process-level settings every job reads (devices and threading)."""
    p = Params()
    p.define(
        "num_logical_cpu_devices",
        0,
        "Split the host CPU into this many logical devices (0: leave one CPU device). "
        "A pipeline of K stages needs K devices.",
    )
    p.define("intra_op_threads", 0, "Threads one op may use (0: TensorFlow's default).")
    p.define("inter_op_threads", 0, "Ops run at once (0: TensorFlow's default).")
    p.define(
        "mesh_shape",
        [],
        "Device mesh of the trainer ([]: no mesh), e.g. [2, 2]: DTensor splits tensors over it "
        "(docs/parallelism/mesh.md); needs prod(mesh_shape) devices.",
    )
    p.define("mesh_axis_names", [], "One name per mesh_shape entry, e.g. ['data', 'model'].")
    p.define(
        "layout_rules",
        "",
        "Mesh-TF's layout rules: logical dimension -> mesh axis, e.g. 'batch:data;hidden:model;heads:model;"
        "vocab:model' (names: batch, embed, hidden, heads, vocab).",
    )
    p.define(
        "stage_job",
        "",
        "The cluster job whose tasks hold the trainer's GPipe stages and local-parallel blocks ('': this "
        "process's devices), e.g. 'worker': part k's variables and compute on /job:worker/task:k, a "
        "process started with --mode=stages; the addresses come from --cluster_spec "
        "(docs/parallelism/remote.md). Evalers and decoders still run in their own process.",
    )
    return p


class Experiment:
    """Base class of registered experiments."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        lingvo_experiment.port(cls, {name for name in dir(Experiment) if not name.startswith("_")})

    def task(self) -> Params:
        """The task's Params (an InstantiableParams of a BaseTask subclass)."""
        raise ConfigError(f"{type(self).__name__} must define task() (Lingvo's Task())")

    def cluster(self) -> Params:
        """Devices and threads; override to, say, split the CPU for a pipeline."""
        return cluster_params()

    def task_overrides(self, dataset: str) -> dict:
        """Per-data-set task overrides ``{dotted_key: value}``; stored as
        ``input.<dataset>.task_overrides`` and applied to the task a job runs on that data set."""
        del dataset
        return {}

    @classmethod
    def dataset_names(cls) -> list[str]:
        """Every public lowercase method taking no argument that Experiment itself does not define
        (Lingvo's capitalised ``Train()``, ``Dev()``, ... are ported to ``train()``, ``dev()``, ...)."""
        names = []
        for name, member in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_") or name[:1].isupper() or hasattr(Experiment, name):
                continue
            required = [
                p
                for p in list(inspect.signature(member).parameters.values())[1:]
                if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
            if not required:
                names.append(name)
        return sorted(names)

    def dataset(self, name: str) -> Params:
        """The input Params of data set ``name``."""
        names = self.dataset_names()
        if name not in names:
            raise ConfigError(
                f"{type(self).__name__} has no data set {name!r}; it has {', '.join(names) or 'none'}"
            )
        p = getattr(self, name)()
        if not isinstance(p, Params):
            raise ConfigError(f"{type(self).__name__}.{name}() must return Params, not {type(p).__name__}")
        return p


def build_params(experiment: Experiment, model_key: str) -> Params:
    """The unresolved top-level Params of an experiment instance."""
    root = Params()
    root.define("model", model_key, "The registry key of the experiment.")
    root.define("cluster", experiment.cluster(), "Devices and threads for every job.")
    root.define("task", experiment.task(), "The task: model, learner, eval and decode settings.")
    inputs = Params()
    for name in experiment.dataset_names():
        p = experiment.dataset(name)
        if "task_overrides" not in p.names():
            p.define(
                "task_overrides",
                experiment.task_overrides(name),
                "Task settings {dotted_key: value} changed for jobs on this data set.",
            )
        inputs.define(name, p, f"Input of data set {name!r}.")
    root.define("input", inputs, "One input generator per data set.")
    return root


def resolve(
    model: str,
    *,
    gin_files: list[str] | tuple[str, ...] = (),
    gin_bindings: list[str] | tuple[str, ...] = (),
    params_file_override: str | None = None,
    params_override: str | None = None,
    gin_allow_code: bool = False,
) -> Params:
    """Model key + overrides -> the frozen, validated Params of a run. Bad input raises ConfigError.

    ``gin_allow_code``: trust gin files as code (imports, references); see ``overrides.apply_gin``.
    Gin bindings live in gin's process-wide config: they stay bound for later calls in the same process
    (the binaries resolve once); call ``gin.clear_config()`` between calls with different bindings."""
    cls = registry.get(model)
    if not (isinstance(cls, type) and issubclass(cls, Experiment)):
        raise ConfigError(f"{model!r} is not an Experiment subclass")
    overrides.apply_gin(gin_files, gin_bindings, allow_code=gin_allow_code)
    try:
        experiment = cls()
    except UserError as e:  # a knob's value refused by the experiment (a missing vocabulary file)
        raise (ConfigError if isinstance(e, ConfigError) else UserError)(_without_gin_note(e)) from None
    except TypeError as e:
        raise ConfigError(f"cannot build experiment {model!r}: {_without_gin_note(e)}") from None
    root = build_params(experiment, model)
    if params_file_override:
        overrides.apply_params_file(root, params_file_override)
    if params_override:
        overrides.apply_params_text(root, params_override, source="--params_override")
    validate(root)
    return root.freeze()


def _without_gin_note(error: Exception) -> str:
    """The error's message without the lines gin appends to an error raised inside a configurable
    ("  In call to configurable 'X' (<class ...>)"): a binary prints one line."""
    return str(error).split("\n  In call to configurable", 1)[0]


def validate(root: Params) -> None:
    """Checks what the jobs would otherwise trip over later, so inspect_params rejects what training
    would: every data set's task_overrides (string keys naming task values, values of their type),
    ``cls`` fields holding classes, dtype fields holding dtypes or dtype names. Raises ConfigError."""
    for name in root.input.names():
        task_params_for(root, name)
    for key, value in root:
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "cls" and value is not None and not isinstance(value, type):
            raise ConfigError(f"param {key!r}: expected a class (type/module/Name), got {clip(str(value))}")
        if (leaf == "dtype" or leaf.endswith("_dtype")) and not _is_dtype_value(value):
            raise ConfigError(f"param {key!r}: expected a dtype such as float32, got {clip(repr(value))}")


def _is_dtype_value(value: object) -> bool:
    if value is None or text_format.is_dtype(value):
        return True
    return text_format.is_dtype_name(value)


def task_params_for(root: Params, dataset: str) -> Params:
    """The task Params a job on ``dataset`` runs: ``task`` with that data set's task_overrides, each
    checked like a ``--params_override`` of that key."""
    task = root.task.copy()
    where = f"input.{dataset}.task_overrides"
    task_overrides = root.input.get(dataset).task_overrides
    if not isinstance(task_overrides, dict):
        raise ConfigError(
            f"{where}: expected a dict {{'dotted.key': value}}, got {clip(repr(task_overrides))}"
        )
    for key, value in task_overrides.items():
        if not isinstance(key, str):
            shown = repr(key) if len(repr(key)) <= 40 else repr(key)[:40] + "..."
            raise ConfigError(f"{where}: key {shown} is a {type(key).__name__}, not a 'dotted.key' string")
        try:
            current = task.get(key)
            if isinstance(current, Params) or (
                isinstance(current, (list, tuple)) and current and all(isinstance(v, Params) for v in current)
            ):
                raise ConfigError(f"param {key!r} is a group of params: set its fields, like '{key}.name'")
            task.set(**{key: coerce_value(key, value, current, declared=task.declared(key))})
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    return task.freeze()
