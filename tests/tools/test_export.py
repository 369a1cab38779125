"""tools.export and tools.predict: a trained model out of the launcher, served by plain TensorFlow.

The end-to-end tests train a few steps through ``python -m trainer``, export with ``python -m
tools.export``, then load the SavedModel in a fresh ``python -I`` subprocess whose path has neither the
repo nor PYTHONPATH (it checks that ``params``, ``tasks`` and ``trainer`` cannot be imported), and
compare its outputs with what the decoder job wrote for the same checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from params import experiment
from tests.trainer.runner import REPO, _env
from tools import export

# Runs in `python -I` (no repo, no PYTHONPATH, no cwd on sys.path): argv = export_dir, signature,
# input name, .npy inputs, chunk size, output .json, then modules to import first (tensorflow_text for
# a SentencePiece model's ops). Feeds the inputs in chunks of the decoder's batch.
PLAIN_LOADER = """
import importlib, importlib.util, json, sys
import numpy as np
for name in ("params", "tasks", "trainer", "layers", "tools"):
    assert importlib.util.find_spec(name) is None, f"{name} is importable"
import tensorflow as tf
export_dir, signature, input_name, inputs, chunk, out, *imports = sys.argv[1:]
for module in imports:
    importlib.import_module(module)
fn = tf.saved_model.load(export_dir).signatures[signature]
data = np.load(inputs, allow_pickle=True)
results = {}
for start in range(0, len(data), int(chunk)):
    part = data[start : start + int(chunk)]
    dtype = fn.structured_input_signature[1][input_name].dtype
    for key, value in fn(**{input_name: tf.constant(part.tolist() if dtype == tf.string else part,
                                                      dtype=dtype)}).items():
        value = value.numpy()
        value = [v.decode() for v in value] if value.dtype == object else value.tolist()
        results.setdefault(key, []).extend(value)
