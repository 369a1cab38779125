"""Experiments on scikit-learn's 8x8 digits (1797 images, 10 classes; bundled, no download)."""

from __future__ import annotations

from layers.core import (
    ActivationLayer,
    BatchNormLayer,
    Conv2DLayer,
    DropoutLayer,
    FlattenLayer,
    PoolingLayer,
    ProjectionLayer,
)
from layers.parallel.pipeline.gpipe import GPipeLayer
from params import registry
from params.errors import ConfigError
from params.experiment import Experiment, cluster_params
from params.hyperparams import Params
from tasks.base_input import set_split_mode
from tasks.image.input import DigitsInput
from tasks.image.model import ImageClassifierTask


def conv_block(index: int, in_channels: int, out_channels: int, pool: bool, bn_decay: float) -> list[Params]:
    """conv 3x3 -> batch norm -> relu (-> 2x2 max pool)."""
    conv = Conv2DLayer.Params().set(name=f"conv{index}", filter_shape=[3, 3, in_channels, out_channels])
    conv.has_bias = False  # the batch norm's beta is the bias
    bn = BatchNormLayer.Params().set(name=f"bn{index}", dim=out_channels, decay=bn_decay)
    layers = [conv, bn, ActivationLayer.Params().set(name=f"relu{index}", activation="relu")]
    if pool:
        layers.append(PoolingLayer.Params().set(name=f"pool{index}", pooling_type="max"))
    return layers


@registry.register
class ConvNet(Experiment):
    """Small conv net on 8x8 digits: conv-bn-relu(-pool) blocks, a hidden layer, softmax; ~99% dev accuracy.

    Knobs (gin: ``ConvNet.num_layers = 3``): ``num_layers`` conv blocks with ``filters`` channels
    (doubling after each 2x2 pooling, which happens while the image is at least 2x2), a ``hidden_dim``
    relu projection with dropout ``keep_prob``, Adam with linear warm-up then cosine decay.
    """

    def __init__(
        self,
        num_layers: int = 2,
        filters: int = 32,
        hidden_dim: int = 128,
        keep_prob: float = 1.0,
        batch_size: int = 64,
        learning_rate: float = 3e-3,
        warmup_steps: int = 100,
        max_steps: int = 1500,
        bn_decay: float = 0.99,
    ) -> None:
        if num_layers < 1 or filters < 1 or hidden_dim < 1 or batch_size < 1:
            raise ConfigError(
                "ConvNet: num_layers, filters, hidden_dim and batch_size must be >= 1, got "
                f"{num_layers}, {filters}, {hidden_dim}, {batch_size}"
            )
        self.num_layers = num_layers
        self.filters = filters
        self.hidden_dim = hidden_dim
        self.keep_prob = keep_prob
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.warmup_steps = warmup_steps
        self.max_steps = max_steps
        self.bn_decay = bn_decay

    def task(self) -> Params:
        p = ImageClassifierTask.Params()
        height, width, channels = DigitsInput.IMAGE_SHAPE
        sub = []
        for i in range(self.num_layers):
            pool = min(height, width) >= 2
            out_channels = self.filters * 2 ** min(i, 3)
            sub += conv_block(i, channels, out_channels, pool, self.bn_decay)
            channels = out_channels
            if pool:
                height, width = height // 2, width // 2
        sub.append(FlattenLayer.Params().set(name="flatten"))
        sub.append(
            ProjectionLayer.Params().set(
                name="hidden",
                input_dim=height * width * channels,
                output_dim=self.hidden_dim,
                activation="relu",
            )
        )
        if self.keep_prob < 1.0:
            sub.append(DropoutLayer.Params().set(name="dropout", keep_prob=self.keep_prob))
        p.body.sub = sub
        p.softmax.set(input_dim=self.hidden_dim, num_classes=DigitsInput.NUM_CLASSES)
        p.train.set(
            optimizer="adam",
            learning_rate=self.learning_rate,
            lr_schedule="linear_cosine",
            warmup_steps=self.warmup_steps,
            max_steps=self.max_steps,
            save_interval_steps=500,
            summary_interval_steps=50,
            log_interval_steps=100,
        )
        return p

    def _input(self, split: str) -> Params:
        p = DigitsInput.Params().set(name=split, split=split, batch_size=self.batch_size)
        return set_split_mode(p, split, shuffle_seed=301)

    def train(self) -> Params:
        return self._input("train")

    def dev(self) -> Params:
        return self._input("dev")

    def test(self) -> Params:
        return self._input("test")


