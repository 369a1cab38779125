"""A stack of Transformer layers, run in order or as a GPipe pipeline.

The stack is a plain list of ``TransformerLayer`` Params (``TransformerStack.params.layers``), so a
pipeline layer can cut it into stages: set ``TransformerStack.params.pipeline`` to a ``GPipeLayer``
template and training and evaluation run the layers as a K-stage, M-micro-batch pipeline (the
layers' dict-state form, ``_pipeline_state``), while decoding steps still run the same layers one
after another. The stack ends with a layer norm (its layers are pre-norm).

Decoding a step costs one position: ``init_cache`` allocates every layer's key/value cache at the
maximum length, ``extend_step`` runs one position through all layers, and the encoder output is
projected to keys/values once by ``project_source``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from layers import checks
from layers.attention import padding_mask
from layers.base_layer import BaseLayer, FPropContext
from layers.core import LayerNorm
from layers.parallel import mesh as mesh_lib
from layers.parallel.pipeline.gpipe import GPipeLayer
from layers.transformer import LayerCache, TransformerLayer, attention_masks, transformer_layer_params
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params


class TransformerStack(BaseLayer):
    """``layers`` (a list of TransformerLayer Params) applied in order, then a final layer norm."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("model_dim", 0, "Width of the stack (every layer's model_dim).")
        p.define("layers", [], "List of TransformerLayer Params, applied in order (children layers_<i>).")
        p.define("final_ln", True, "Layer-normalize the output (needed by pre-norm stacks).")
        p.define("ln_epsilon", 1e-6, "Epsilon of the final layer norm.")
        p.define(
            "pipeline",
            None,
            "None: the layers run in order. Or GPipeLayer Params with its layers left empty (num_stages, "
            "num_micro_batches, remat, partition_method ...): fprop runs `layers` as that pipeline "
            "(child pipeline/layers_<i>); incremental decoding still runs them one by one.",
            value_type=Params,
        )
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        dim = checks.positive_int(self, "model_dim")
        if not isinstance(p.layers, (list, tuple)) or not p.layers:
            raise ConfigError(
                f"{self.path}: params.layers must be a non-empty list of TransformerLayer Params"
            )
        for i, lp in enumerate(p.layers):
            if not isinstance(lp, Params) or "model_dim" not in lp or lp.model_dim != dim:
                raise ConfigError(
                    f"{self.path}: params.layers[{i}] must be a layer Params with model_dim={dim}"
                )
        if p.pipeline is None:
            self.create_children("layers", list(p.layers))
        else:
            self._create_pipeline(p.pipeline, list(p.layers))
        if p.final_ln:  # run in the pipeline's last stage: on its mesh when the stages have meshes
            with mesh_lib.mesh_scope(self.output_mesh or self.mesh):
                self.create_child("final_ln", LayerNorm.Params().set(input_dim=dim, epsilon=p.ln_epsilon))

    def _create_pipeline(self, template: Params, layers: list[Params]) -> None:
        if not isinstance(template, InstantiableParams) or not issubclass(template.cls, GPipeLayer):
            raise ConfigError(f"{self.path}: params.pipeline must be None or GPipeLayer.Params()")
        if template.layers or template.stages:
            raise ConfigError(
                f"{self.path}: leave params.pipeline.layers and .stages empty; the pipeline runs "
                "params.layers"
            )
        named = [lp.copy().set(name=f"layers_{i}") for i, lp in enumerate(layers)]
        self.create_child("pipeline", template.copy().set(layers=named))

    @property
    def sequence(self) -> list[TransformerLayer]:
        """The layers in order (wherever a pipeline placed them)."""
        return self.pipeline.sequence if self.params.pipeline is not None else self.layers

    def _finish(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        return self.final_ln(ctx, x) if self.params.final_ln else x

    @property
    def is_pipelined(self) -> bool:
        return self.params.pipeline is not None

    @property
    def output_mesh(self) -> mesh_lib.DeviceMesh | None:
        """The mesh of the stack's outputs when its pipeline's stages have meshes of their own (the
        last stage's), else None: the layers after the stack are built there."""
        return self.pipeline.output_mesh if self.is_pipelined else None

    def to_output_mesh(self, x: Any) -> Any:
        """Inputs (labels, paddings) given on the stack's input mesh -> on its output mesh (as they
        are without stage meshes)."""
        return self.pipeline.to_output_mesh(x) if self.is_pipelined else x

    def fprop_with_head(
        self,
        ctx: FPropContext,
        x: tf.Tensor,
        head: Callable,
        head_inputs: dict[str, tf.Tensor],
        paddings: tf.Tensor | None = None,
        source: tf.Tensor | None = None,
        source_paddings: tf.Tensor | None = None,
        segment_ids: tf.Tensor | None = None,
        source_segment_ids: tf.Tensor | None = None,
    ) -> dict[str, tf.Tensor]:
        """A pipelined stack's forward with ``head(ctx, y, head_inputs_m)`` run in its last stage on
        each micro-batch's (final-normalized) output ``y`` and that micro-batch's ``head_inputs``
        (targets, paddings): a task's per-example loss, concatenated over micro-batches."""
        if not self.is_pipelined:
            raise ConfigError(f"{self.path}: fprop_with_head needs params.pipeline")
        state = _pipeline_state(x, paddings, segment_ids, source, source_paddings, source_segment_ids)

        def stack_head(ctx: FPropContext, state: dict, inputs: dict) -> dict[str, tf.Tensor]:
            return head(ctx, self._finish(ctx, state["x"]), inputs)

        head_inputs = self.to_output_mesh(head_inputs)  # given beside x, used in the last stage
        return self.pipeline(ctx, state, head=stack_head, head_inputs=head_inputs)

    def fprop(
        self,
        ctx: FPropContext,
        x: tf.Tensor,
        paddings: tf.Tensor | None = None,
        source: tf.Tensor | None = None,
        source_paddings: tf.Tensor | None = None,
        segment_ids: tf.Tensor | None = None,
        source_segment_ids: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """``x [B, T, D]`` with ``paddings [B, T]`` (and a ``source [B, S, D_s]`` for decoders)."""
        if self.params.pipeline is not None:
            state = _pipeline_state(x, paddings, segment_ids, source, source_paddings, source_segment_ids)
            return self._finish(ctx, self.pipeline(ctx, state)["x"])
        self_mask, source_mask = attention_masks(paddings, segment_ids, source_paddings, source_segment_ids)
        for layer in self.layers:
            x = layer(ctx, x, self_mask, source, source_mask)
        return self._finish(ctx, x)

    # ----------------------------------------------------------------------- incremental decoding
    def init_cache(self, batch_size: int, max_length: int) -> list[LayerCache]:
        return [layer.init_cache(batch_size, max_length) for layer in self.sequence]

    def project_source(self, source: tf.Tensor) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """Each cross-attention layer's keys and values of ``source``; computed once per decode."""
        return [
            layer.cross_atten.project_source(source) if layer.params.has_cross_attention else (None, None)
            for layer in self.sequence
        ]

    def extend_step(
        self,
        ctx: FPropContext,
        x: tf.Tensor,
        cache: list[LayerCache],
        time_step: tf.Tensor | int,
        source_kv: list[tuple[tf.Tensor, tf.Tensor]] | None = None,
        source_paddings: tf.Tensor | None = None,
    ) -> tuple[tf.Tensor, list[LayerCache]]:
        """One position ``x [B, 1, D]`` through every layer; returns its output and the new caches."""
        source_mask = padding_mask(source_paddings) if source_paddings is not None else None
        new_cache = []
        for i, layer in enumerate(self.sequence):
            kv = source_kv[i] if source_kv is not None else None
            x, layer_cache = layer.extend_step(ctx, x, cache[i], time_step, kv, source_mask)
            new_cache.append(layer_cache)
        return self._finish(ctx, x), new_cache


def _pipeline_state(
    x: tf.Tensor,
    paddings: tf.Tensor | None,
    segment_ids: tf.Tensor | None,
    source: tf.Tensor | None,
    source_paddings: tf.Tensor | None,
    source_segment_ids: tf.Tensor | None,
) -> dict[str, tf.Tensor]:
    """The dict of batch-major tensors a pipelined stack's micro-batches carry (the pipeline form
    of TransformerLayer.fprop)."""
    state = {
        "x": x,
        "paddings": paddings,
        "segment_ids": segment_ids,
        "source": source,
        "source_paddings": source_paddings,
        "source_segment_ids": source_segment_ids,
    }
    return {name: value for name, value in state.items() if value is not None}


def stack_params(
    num_layers: int,
    model_dim: int,
    num_heads: int,
    hidden_dim: int = 0,
    *,
    decoder: bool = False,
    cross_attention: bool | None = None,
    dropout_prob: float = 0.0,
) -> InstantiableParams:
    """A TransformerStack of ``num_layers`` identical (separately weighted) layers."""
    layer = transformer_layer_params(
        model_dim,
        num_heads,
        hidden_dim,
        decoder=decoder,
        cross_attention=cross_attention,
        dropout_prob=dropout_prob,
    )
    return TransformerStack.Params().set(
        model_dim=model_dim, layers=[layer.copy() for _ in range(num_layers)]
    )