json.dump(results, open(out, "w"))
"""


def _run(args: list[str], timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _export(logdir: Path) -> Path:
    out = _run([sys.executable, "-m", "tools.export", f"--logdir={logdir}"], cwd=REPO, env=_env())
    step = max(int(p.name) for p in (logdir / "export").iterdir())
    assert f"export: wrote {logdir / 'export' / str(step)}" in out.stdout
    return logdir / "export" / str(step)


def _train_and_export(
    tmp_path: Path, model: str, override: str, gin: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    logdir = tmp_path / "run"
    _run(
        [
            sys.executable,
            "-m",
            "trainer",
            f"--model={model}",
            f"--logdir={logdir}",
            f"--params_override={override}",
            *[f"--gin_param={binding}" for binding in gin],
        ],
        cwd=REPO,
        env=_env(),
    )
    return logdir, _export(logdir)


def _load_without_repo(
    tmp_path: Path, export_dir: Path, signature: str, input_name: str, inputs, chunk: int, *imports: str
):
    np.save(tmp_path / "inputs.npy", inputs)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "plain.json"
    args = [
        str(export_dir),
        signature,
        input_name,
        str(tmp_path / "inputs.npy"),
        str(chunk),
        str(out),
        *imports,
    ]
    _run([sys.executable, "-I", "-c", PLAIN_LOADER, *args], cwd=elsewhere, env=env)
    return json.loads(out.read_text())


def _decoded(logdir: Path, dataset: str, step: int) -> list[dict]:
    lines = (logdir / f"decoder_{dataset}" / f"decoded-{step}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_digits_export_loads_without_the_repo_and_equals_the_decoder(tmp_path, default_run):
    """On a copy of the default experiment's run (tests/conftest.py trains it once for the test run),
    exported in-process (the binary's own run is the text model's test)."""
    logdir = tmp_path / "run"
    shutil.copytree(default_run.logdir, logdir)
    target, names = export.export(str(logdir))
    export_dir = Path(target)
    assert export_dir == logdir / "export" / "1500" and "serving_default" in names
    root = experiment.resolve("image.digits.ConvNet")
    test = root.input.test.instantiate()
    images = np.concatenate([batch["image"].numpy() for batch in test.dataset()])
    plain = _load_without_repo(
        tmp_path, export_dir, "serving_default", "images", images, test.params.batch_size
    )

    records = _decoded(logdir, "test", 1500)
    assert len(records) == len(images) == 270
    assert plain["classes"] == [r["predicted"] for r in records]
    best = np.max(np.array(plain["probabilities"]), axis=1)
    np.testing.assert_allclose(best, [r["probability"] for r in records], rtol=1e-5)

    # The CLI on the same export, from a .npy batch.
    np.save(tmp_path / "five.npy", images[:5])
    out = _run(
        [
            sys.executable,
            "-m",
            "tools.predict",
            f"--export_dir={logdir / 'export'}",  # the export root: its newest step folder
            f"--input={tmp_path / 'five.npy'}",
        ],
        cwd=REPO,
        env=_env(),
    )
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["classes"] for r in rows] == plain["classes"][:5]


@pytest.mark.slow
def test_text_mt_export_translates_raw_strings_as_the_decoder_does(tmp_path):
    """mt.text.Transformer with its default SentencePiece vocabulary, a tiny model for a few steps: the
    SavedModel tokenizes the raw source and detokenizes its translation in the graph (tensorflow_text
    imported, nothing of the repo), as the decoder job's records show them."""
    override = (
        "task.train.max_steps : 8; task.train.save_interval_steps : 8; task.train.warmup_steps : 2; "
        "input.dev.num_samples : 16; input.dev.batch_size : 16; task.decode.beam_size : 2; "
        "task.decode.max_length : 12"
    )
    tiny = ("model_dim=16", "num_heads=2", "hidden_dim=32", "num_layers=1", "batch_size=8")
    logdir, export_dir = _train_and_export(
        tmp_path, "mt.text.Transformer", override, tuple(f"Transformer.{knob}" for knob in tiny)
    )
    assert (logdir / "stories.model").read_bytes() == (REPO / "tasks/mt/data/stories.model").read_bytes()
    records = _decoded(logdir, "dev", 8)
    assert len(records) == 16
    sources = np.array([r["source"] for r in records], dtype=object)
    assert sources[0][0].isupper() and sources[0].endswith(".")  # raw text, not pieces
    plain = _load_without_repo(
        tmp_path, export_dir, "serving_default", "text", sources, 16, "tensorflow_text"
    )
    assert plain["translation"] == [r["hypothesis"] for r in records]
    assert any(plain["translation"])

    # The CLI on lines of text, given the export root: each line beside its translation.
    (tmp_path / "sources.txt").write_text("".join(f"{line}\n" for line in sources[:2]))
    command = ["tools.predict", f"--export_dir={logdir / 'export'}", f"--input={tmp_path / 'sources.txt'}"]
    out = _run([sys.executable, "-m", *command], cwd=REPO, env=_env())
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["input"], r["translation"]) for r in rows] == list(zip(sources[:2], plain["translation"][:2]))


@pytest.mark.parametrize(
    "key, pipeline",
    [
        ("image.digits.GPipeConvNet", "body.sub[0]"),
        ("lm.synthetic.GPipeTransformerLM", "stack.pipeline"),
        ("lm.synthetic.StageMeshTransformerLM", "stack.pipeline"),
    ],
)
def test_single_device_keeps_the_pipelined_models_variables(key, pipeline):
    """The export's single-device task has the variables of the run's checkpoints (for stage meshes:
    of the plain-device mirror a stage-mesh run saves through)."""
    from trainer.distributed.mesh_placement import without_stage_meshes

    root = experiment.resolve(key)
    pipelined = experiment.task_params_for(root, "dev")
    single = export.single_device(pipelined)
    assert single.get(f"{pipeline}.num_stages") == 1 and single.get(f"{pipeline}.num_micro_batches") == 1
    assert single.get(f"{pipeline}.stage_mesh_shape") == []
    assert pipelined.get(f"{pipeline}.num_stages") == 2  # the original is untouched
    saved = without_stage_meshes(pipelined)  # the same Params where no stage carries a mesh
    names = [sorted((v.name, tuple(v.shape)) for v in p.instantiate().variables) for p in (saved, single)]
    assert names[0] == names[1]