@registry.register
class WideConvNet(ConvNet):
    """ConvNet at twice the width (64 filters, then 128): about 2.5 times the compute per example.

    ``tools.benchmark multiworker`` trains it by default: a data-parallel step waits on the same 5
    all-reduces (latency-bound, about 1 ms each between processes on loopback) whatever the width,
    so the wider net shows what replicas gain once compute outweighs them; the 32-filter ConvNet's
    step (about 50 ms on a trainer's half of a 2048 batch) is near the edge where it does not.
    """

    def __init__(self, filters: int = 64, **kwargs) -> None:
        super().__init__(filters=filters, **kwargs)


@registry.register
class GPipeConvNet(ConvNet):
    """The default ConvNet pipelined: its layers cut into 2 stages on 2 devices, 4 micro-batches.

    Same model, data and learner as ConvNet (so the same accuracy); the host CPU is split into
    ``num_stages`` logical devices. Evaluation and decoding batches (270 examples, a last partial one)
    run unsplit: ``input.dev.task_overrides`` sets the pipeline's num_micro_batches to 1 there.
    """

    def __init__(
        self, num_stages: int = 2, num_micro_batches: int = 4, remat: str = "always", **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.num_stages = num_stages
        self.num_micro_batches = num_micro_batches
        self.remat = remat

    def task(self) -> Params:
        p = super().task()
        height, width, channels = DigitsInput.IMAGE_SHAPE
        pipeline = GPipeLayer.Params().set(
            name="pipeline",
            layers=p.body.sub,
            num_stages=self.num_stages,
            partition_method="flops",
            input_shape=[None, height, width, channels],
            num_micro_batches=self.num_micro_batches,
            remat=self.remat,
        )
        p.body.sub = [pipeline]
        return p

    def cluster(self) -> Params:
        return cluster_params().set(num_logical_cpu_devices=self.num_stages)

    def task_overrides(self, dataset: str) -> dict:
        return {} if dataset == "train" else {"body.sub[0].num_micro_batches": 1}


@registry.register
class LocalConvNet(ConvNet):
    """ConvNet trained with local parallelism: its conv blocks cut into ``num_blocks`` blocks on as
    many devices (the last block also holds the hidden layer), each block trained by its own loss.

    Block k < K-1 ends in an aux head (global average pool + softmax); the last block's loss is the
    task's. ``window`` / ``stride`` as in LocalParallelLayer (greedy 1/1, overlapping 2/1); chunked:
    fewer blocks than conv layers (``num_layers = 4, num_blocks = 2``). Training is pipelined: block
    k works on the batch block k-1 saw the step before. Accuracies: docs/parallelism/local.md.
    """

    def __init__(
        self,
        num_blocks: int = 2,
        window: int = 1,
        stride: int = 1,
        pipelined: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not 1 <= num_blocks <= self.num_layers:
            raise ConfigError(
                f"LocalConvNet: num_blocks must be in [1, num_layers={self.num_layers}], got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.window = window
        self.stride = stride
        self.pipelined = pipelined

    def task(self) -> Params:
        from layers.parallel.local import PooledSoftmaxHead
        from layers.parallel.partition import uniform_bounds
        from tasks.image.local_model import LocalImageClassifierTask

        plain = super().task()
        layers = list(plain.body.sub)
        starts = [i for i, lp in enumerate(layers) if lp.name.startswith("conv")]
        bounds = uniform_bounds(self.num_layers, self.num_blocks)
        split_points = [starts[b] for b in bounds[1:-1]]
        heads = []
        for b in bounds[1:-1]:
            channels = layers[starts[b - 1]].filter_shape[-1]
            heads.append(
                PooledSoftmaxHead.Params().set(input_dim=channels, num_classes=DigitsInput.NUM_CLASSES)
            )
        p = LocalImageClassifierTask.Params()
        p.train = plain.train
        p.softmax = plain.softmax
        p.body.set(
            name="body",
            layers=layers,
            split_points=split_points,
            aux_heads=heads,
            window=self.window,
            stride=self.stride,
            pipelined=self.pipelined,
        )
        return p

    def cluster(self) -> Params:
        return cluster_params().set(num_logical_cpu_devices=self.num_blocks)
