"""The private TensorFlow names of layers/tf_compat.py still exist and mean what they meant, and no
other module of the packages uses one (found by parsing every module)."""

from __future__ import annotations

import ast
from pathlib import Path

from layers import tf_compat

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("params", "layers", "tasks", "trainer", "tools")
COMPAT = "layers/tf_compat.py"
PUBLIC_MODULES = ("tensorflow", "tensorflow.experimental")  # tf.* and tf.experimental.* (dtensor)
# Underscore names of Python's own public API (namedtuples, os._exit, sys._getframe).
PYTHON_NAMES = {"_replace", "_asdict", "_fields", "_make", "_exit", "_getframe"}
ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


def test_every_private_name_is_as_tried():
    problems = tf_compat.problems()
    assert problems == [], "\n".join(problems)


def test_a_changed_name_is_one_clear_line(monkeypatch):
    from tensorflow.python.distribute import collective_all_reduce_strategy as car

    monkeypatch.setattr(tf_compat, "_has_attribute", lambda cls, name: name != "_use_merge_call")
    problems = tf_compat.problems()
    assert len(problems) == 1 and "MultiWorkerMirroredStrategy.extended._use_merge_call" in problems[0]
    assert "tried with 2.21" in problems[0] and "update layers/tf_compat.py" in problems[0]
    assert car.CollectiveAllReduceExtended  # the module the check reads


def test_the_state_file_and_trace_protos_parse():
    state = tf_compat.checkpoint_state_class()(model_checkpoint_path="ckpt-3")
    assert state.model_checkpoint_path == "ckpt-3"
    assert list(tf_compat.xspace_from_bytes(b"").planes) == []


def private_tensorflow_uses(sources: dict[str, str]) -> list[str]:
    """``path:line: what`` for each private TensorFlow name in ``sources`` ({path: text}): an import
    of a TensorFlow module outside its public API (``tensorflow.python``, ``tensorflow.core``,
    ``tensorflow.tsl``, ...), and a ``_name`` attribute (read, written, or by ``getattr`` & co.) on a
    TensorFlow object: one reached from a TensorFlow import, or any object whose ``_name`` no module
    of ``sources`` defines (a project class defines its own as ``self._name``, ``cls._name``, a
    ``def`` or a module-level name)."""
    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    own = set().union(*(_defined_names(tree) for tree in trees.values()))
    found = []
    for path, tree in trees.items():
        imported = set()
        for node in ast.walk(tree):
            for module, bound in _tensorflow_imports(node):
                imported.add(bound)
                if not any(module == m or module.startswith(m + ".") for m in PUBLIC_MODULES[1:]) and (
                    module != "tensorflow"
                ):
                    found.append(f"{path}:{node.lineno}: imports {module}")
        for node in ast.walk(tree):
            name, obj = _underscore_access(node)
            if name and (_root(obj) in imported or name not in own | PYTHON_NAMES):
                found.append(f"{path}:{node.lineno}: {name} of {ast.unparse(obj)}")
    return found


def _tensorflow_imports(node: ast.AST) -> list[tuple[str, str]]:
    """(TensorFlow module, the name it binds) of an import statement."""
    if isinstance(node, ast.Import):
        return [
            (a.name, a.asname or a.name.split(".")[0])
            for a in node.names
            if a.name.split(".")[0] == "tensorflow"
        ]
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tensorflow":
        return [(node.module, a.asname or a.name) for a in node.names]
    return []


def _underscore_access(node: ast.AST) -> tuple[str | None, ast.AST | None]:
    """(``_name``, the object) of ``obj._name`` or ``getattr(obj, "_name")`` (dunders aside)."""
    if isinstance(node, ast.Attribute):
        name, obj = node.attr, node.value
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ATTRIBUTE_CALLS
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        name, obj = node.args[1].value, node.args[0]
    else:
        return None, None
    return (name, obj) if name.startswith("_") and not name.startswith("__") else (None, None)


