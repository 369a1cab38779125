"""cluster.*: logical CPU devices and threads are set before TensorFlow starts, or refused clearly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tensorflow as tf

from params.errors import ConfigError
from params.experiment import cluster_params
from tests.trainer import runner
from trainer import tf_settings


def _cluster(**values):
    p = cluster_params()
    p.set(**values)
    return p.freeze()


@pytest.mark.slow
def test_fresh_process_gets_the_devices_and_threads_it_asks_for():
    code = (
        "import tensorflow as tf\n"
        "from params.experiment import cluster_params\n"
        "from trainer import tf_settings\n"
        "p = cluster_params(); p.set(num_logical_cpu_devices=3, intra_op_threads=2, inter_op_threads=1)\n"
        "tf_settings.configure(p.freeze())\n"
        "print(len(tf.config.list_logical_devices('CPU')),"
        " tf.config.threading.get_intra_op_parallelism_threads(),"
        " tf.config.threading.get_inter_op_parallelism_threads())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=runner.REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["3", "2", "1"]


def test_too_late_is_a_clear_error_unless_the_live_setting_matches():
    tf.constant(1.0)  # TensorFlow has started (with the 4 test devices of tests/conftest.py)
    live = len(tf.config.list_logical_devices("CPU"))
    tf_settings.configure(_cluster(num_logical_cpu_devices=live))
    tf_settings.configure(_cluster())
    with pytest.raises(ConfigError, match=r"cluster.num_logical_cpu_devices : 2 cannot be applied"):
        tf_settings.configure(_cluster(num_logical_cpu_devices=2))
    wanted = tf.config.threading.get_intra_op_parallelism_threads() + 3
    with pytest.raises(ConfigError, match=rf"cluster.intra_op_threads : {wanted} cannot be applied"):
        tf_settings.configure(_cluster(intra_op_threads=wanted))


def test_negative_settings_are_rejected():
    with pytest.raises(ConfigError, match="num_logical_cpu_devices"):
        tf_settings.configure(_cluster(num_logical_cpu_devices=-1))
