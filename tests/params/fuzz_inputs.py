"""Generated configuration input for the fuzz tests: random text mixed with fragments of every
grammar the parsers read (brackets, quotes, escapes, keys, ``type/`` values, gin's ``import``, ``@``
and ``%``), and a canary module name that no payload may import."""

from hypothesis import strategies as st

MODEL = "tests.params.fake_experiments.TinyExp"
CANARY = "tp_fuzz_canary"
_KEYS = [
    "task.width", "task.name", "task.train.learning_rate", "task.train.max_steps", "task.cls",
    "input.dev.task_overrides", "input.train.split", "input.dev.batch_size", "cluster.intra_op_threads",
    "model", "task", "task.train", "task.width[0]", "task.train[3].x", "nope",
]  # fmt: skip
_FRAGMENTS = [
    " : ", ":", ";", "\n", " ", "=", ",", "[", "]", "(", ")", "{", "}", "'", '"', "\\", "\\x", "\\u12",
    "\\N{foo}", "\\n", "1", "-", "0.5", "1e999", "9" * 50, "inf", "nan", "True", "None", "float32",
    "type/", "/", ".", "type/os/system", f"type/{CANARY}/Thing", f"'{CANARY}.Thing'", "type/builtins/dict",
    "type/layers.core/SoftmaxLayer", "import ", f"import {CANARY}", "from __gin__ import x",
    "include ", "@", "%", "()", "TinyExp.", "TinyExp.width = ", "TinyExp.learning_rate = ", "scope/",
    "#", "__import__('os')", "\x00", "\udcff", "é", "\u2028",
    *_KEYS,
]  # fmt: skip
text = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=4)), max_size=16).map("".join),
    st.builds(
        lambda k, v: f"{k} : {v}", st.sampled_from(_KEYS), st.lists(st.sampled_from(_FRAGMENTS)).map("".join)
    ),
)
gin_text = st.one_of(
    text,
    st.builds(
        lambda k, v: f"TinyExp.{k} = {v}",
        st.sampled_from(["width", "learning_rate", "depth", "name"]),
        st.lists(st.sampled_from(_FRAGMENTS), max_size=8).map("".join),
    ),
)
