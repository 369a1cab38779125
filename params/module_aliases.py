"""Where the modules that Params text names went: old class paths keep loading.

A ``params.txt`` names each class by its module (``type/layers.gpipe/GPipeLayer``), so moving a module
would orphan every logdir written before the move. ``ALIASES`` is the one table of moves: an old module
path maps to its new one, and an old ``module/Name`` (a class that left a module which still exists)
to its new ``module/Name``. ``text_format.resolve_typeref`` reads a class through it, and
``text_tree.parse_lines`` rewrites old paths in values, so comparing a logdir's old params.txt with the
same Params written today finds no difference. Entries are never removed; a later move adds its own.
"""

from __future__ import annotations

import re

ALIASES: dict[str, str] = {
    # The ways of cutting a model across devices, under layers/parallel/.
    "layers.gpipe": "layers.parallel.pipeline.gpipe",
    "layers.pipeline_stage": "layers.parallel.pipeline.executor",
    "layers.pipeline_schedule": "layers.parallel.pipeline.schedule",
    "layers.pipeline_simulator": "layers.parallel.pipeline.simulator",
    "layers.pipeline_torch_format": "layers.parallel.pipeline.torch_format",
    "layers.pipeline_devices": "layers.parallel.device_choice",
    "layers.partition": "layers.parallel.partition",
    "layers.local_parallel": "layers.parallel.local",
    "layers.mesh": "layers.parallel.mesh",
    # layers/transformer.py split into modules with one job each (the layer stays).
    "layers.transformer/PositionalEmbedding": "layers.transformer_input/PositionalEmbedding",
    "layers.transformer/TransformerInput": "layers.transformer_input/TransformerInput",
    "layers.transformer/TransformerStack": "layers.transformer_stack/TransformerStack",
}

_TYPEREF = re.compile(r"\b(type|callable)/([A-Za-z_][\w.]*)/([A-Za-z_][\w.]*)")


def current(module: str, name: str) -> tuple[str, str]:
    """``(module, name)`` where that class or function lives now (unchanged if it never moved)."""
    moved = ALIASES.get(f"{module}/{name}")
    if moved is not None:
        new_module, _, new_name = moved.rpartition("/")
        return new_module, new_name
    return ALIASES.get(module, module), name


def upgrade(value_text: str) -> str:
    """A value's text with every old ``type/`` or ``callable/`` path written as it is now (quoted
    strings are left as they are)."""
    if "/" not in value_text or value_text[:1] in ("'", '"'):
        return value_text

    def sub(m: re.Match) -> str:
        module, name = current(m.group(2), m.group(3))
        return f"{m.group(1)}/{module}/{name}"

    return _TYPEREF.sub(sub, value_text)
