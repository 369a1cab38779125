"""GPipeLayer settings a user can get wrong stop with one ConfigError line naming the numbers."""

import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from layers.parallel.pipeline import gpipe
from params.errors import ConfigError

TRAIN = FPropContext(training=True)


def _layers(n=4):
    return [core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=3, output_dim=3) for i in range(n)]


def _build(**kwargs):
    settings = {"name": "net", "layers": _layers()}
    settings.update(kwargs)
    return gpipe.GPipeLayer.Params().set(**settings).instantiate()


def _assert_one_line(error: pytest.ExceptionInfo) -> None:
    assert "\n" not in str(error.value)


def test_micro_batches_must_divide_the_batch():
    pipe = _build(num_stages=2, num_micro_batches=3)
    with pytest.raises(ConfigError, match=r"net: num_micro_batches=3 does not divide the batch size 8") as e:
        pipe(TRAIN, tf.zeros([8, 3]))
    _assert_one_line(e)


def test_micro_batch_size_must_divide_the_batch():
    pipe = _build(micro_batch_size=3)
    with pytest.raises(ConfigError, match=r"micro_batch_size=3 does not divide the batch size 8"):
        pipe(TRAIN, tf.zeros([8, 3]))


def test_more_stages_than_layers():
    with pytest.raises(ConfigError, match=r"net: num_stages=5 but there are only 4 layers.*<= 4") as e:
        _build(num_stages=5)
    _assert_one_line(e)


def test_more_stages_than_devices_says_how_to_get_logical_devices():
    with pytest.raises(
        ConfigError,
        match=r"net: 5 stages need 5 devices but there are 4 logical CPU devices and 0 GPUs; "
        r"set cluster.num_logical_cpu_devices=5",
    ) as e:
        _build(layers=_layers(6), num_stages=5)
    _assert_one_line(e)


def test_unknown_batch_dimension_at_trace_time():
    pipe = _build(num_stages=2, num_micro_batches=2)

    # autograph=False: autograph would wrap the error in a StagingError (the trainer unwraps those).
    @tf.function(input_signature=[tf.TensorSpec([None, 3])], autograph=False)
    def train(x):
        return pipe(FPropContext(training=True), x)

    match = r"net: the batch dimension \(batch_dim=0\) of input 0 is unknown when the step is traced"
    with pytest.raises(ConfigError, match=match) as e:
        train(tf.zeros([4, 3]))
    _assert_one_line(e)


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"remat": "sometimes"}, r"params.remat must be one of always, except_last, never, got 'sometimes'"),
        ({"partition_method": "size"}, r"params.partition_method must be one of uniform, params, flops"),
        ({"num_micro_batches": 0}, r"params.num_micro_batches must be a positive int, got 0"),
        ({"num_micro_batches": 2, "micro_batch_size": 4}, r"set num_micro_batches \(2\) or micro_batch_size"),
        ({"layers": []}, r"set exactly one of params.layers and params.stages"),
        ({"stages": [core.SequentialLayer.Params()]}, r"set exactly one of params.layers and params.stages"),
        ({"layers": [{"a": 1}]}, r"params.layers\[0\] must be a layer's Params"),
        ({"split_points": [2, 2]}, r"split_points must be strictly increasing layer indices in \(0, 4\)"),
        ({"split_points": [4]}, r"split_points must be strictly increasing"),
        ({"split_points": [2], "num_stages": 3}, r"num_stages=3 but split_points \[2\] make 2 stages"),
        ({"num_stages": 2, "devices": ["/device:CPU:0"]}, r"params.devices lists 1 devices for 2 stages"),
        (
            {"num_stages": 2, "partition_method": "flops"},
            r"partition_method='flops' needs params.input_shape",
        ),
        ({"num_stages": 2, "partition_method": "measured"}, r"'measured' needs params.input_shape"),
        (
            {"num_stages": 2, "partition_method": "flops", "input_shape": [4, 0]},
            r"input_shape must be a list of positive ints",
        ),
        ({"batch_dim": -1}, r"params.batch_dim must be an int >= 0, got -1"),
    ],
)
def test_bad_settings_fail_at_build(settings, match):
    with pytest.raises(ConfigError, match=match) as e:
        _build(**settings)
    assert str(e.value).startswith("net")
    _assert_one_line(e)


def test_layers_that_cannot_trace_on_input_shape():
    with pytest.raises(ConfigError, match=r"net/fc0: input last dimension is 5, expected input_dim=3"):
        _build(num_stages=2, partition_method="flops", input_shape=[2, 5])


def test_input_without_batch_dimension():
    pipe = _build(batch_dim=2)
    with pytest.raises(ConfigError, match=r"input 0 has shape \(8, 3\), which has no batch_dim=2"):
        pipe(TRAIN, tf.zeros([8, 3]))


def test_head_inputs_must_match_the_batch_and_need_a_head():
    pipe = _build(num_stages=2, num_micro_batches=2)
    mismatch = r"net: the head inputs' batch size 6 differs from the inputs' 8"
    with pytest.raises(ConfigError, match=mismatch) as e:
        pipe(TRAIN, tf.zeros([8, 3]), head=lambda ctx, y, t: y, head_inputs={"label": tf.zeros([6])})
    _assert_one_line(e)
    with pytest.raises(ConfigError, match=r"net: head_inputs given without a head") as e:
        pipe(TRAIN, tf.zeros([8, 3]), head_inputs={"label": tf.zeros([8])})
    _assert_one_line(e)