def test_export_errors_are_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tools.export", f"--logdir={tmp_path / 'nothing'}"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("export: error: ")
    assert "params.txt does not exist" in result.stderr


def test_lm_export_continues_as_the_decoder_and_scores_log_probs(tmp_path):
    """In-process (no training): a saved, restored LM's greedy continuation equals task.decode's."""
    import gin
    import tensorflow as tf

    from layers.base_layer import FPropContext
    from trainer import checkpointer

    try:
        root = experiment.resolve(
            "lm.synthetic.TransformerLM",
            gin_bindings=["TransformerLM.model_dim = 16", "TransformerLM.hidden_dim = 32"],
            params_override="input.dev.num_sequences : 8; input.dev.batch_size : 8",
        )
    finally:
        gin.clear_config()
    (tmp_path / "params.txt").write_text(root.to_text())
    task = experiment.task_params_for(root, "dev").instantiate()
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(task=task),
        str(tmp_path / "train"),
        1,
        checkpoint_name=checkpointer.CHECKPOINT_NAME,
    )
    manager.save(checkpoint_number=7)
    target, names = export.export(str(tmp_path))
    assert target.endswith("export/7") and names == ["greedy_continuation", "serving_default"]

    batch = next(iter(root.input.dev.instantiate().dataset()))
    expected = task.decode(FPropContext(training=False, seed=task.params.random_seed), batch)["hyp_ids"]
    loaded = tf.saved_model.load(target)
    prompt = batch["labels"][:, : root.task.decode.prompt_length]
    got = loaded.signatures["greedy_continuation"](prompt=prompt)
    np.testing.assert_array_equal(got["ids"].numpy(), expected.numpy())
    log_probs = loaded.signatures["serving_default"](ids=batch["ids"], paddings=batch["paddings"])[
        "log_probs"
    ]
    logits = task.compute_predictions(FPropContext(), batch)["logits"]
    np.testing.assert_allclose(log_probs.numpy(), tf.nn.log_softmax(logits).numpy(), rtol=1e-4, atol=1e-5)


def test_a_pipelined_model_exports_as_one_device_graph_with_the_decoders_outputs(tmp_path):
    """In-process (no training): GPipeConvNet's checkpoint, exported single-device, classifies as the
    pipelined task's decode does; the SavedModel names no second device."""
    import tensorflow as tf

    from layers.base_layer import FPropContext
    from trainer import checkpointer

    root = experiment.resolve("image.digits.GPipeConvNet")
    (tmp_path / "params.txt").write_text(root.to_text())
    task = experiment.task_params_for(root, "dev").instantiate()  # 2 stages on CPU:0 and CPU:1
    assert task.params.body.sub[0].num_stages == 2
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(task=task),
        str(tmp_path / "train"),
        1,
        checkpoint_name=checkpointer.CHECKPOINT_NAME,
    )
    manager.save(checkpoint_number=3)
    target, _ = export.export(str(tmp_path))
    saved = (Path(target) / "saved_model.pb").read_bytes()
    assert b"CPU:1" not in saved

    batch = next(iter(root.input.dev.instantiate().dataset()))
    expected = task.decode(FPropContext(training=False, seed=task.params.random_seed), batch)
    got = tf.saved_model.load(target).signatures["serving_default"](images=batch["image"])
    np.testing.assert_array_equal(got["classes"].numpy(), expected["predicted"].numpy())
    np.testing.assert_allclose(
        np.max(got["probabilities"].numpy(), axis=1), expected["probability"], rtol=1e-5
    )
