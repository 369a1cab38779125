"""Test-session set-up: four logical CPU devices (pipeline tests need up to K=4) before TF starts;
the test experiments (``tests.*``, named by full path) opted in as an experiment package, for the
tests in this process and the binaries they start."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TENSORPIPE_EXPERIMENT_PACKAGES", "tests")

import tensorflow as tf  # noqa: E402

NUM_TEST_DEVICES = 4

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_DEVICES
)
