"""Class paths written before a module moved (tests/data/params_before_layout: params.txt files that
the trainer wrote before the modules moved under layers/parallel/) read as the classes where they
live today."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from params import module_aliases, text_format, text_tree
from params.errors import ConfigError

OLD = sorted((Path(__file__).resolve().parents[1] / "data" / "params_before_layout").glob("*.params.txt"))
TYPEREF = re.compile(r"^(type|callable)/([\w.]+)/([\w.]+)$")


def _typerefs(path: Path) -> list[str]:
    """The class paths as the file writes them (parse_lines would upgrade them)."""
    values = [line.partition(":")[2].strip() for line in path.read_text().splitlines()]
    return [value for value in values if TYPEREF.match(value)]


def test_the_old_files_name_moved_modules():
    old = {TYPEREF.match(v).group(2) for path in OLD for v in _typerefs(path)}
    assert {"layers.gpipe", "layers.local_parallel"} <= old  # else this test proves nothing
    assert any("layers.transformer/TransformerInput" in v for path in OLD for v in _typerefs(path))
    assert len(OLD) == 2


@pytest.mark.parametrize("path", OLD, ids=lambda p: p.name)
def test_every_old_class_path_loads_the_class_of_today(path):
    for value in _typerefs(path):
        cls = text_format.resolve_typeref(value)
        kind = value.partition("/")[0]
        assert module_aliases.upgrade(value) == f"{kind}/{cls.__module__}/{cls.__qualname__}", value
        module = TYPEREF.match(value).group(2)
        if module in module_aliases.ALIASES:  # moved, and no shim left at the old path
            assert importlib.util.find_spec(module) is None, module


@pytest.mark.parametrize("path", OLD, ids=lambda p: p.name)
def test_an_old_text_and_its_upgraded_text_are_the_same_params(path):
    old = path.read_text()
    new = "".join(f"{k} : {v}\n" for k, v in text_tree.parse_lines(old).items())
    assert "layers.gpipe/" in old or "layers.local_parallel/" in old
    assert "layers.gpipe/" not in new and "layers.local_parallel/" not in new
    assert (
        text_tree.same(old, new)
        and text_tree.diff(text_tree.parse_lines(old), text_tree.parse_lines(new)) == []
    )
    changed = new.replace("learning_rate : ", "learning_rate : 1")
    assert not text_tree.same(old, changed)


def test_upgrade_touches_only_class_paths_of_moved_modules():
    assert (
        module_aliases.upgrade("type/layers.gpipe/GPipeLayer")
        == "type/layers.parallel.pipeline.gpipe/GPipeLayer"
    )
    assert module_aliases.upgrade("[type/layers.mesh/X, 3]") == "[type/layers.parallel.mesh/X, 3]"
    moved_class = "type/layers.transformer/TransformerInput"  # a class that left a module still there
    assert module_aliases.upgrade(moved_class) == "type/layers.transformer_input/TransformerInput"
    assert module_aliases.upgrade("type/layers.transformer/TransformerLayer") == (
        "type/layers.transformer/TransformerLayer"
    )
    for unchanged in ("type/layers.core/Conv", "'type/layers.gpipe/GPipeLayer'", "3", "type/layers.gpipes/G"):
        assert module_aliases.upgrade(unchanged) == unchanged


def test_an_unknown_name_in_a_moved_module_is_still_one_config_error():
    with pytest.raises(ConfigError, match="cannot import 'type/layers.gpipe/NoSuchLayer'"):
        text_format.resolve_typeref("type/layers.gpipe/NoSuchLayer")
