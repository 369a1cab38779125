"""Language-model experiments on a synthetic Markov-chain corpus with a known entropy rate."""

from __future__ import annotations

from layers.parallel.pipeline.gpipe import GPipeLayer
from params import registry
from params.errors import ConfigError
from params.experiment import cluster_params
from params.hyperparams import Params
from tasks.base_input import set_split_mode
from tasks.lm.input import SyntheticLmInput
from tasks.lm.vocabulary import NUM_SPECIAL, vocab_params
from tasks.transformer_experiment import TransformerLmExperiment


@registry.register
class TransformerLM(TransformerLmExperiment):
    """A small causal Transformer on sequences of a random sparse 32-state Markov chain.

    The best achievable log-perplexity is known in closed form (``tasks.lm.markov``;
    ``SyntheticLmInput.achievable_log_pplx()``); the task reports ``log_pplx_gap`` to it. With the
    defaults the entropy rate is H = 1.125 nats and the best per-token value on length-32 sequences
    (first token H(pi) = 3.324) is 1.194. Measured through the trainer (2 CPU cores, 26 s for the
    whole run on a quiet machine, 2 min 8 s on a busy one): dev log_pplx 1.239 at step 250, 1.204 at
    the default 1000 steps, a gap of 0.011 nats to the achievable value and 7.0% above H.

    Knobs (gin: ``TransformerLM.model_dim = 128``): chain size and sparsity, sequence length, model
    size, batch size, Adam with warm-up then cosine decay.
    """

    def __init__(
        self,
        num_states: int = 32,
        num_successors: int = 4,
        chain_seed: int = 1234,
        num_train_sequences: int = 20000,
        num_eval_sequences: int = 1000,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        sizes = (num_states - 1, num_successors, self.seq_length, self.model_dim, self.num_layers)
        if min(*sizes, self.batch_size, self.max_steps) < 1:
            raise ConfigError(
                "TransformerLM: need num_states >= 2 and num_successors, seq_length, model_dim, "
                "num_layers, batch_size, max_steps >= 1"
            )
        self.num_states = num_states
        self.num_successors = num_successors
        self.chain_seed = chain_seed
        self.vocab = vocab_params(size=num_states + NUM_SPECIAL)
        self.num_train_sequences = num_train_sequences
        self.num_eval_sequences = num_eval_sequences

    def _input(self, split: str, seed: int, num_sequences: int) -> Params:
        p = SyntheticLmInput.Params().set(
            name=split,
            num_states=self.num_states,
            num_successors=self.num_successors,
            chain_seed=self.chain_seed,
            seq_length=self.seq_length,
            num_sequences=num_sequences,
            data_seed=seed,
            batch_size=self.batch_size,
        )
        return set_split_mode(p, split, shuffle_seed=501)

    def train(self) -> Params:
        return self._input("train", 1, self.num_train_sequences)

    def dev(self) -> Params:
        return self._input("dev", 2, self.num_eval_sequences)

    def test(self) -> Params:
        return self._input("test", 3, self.num_eval_sequences)


@registry.register
class GPipeTransformerLM(TransformerLM):
    """A deeper TransformerLM whose stack runs as a GPipe pipeline: ``num_stages`` stages on as many
    devices (the host CPU split into logical devices), ``num_micro_batches`` micro-batches per step.

    The same chain and learner as TransformerLM; 8 pre-norm layers of width 128 (1.59M parameters) at
    batch 64, cut into 2 stages of 4 layers. Evaluation runs the same pipeline; decoding steps run the
    layers one by one with their key/value caches. Measured through the trainer (2 shared CPU cores,
    4 min 15 s for the whole run): dev log_pplx 1.201 at the default 1000 steps, 6.8% above H. Its
    training loss stays within 2e-4 of the unpipelined model's (``GPipeTransformerLM.num_stages = 1``,
    ``num_micro_batches = 1``); on a CPU host the unpipelined model is at least as fast, since TF
    already spreads one device's ops over both cores (docs/parallelism/gpipe.md).
    """

    def __init__(
        self,
        num_stages: int = 2,
        num_micro_batches: int = 4,
        remat: str = "always",
        num_layers: int = 8,
        model_dim: int = 128,
        hidden_dim: int = 512,
        batch_size: int = 64,
        max_steps: int = 1000,
        **kwargs,
    ) -> None:
        super().__init__(
            num_layers=num_layers,
            model_dim=model_dim,
            hidden_dim=hidden_dim,
            batch_size=batch_size,
            max_steps=max_steps,
            **kwargs,
        )
        self.num_stages = num_stages
        self.num_micro_batches = num_micro_batches
        self.remat = remat

    def task(self) -> Params:
        p = super().task()
        p.stack.pipeline = GPipeLayer.Params().set(
            name="pipeline",
            num_stages=self.num_stages,
            num_micro_batches=self.num_micro_batches,
            remat=self.remat,
        )
        return p

    def cluster(self) -> Params:
        return cluster_params().set(num_logical_cpu_devices=self.num_stages)


@registry.register
class LocalTransformerLM(TransformerLM):
    """TransformerLM trained with local parallelism: embedding + ``num_layers`` layers + final layer
    norm cut into ``num_blocks`` blocks on as many devices, block k < K-1 ending in a small softmax
    (layer norm + projection to the vocabulary) that trains it; the last block's loss is the LM's.

    ``window`` / ``stride`` as in LocalParallelLayer (greedy 1/1, overlapping 2/1); chunked: fewer
    blocks than layers. ``num_blocks = 1`` is the same model trained with backprop (the baseline of
    the table in docs/parallelism/local.md, which has the log-perplexities). Untied softmax; no
    gradient clipping (a global norm would couple the blocks' steps); no decoder job.
    """

    def __init__(
        self,
        num_blocks: int = 2,
        window: int = 1,
        stride: int = 1,
        pipelined: bool = True,
        num_layers: int = 4,
        **kwargs,
    ) -> None:
        super().__init__(num_layers=num_layers, **kwargs)
        if not 1 <= num_blocks <= num_layers:
            raise ConfigError(f"LocalTransformerLM: num_blocks must be in [1, num_layers={num_layers}]")
        self.num_blocks = num_blocks
        self.window = window
        self.stride = stride
        self.pipelined = pipelined

    def task(self) -> Params:
        from layers.parallel.local import SequenceSoftmaxHead
        from layers.parallel.partition import uniform_bounds
        from tasks.lm.local_model import LocalTransformerLmTask, local_lm_layers

        plain = super().task()
        vocab_size = plain.vocab.size
        p = LocalTransformerLmTask.Params()
        p.vocab = plain.vocab
        p.train = plain.train.set(clip_gradient_norm_to_value=0.0)
        p.softmax.set(input_dim=self.model_dim)
        bounds = uniform_bounds(self.num_layers, self.num_blocks)
        head = SequenceSoftmaxHead.Params().set(input_dim=self.model_dim, num_classes=vocab_size)
        p.local.set(
            name="local",
            layers=local_lm_layers(
                vocab_size, self.model_dim, list(plain.stack.layers), self.seq_length, self.dropout_prob
            ),
            split_points=[1 + b for b in bounds[1:-1]],
            aux_heads=[head.copy() for _ in bounds[1:-1]],
            window=self.window,
            stride=self.stride,
            pipelined=self.pipelined,
        )
        return p

    def cluster(self) -> Params:
        return cluster_params().set(num_logical_cpu_devices=self.num_blocks)


@registry.register
class MeshTransformerLM(TransformerLM):
    """TransformerLM sharded over a ``data`` x ``model`` mesh of logical CPU devices (DTensor).

    Mesh-TF's layout rules ``batch:data; hidden:model; heads:model; vocab:model`` split the batch over
    ``data`` and the feed-forward hidden units, attention heads and the (tied) vocabulary over
    ``model``; q/k/v use separate projections so the heads split whole (the vocabulary, 32 states + 4
    special tokens = 36, divides by a model axis of 2 or 4). Evaluation and decoding run unsharded
    from the plain checkpoints (docs/parallelism/mesh.md). Measured through the trainer (2 CPU
    cores shared with other jobs, load average 11 to 15; 4 min for the whole run): dev log_pplx 1.205
    at the default 1000 steps (TransformerLM: 1.204), a gap of 0.012 nats to the achievable value.
    """

    def __init__(
        self,
        data_parallel: int = 2,
        model_parallel: int = 2,
        layout_rules: str = "batch:data;hidden:model;heads:model;vocab:model",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.data_parallel = data_parallel
        self.model_parallel = model_parallel
        self.layout_rules = layout_rules

    def task(self) -> Params:
        p = super().task()
        for layer in p.stack.layers:
            layer.fused_qkv = False
        return p

    def cluster(self) -> Params:
        return cluster_params().set(
            num_logical_cpu_devices=self.data_parallel * self.model_parallel,
            mesh_shape=[self.data_parallel, self.model_parallel],
            mesh_axis_names=["data", "model"],
            layout_rules=self.layout_rules,
        )


@registry.register
class StageMeshTransformerLM(TransformerLM):
    """TransformerLM as a GPipe pipeline whose stages each carry a DTensor mesh of their own
    (pipeline x mesh): ``num_stages`` stages x a ``stage_mesh_size``-way ``model`` mesh each on as many
    logical CPU devices (4 by default: stage k on devices 2k, 2k+1), feed-forward hidden units, heads
    and vocabulary split over each stage's mesh (docs/parallelism/compose.md). ``stage_replicas`` R > 1
    adds a ``data`` axis to every stage's mesh (pipeline x mesh x data: R x ``stage_mesh_size``
    devices a stage, each micro-batch's rows split over the R replicas).

    The embedding sits on the first stage's mesh, the final norm and the (untied) softmax on the
    last's; q/k/v are separate projections (fused_qkv with ``heads:model`` fails DTensor's SPMD on
    stage meshes). Overrides choose the combination with the same variables: ``stage_mesh_size = 1``
    pipelined on plain devices, ``num_stages = 0`` the plain stack. Training runs through the trainer's
    stage-mesh placement; evaluation and decoding are not supported on stage meshes yet (train with
    ``--job=trainer``; the checkpoints are the plain format, and a ``num_stages = 0`` evaler or
    decoder restores them by the variables' names: see docs/parallelism/compose.md).
    """

    def __init__(
        self,
        num_stages: int = 2,
        stage_mesh_size: int = 2,
        stage_replicas: int = 1,
        num_micro_batches: int = 2,
        schedule: str = "fill_drain",
        stage_layout_rules: str = "hidden:model;heads:model;vocab:model",
        num_layers: int = 4,
        **kwargs,
    ) -> None:
        super().__init__(num_layers=num_layers, **kwargs)
        if num_stages < 0 or stage_mesh_size < 1 or stage_replicas < 1:
            raise ConfigError(
                "StageMeshTransformerLM: need num_stages >= 0, stage_mesh_size >= 1 and stage_replicas >= 1"
            )
        self.num_stages = num_stages
        self.stage_mesh_size = stage_mesh_size
        self.stage_replicas = stage_replicas
        self.num_micro_batches = num_micro_batches
        self.schedule = schedule
        self.stage_layout_rules = stage_layout_rules

    def task(self) -> Params:
        p = super().task()
        p.tie_softmax = False  # the embedding and the logits sit on different stage meshes
        for layer in p.stack.layers:
            layer.fused_qkv = False
        if self.num_stages:
            p.stack.pipeline = GPipeLayer.Params().set(
                name="pipeline",
                num_stages=self.num_stages,
                num_micro_batches=self.num_micro_batches,
                schedule=self.schedule,
            )
            axes = [("data", self.stage_replicas), ("model", self.stage_mesh_size)]
            axes = [(name, size) for name, size in axes if size > 1]
            if axes:
                rules = self.stage_layout_rules if self.stage_mesh_size > 1 else ""
                if self.stage_replicas > 1:
                    rules = ";".join(r for r in ("batch:data", rules) if r)
                p.stack.pipeline.set(
                    stage_mesh_shape=[size for _, size in axes],
                    stage_mesh_axis_names=[name for name, _ in axes],
                    stage_layout_rules=rules,
                )
        return p

    def cluster(self) -> Params:
        per_stage = self.stage_mesh_size * self.stage_replicas
        return cluster_params().set(num_logical_cpu_devices=max(self.num_stages, 1) * per_stage)