def _defined_names(tree: ast.AST) -> set[str]:
    """The names a module defines: defs, classes, assigned names, and attributes set on ``self`` or
    ``cls`` (directly or by ``object.__setattr__(self, "_name", ...)``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if _root(node.value) in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = node.args
            if node.func.attr == "__setattr__" and len(args) >= 2 and _root(args[0]) in ("self", "cls"):
                if isinstance(args[1], ast.Constant):
                    names.add(args[1].value)
    return names


def _root(node: ast.AST | None) -> str | None:
    """The name an attribute chain starts from (``a`` of ``a.b().c[0]``)."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def test_no_private_tensorflow_name_outside_the_compat_module():
    sources = {
        str(path.relative_to(REPO)): path.read_text()
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }
    found = private_tensorflow_uses(sources)
    assert any(line.startswith(COMPAT) for line in found)  # the check sees the names it lists
    assert [line for line in found if not line.startswith(COMPAT + ":")] == []


def test_the_check_finds_private_imports_and_attributes():
    sources = {
        "mine.py": (
            "class Mine:\n"
            "    def __init__(self):\n"
            "        self._ok = 1\n"
            "    def read(self, other):\n"
            "        return self._ok + other._ok\n"
        ),
        "theirs.py": (
            "import tensorflow as tf\n"
            "from tensorflow.experimental import dtensor\n"
            "from tensorflow.python.eager import record\n"
            "import tensorflow.core.protobuf\n"
            "def hooks(strategy, fn):\n"
            "    strategy.extended._use_merge_call = lambda: False\n"
            "    tf.distribute.get_replica_context()._ok\n"
            "    getattr(fn, '_inference_function')\n"
            "    return dtensor.unpack, fn.__name__\n"
        ),
    }
    assert private_tensorflow_uses(sources) == [
        "theirs.py:3: imports tensorflow.python.eager",
        "theirs.py:4: imports tensorflow.core.protobuf",
        "theirs.py:6: _use_merge_call of strategy.extended",
        "theirs.py:7: _ok of tf.distribute.get_replica_context()",
        "theirs.py:8: _inference_function of fn",
    ]


def test_memory_heuristics_off_changes_only_the_memory_optimizer_inside_the_block():
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    before = ctx.function_call_options.config_proto_serialized
    with tf_compat.memory_heuristics_off():
        inside = config_pb2.ConfigProto.FromString(ctx.function_call_options.config_proto_serialized)
    assert ctx.function_call_options.config_proto_serialized == before
    want = config_pb2.ConfigProto.FromString(before)
    assert want.graph_options.rewrite_options.memory_optimization != rewriter_config_pb2.RewriterConfig.MANUAL
    want.graph_options.rewrite_options.memory_optimization = rewriter_config_pb2.RewriterConfig.MANUAL
    assert inside == want


def _traced_with_custom_gradient():
    """A tf.function whose step takes its own gradient through a custom gradient (as a pipeline's)."""
    import tensorflow as tf

    v = tf.Variable([1.0, 2.0])

    def doubled(x):
        return x * 2.0, lambda dy: dy * 2.0

    @tf.function
    def step(scale):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.custom_gradient(doubled)(v * scale))
        return {"loss": loss, "grad": tape.gradient(loss, v)}

    return step, v


def test_custom_gradients_released_frees_the_trace_that_tensorflow_keeps():
    import gc
    import weakref

    import tensorflow as tf

    def trace_and_drop():
        step, _ = _traced_with_custom_gradient()
        graph = step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
        return weakref.ref(graph)

    kept = trace_and_drop()
    gc.collect()
    assert kept() is not None  # TensorFlow's registry of custom gradients holds the trace
    with tf_compat.custom_gradients_released():
        freed = trace_and_drop()
    assert freed() is None


def test_without_graph_runs_the_trace_and_frees_its_graph():
    import gc
    import weakref

    import tensorflow as tf

    reference, _ = _traced_with_custom_gradient()
    want = reference(tf.constant(3.0))
    step, v = _traced_with_custom_gradient()
    spec = tf.TensorSpec([], tf.float32)
    with tf_compat.custom_gradients_released():
        graph = weakref.ref(step.get_concrete_function(spec).graph)
        run = tf_compat.without_graph(step, spec)
    del step
    gc.collect()
    assert graph() is None
    got = run(tf.constant(3.0))
    assert sorted(got) == ["grad", "loss"]
    assert float(got["loss"]) == float(want["loss"]) == 18.0
    assert got["grad"].numpy().tolist() == want["grad"].numpy().tolist() == [6.0, 6.0]
    v.assign([2.0, 2.0])  # the runtime's function reads the variable's current value
    assert float(run(tf.constant(1.0))["loss"]) == 8.0
