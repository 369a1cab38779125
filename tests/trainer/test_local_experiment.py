"""Local parallelism through the real binary: image.digits.LocalConvNet and lm.synthetic.LocalTransformerLM
in subprocesses, the aux losses read back with TensorBoard's reader, and a resumed run."""

import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.trainer.runner import REPO, _env, read_checkpoint, read_scalars

TINY_CONVNET = [
    "--gin_param=LocalConvNet.filters = 4",
    "--gin_param=LocalConvNet.hidden_dim = 8",
    "--gin_param=LocalConvNet.batch_size = 16",
    "--gin_param=LocalConvNet.window = 2",
]


def _trainer(logdir, model, *flags, override="", timeout=600):
    result = subprocess.run(
        [
            sys.executable, "-m", "trainer", f"--model={model}", f"--logdir={logdir}",
            *([f"--params_override={override}"] if override else []), *flags,
        ],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


@pytest.mark.slow
def test_local_convnet_greedy_two_blocks_learns_digits(tmp_path):
    logdir = tmp_path / "local"
    _trainer(
        logdir,
        "image.digits.LocalConvNet",
        "--job=controller,trainer,evaler_dev",
        override="task.train.max_steps : 500; task.train.summary_interval_steps : 100",
    )
    analysis = (logdir / "model_analysis.txt").read_text()
    assert "in 2 blocks (window=1, stride=1, pipelined)" in analysis and "/device:CPU:1" in analysis
    train = read_scalars(logdir / "train")
    assert set(train["block0_aux_loss"]) == {100, 200, 300, 400, 500}
    assert train["block0_aux_loss"][500] < train["block0_aux_loss"][100]
    dev = read_scalars(logdir / "eval_dev")
    assert dev["accuracy"][500] >= 0.95
    assert 0.0 < dev["block0_aux_accuracy"][500] <= 1.0 and dev["block0_aux_loss"][500] > 0


@pytest.mark.slow
def test_a_resumed_local_run_ends_with_the_weights_and_hand_off_of_an_uninterrupted_one(tmp_path):
    override = (
        "task.train.max_steps : 20; task.train.warmup_steps : 5; task.train.save_interval_steps : 10; "
        "task.train.summary_interval_steps : 10; task.train.log_interval_steps : 10"
    )
    straight = tmp_path / "straight"
    _trainer(
        straight, "image.digits.LocalConvNet", "--job=controller,trainer", *TINY_CONVNET, override=override
    )

    # The same run cut at step 10: a copy of its logdir that knows only ckpt-10, trained on.
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    train_dir = resumed / "train"
    for path in train_dir.glob("ckpt-20*"):
        path.unlink()
    ckpt_10 = str(train_dir / "ckpt-10")
    (train_dir / "checkpoint").write_text(
        f'model_checkpoint_path: "{ckpt_10}"\nall_model_checkpoint_paths: "{ckpt_10}"\n'
    )
    result = _trainer(
        resumed, "image.digits.LocalConvNet", "--job=controller,trainer", *TINY_CONVNET, override=override
    )
    assert "at step 10" in result.stdout

    expected = read_checkpoint(str(straight / "train" / "ckpt-20"))
    actual = read_checkpoint(str(resumed / "train" / "ckpt-20"))
    for d in (expected, actual):
        d.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    assert sorted(actual) == sorted(expected)
    handoff = [name for name in expected if "handoff" in name]
    assert handoff and any(name.startswith("learner/") for name in expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


@pytest.mark.slow
def test_local_transformer_lm_trains_with_per_block_aux_losses(tmp_path):
    logdir = tmp_path / "lm"
    _trainer(
        logdir,
        "lm.synthetic.LocalTransformerLM",
        "--job=controller,trainer,evaler_dev",
        "--gin_param=LocalTransformerLM.model_dim = 16",
        "--gin_param=LocalTransformerLM.num_heads = 2",
        "--gin_param=LocalTransformerLM.hidden_dim = 32",
        "--gin_param=LocalTransformerLM.num_layers = 3",
        "--gin_param=LocalTransformerLM.num_blocks = 3",
        "--gin_param=LocalTransformerLM.seq_length = 8",
        "--gin_param=LocalTransformerLM.batch_size = 8",
        "--gin_param=LocalTransformerLM.num_train_sequences = 200",
        "--gin_param=LocalTransformerLM.num_eval_sequences = 40",
        override=(
            "task.train.max_steps : 30; task.train.save_interval_steps : 30; "
            "task.train.summary_interval_steps : 10; task.train.warmup_steps : 5"
        ),
    )
    train = read_scalars(logdir / "train")
    for k in (0, 1):
        assert set(train[f"block{k}_aux_loss"]) == {10, 20, 30}
        assert np.isfinite(train[f"block{k}_aux_loss"][30])
    assert "block2_aux_loss" not in train  # the last block's loss is the LM's own
    dev = read_scalars(logdir / "eval_dev")
    assert {"block0_aux_loss", "block1_aux_loss", "log_pplx", "log_pplx_gap"} <= set(dev)
    assert dev["log_pplx"][30] < np.log(36)  # better than uniform over the vocabulary
