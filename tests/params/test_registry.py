"""Registry keys, duplicates, lookup by path and close-match errors; a model name imports nothing outside
the experiment packages."""

import sys

import pytest

from params import registry
from params.errors import ConfigError
from params.experiment import Experiment
from tests.params import fake_experiments
from tests.params.fake_experiments import CANARY


def test_key_rule_drops_tasks_and_params_packages():
    cls = type("ConvNet", (Experiment,), {"__module__": "tasks.image.params.digits"})
    assert registry.key_for(cls) == "image.digits.ConvNet"
    other = type("MyExp", (Experiment,), {"__module__": "my_pkg.my_exps"})
    assert registry.key_for(other) == "my_pkg.my_exps.MyExp"


def test_registered_class_is_found_by_key():
    key = "tests.params.fake_experiments.TinyExp"
    assert registry.get(key) is fake_experiments.TinyExp
    assert key in registry.all_keys()


def test_unregistered_class_is_found_by_import_path():
    assert registry.get("tests.params.fake_experiments.Unregistered") is fake_experiments.Unregistered


def test_duplicate_key_is_an_error():
    def make():
        return type("Dup", (Experiment,), {"__module__": "tasks.demo.params.dups", "__qualname__": "Dup"})

    first = registry.register(make())
    try:
        clash = type("Dup", (Experiment,), {"__module__": "tasks.demo.params.dups", "__qualname__": "X.Dup"})
        with pytest.raises(ConfigError, match="registered twice"):
            registry.register(clash)
        assert registry.register(first) is first  # the same class again (a reload) is fine
    finally:
        registry.unregister("demo.dups.Dup")


def test_unknown_key_lists_closest_keys():
    with pytest.raises(ConfigError) as e:
        registry.get("tests.params.fake_experiments.TinyExq")
    assert "did you mean 'tests.params.fake_experiments.TinyExp'" in str(e.value)
    with pytest.raises(ConfigError, match="unknown model 'nothing'"):
        registry.get("nothing")


def test_doc_line_is_first_docstring_line():
    assert registry.doc_line(fake_experiments.TinyExp) == "A tiny experiment whose knobs gin can bind."


@pytest.mark.parametrize(
    "model", [".x.Y", ".", "..", "a" * 5000 + ".B", "trainer.__main__.X", "os.path.join"]
)
def test_bad_model_keys_are_one_line(model):
    with pytest.raises(ConfigError, match="unknown model") as e:
        registry.get(model)
    assert len(str(e.value)) < 400


def test_model_names_import_only_from_experiment_packages(canary, tmp_path, monkeypatch):
    """A full path outside tasks imports nothing; the documented opt-in makes it importable."""
    with pytest.raises(ConfigError, match="--experiment_packages=tp_never_imported"):
        registry.get(f"{CANARY}.Thing")
    (tmp_path / "tp_optin_exps.py").write_text(
        "from params.experiment import Experiment\nclass Exp(Experiment):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="unknown model 'tp_optin_exps.Exp'"):
        registry.get("tp_optin_exps.Exp")
    assert "tp_optin_exps" not in sys.modules
    monkeypatch.setenv(registry.PACKAGES_ENV, "tests,tp_optin_exps")
    assert registry.get("tp_optin_exps.Exp").__module__ == "tp_optin_exps"
    monkeypatch.delitem(sys.modules, "tp_optin_exps")


def test_an_import_error_inside_a_user_module_is_reported_as_such(tmp_path, monkeypatch):
    package = tmp_path / "user_exps_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "broken.py").write_text("import no_such_dependency_xyz\n")
    (package / "typo.py").write_text("x = undefined_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(registry.PACKAGES_ENV, "tests,user_exps_pkg,not_a_pkg_xyz")  # the opt-in
    with pytest.raises(
        ConfigError, match="importing user_exps_pkg.broken failed: No module named 'no_such_dep"
    ):
        registry.get("user_exps_pkg.broken.MyExp")
    with pytest.raises(ConfigError, match="importing user_exps_pkg.typo failed: NameError"):
        registry.get("user_exps_pkg.typo.MyExp")
    with pytest.raises(ConfigError, match="unknown model .*PYTHONPATH"):
        registry.get("not_a_pkg_xyz.exps.MyExp")
