"""The sequence experiments through the real jobs, at tiny sizes: each trains a few steps in a
subprocess, its evaler records the task's metrics and its decoder job writes its outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.runner import REPO, _env, read_scalars

STEPS = 20
TINY = {
    "mt.algorithmic.ReverseTransformer": [
        "ReverseTransformer.model_dim = 32", "ReverseTransformer.hidden_dim = 64",
        "ReverseTransformer.num_train_examples = 2000", "ReverseTransformer.num_eval_examples = 48",
        "ReverseTransformer.batch_size = 16", "ReverseTransformer.beam_size = 2",
    ],
    "lm.synthetic.TransformerLM": [
        "TransformerLM.model_dim = 32", "TransformerLM.hidden_dim = 64", "TransformerLM.batch_size = 16",
        "TransformerLM.num_train_sequences = 2000", "TransformerLM.num_eval_sequences = 48",
    ],
    "lm.synthetic.GPipeTransformerLM": [
        "GPipeTransformerLM.num_layers = 4", "GPipeTransformerLM.model_dim = 32",
        "GPipeTransformerLM.hidden_dim = 64", "GPipeTransformerLM.batch_size = 16",
        "GPipeTransformerLM.num_train_sequences = 2000", "GPipeTransformerLM.num_eval_sequences = 48",
    ],
}  # fmt: skip


def _last_scores(path) -> dict:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert lines[-1]["step"] == STEPS
    return lines[-1]["metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(TINY))
def test_sequence_experiment_trains_evaluates_and_decodes(model, tmp_path):
    logdir = tmp_path / "run"
    override = (
        f"task.train.max_steps : {STEPS}; task.train.save_interval_steps : {STEPS}; "
        "task.train.warmup_steps : 5"
    )
    command = [
        sys.executable, "-m", "trainer", f"--model={model}", f"--logdir={logdir}",
        f"--params_override={override}", *(f"--gin_param={binding}" for binding in TINY[model]),
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]

    records = [json.loads(line) for line in (logdir / f"decoder_test/decoded-{STEPS}.jsonl").open()]
    assert len(records) == 48
    eval_dev = _last_scores(logdir / "eval_dev/scores.jsonl")
    decoded = _last_scores(logdir / "decoder_test/scores.jsonl")
    if model.startswith("mt."):
        assert set(records[0]) >= {"source", "reference", "hypothesis"}
        assert 0.0 <= decoded["bleu"] <= 100.0 and 0.0 <= decoded["exact_match"] <= 1.0
        assert "bleu" in read_scalars(logdir / "decoder_test")
    else:
        assert set(records[0]) >= {"prompt", "reference", "hypothesis"}
        assert eval_dev["log_pplx_gap"] == pytest.approx(
            eval_dev["log_pplx"] - eval_dev["achievable_log_pplx"], abs=1e-4
        )
        assert 0.0 <= decoded["continuation_accuracy"] <= 1.0
    assert eval_dev["loss"] > 0.0
    if "GPipe" in model:
        analysis = (logdir / "model_analysis.txt").read_text()
        assert "4 layers in 2 stages" in analysis and "/device:CPU:1" in analysis
