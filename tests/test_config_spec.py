"""assets/configuration/spec.yaml: the files generated from it are current, it names every option
the check reads, and what it documents (defaults, examples, deploy values) the check accepts."""

import ast
import typing
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml
from datadog_checks.dev.tooling.configuration import ConfigSpec

from gpu_monitoring import check as check_module
from gpu_monitoring.collectors import COLLECTOR_NAMES
from gpu_monitoring.config.derived import derive
from gpu_monitoring.config_models import InstanceConfig, SharedConfig, defaults
from gpu_monitoring.metrics.spec import DEFAULT_PROFILE, PROFILES
from gpu_monitoring.options import spec_options as generated
from gpu_monitoring.simulator.scenario import available

from .config_support import derived, validated_shared
from .scripts_support import load_script

ROOT = Path(__file__).resolve().parent.parent
HELM_VALUES = sorted((ROOT / "deploy" / "helm").glob("datadog-values*.yaml"))


generator = load_script("generate_config")


class Recorder:
    """A validated instance that notes every option read from it."""

    def __init__(self, config):
        self.config = config
        self.read = set()

    def __getattr__(self, name):
        self.read.add(name)
        return getattr(self.config, name)


def options_read_by_the_check():
    """What `derive` reads of a validated instance, and what the check reads of it itself (`self.config.<option>`)."""
    instance = Recorder(model({}))
    derive(instance)
    tree = ast.parse(Path(check_module.__file__).read_text())
    read_by_the_check = {
        node.attr for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "config"
        and isinstance(node.value.value, ast.Name) and node.value.value.id == "self"
    }
    return instance.read | read_by_the_check


def instance_options(spec_text, source="gpu_monitoring", section="instances"):
    """The instance options (or init_config's) of a spec, templates expanded, as the tooling resolves them."""
    spec = ConfigSpec(spec_text, source=source, version="0.0.1")
    spec.load()
    assert not spec.errors, spec.errors
    (file,) = spec.data["files"]
    (options,) = [options for options in file["options"] if options["name"] == section]
    return {option["name"]: option for option in options["options"]}


def standard_option_names():
    """The options the `instances/default` template brings: the Agent's, not the check's."""
    text = yaml.safe_dump({
        "name": "Standard",
        "files": [{"name": "standard.yaml", "options": [
            {"template": "instances", "options": [{"template": "instances/default"}]},
        ]}],
    })
    return set(instance_options(text, source="standard"))


def spec_options():
    return instance_options(generator.SPEC.read_text())


def agent_option_names():
    """The options spec.yaml lists, hidden, because the Agent or datadog-checks-base reads them from
    every instance: not the check's, yet no typo either."""
    return {name for name, option in spec_options().items() if option["hidden"]} - standard_option_names()


def model(instance):
    return InstanceConfig.model_validate(instance, context={"configured_fields": frozenset(instance)})


def literal_words(annotation):
    """The words of every Literal in a model field's type, however deep (Optional, Union, tuple items)."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [word for argument in typing.get_args(annotation) for word in literal_words(argument)]


def plain(value):
    """A model value as the YAML that would give it: tuples as lists, read-only mappings as dicts."""
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    if isinstance(value, (dict, MappingProxyType)):
        return {k: plain(v) for k, v in value.items()}
    return value


def helm_instances():
    for path in HELM_VALUES:
        values = yaml.safe_load(path.read_text())
        confd = yaml.safe_load(values["datadog"]["confd"]["gpu_monitoring.yaml"])
        for index, instance in enumerate(confd["instances"]):
            yield pytest.param(confd["init_config"], instance, id=f"{path.name}[{index}]")


# --- generated files ------------------------------------------------------------------


def test_generated_files_are_current():
    stale = generator.stale_files()
    assert not stale, (
        f"{', '.join(str(p.relative_to(ROOT)) for p in stale)} differ from what "
        "assets/configuration/spec.yaml gives: run `make config`"
    )


def test_check_mode_reports_missing_and_edited_files_and_keeps_custom_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(generator, "EXAMPLE_DIR", tmp_path)
    monkeypatch.setattr(generator, "MODELS_DIR", tmp_path / "config_models")
    monkeypatch.setattr(generator, "SPEC_OPTIONS", tmp_path / "config" / "spec_options.py")
    expected = {"conf.yaml.example", "__init__.py", "instance.py", "shared.py", "defaults.py", "validators.py",
                "spec_options.py"}
    assert {path.name for path in generator.stale_files()} == expected

    generator.write()
    assert generator.stale_files() == []

    instance_model = tmp_path / "config_models" / "instance.py"
    # Formatted otherwise is not stale; a change to the code is.
    instance_model.write_text(instance_model.read_text().replace("    model_config", "\n    model_config"))
    assert generator.stale_files() == []
    instance_model.write_text(instance_model.read_text().replace("frozen=True", "frozen=False"))
    validators = tmp_path / "config_models" / "validators.py"
    validators.write_text("def initialize_instance(values, **kwargs):\n    return values\n")
    assert generator.stale_files() == [instance_model]
    assert generator.main(["--check"]) == 1

    leftover = tmp_path / "config_models" / "deprecations_of_old.py"
    leftover.write_text(generator.DOCUMENTATION_HEADER)
    assert generator.stale_files() == [leftover, instance_model]

    generator.write()
    assert generator.stale_files() == []
    assert "initialize_instance(values" in validators.read_text()
    assert not leftover.exists()


# --- the spec and the check agree -------------------------------------------------------


def test_the_models_imports_are_absolute():
    for path in generator.MODELS_DIR.glob("*.py"):
        assert "from ." not in path.read_text(), path


def test_spec_names_every_option_the_check_reads_and_no_other():
    read = options_read_by_the_check()
    assert {"kubelet_url", "collect_processes", "metrics_profile", "xid_ignore", "source"} <= read

    documented = set(spec_options())
    standard = standard_option_names()
    assert read - documented == set(), "options the check reads that the spec does not document"
    assert documented - read - standard == agent_option_names(), (
        "options the spec documents that the check does not read, and not hidden as the Agent's"
    )
    assert set(InstanceConfig.model_fields) == documented
    # The options refused as unknown are exactly the ones the spec does not name.
    assert generated.KNOWN_OPTIONS == documented
    shared = set(instance_options(generator.SPEC.read_text(), section="init_config"))
    assert generated.KNOWN_SHARED_OPTIONS == shared == set(SharedConfig.model_fields)


def test_spec_choices_are_the_checks_choices():
    options = spec_options()
    assert options["disabled_collectors"]["value"]["items"]["enum"] == list(COLLECTOR_NAMES)
    assert options["metrics_profile"]["value"]["enum"] == list(PROFILES)
    assert options["metrics_profile"]["value"]["display_default"] == DEFAULT_PROFILE
    for mode in ("auto", "true", "false", True, False):
        assert model({"kubernetes": mode}).kubernetes == mode


def test_the_validators_words_are_the_models_literals():
    # Both are written from spec.yaml's `enum`s by `make config`.
    with_words = {name: literal_words(field.annotation) for name, field in InstanceConfig.model_fields.items()}
    assert generated.CHOICES == {name: tuple(words) for name, words in with_words.items() if words}
    assert generated.CHOICES["source"] == ("local", "sidecar")


def test_the_defaults_without_the_models_are_the_models_defaults():
    assert generated.DEFAULTS == {
        name[len("instance_"):]: function() for name, function in vars(defaults).items()
        if name.startswith("instance_")
    }


def test_every_option_has_a_description_and_an_example():
    for name, option in spec_options().items():
        assert option["description"].strip(), name
        assert "example" in option["value"], name


def test_spec_defaults_are_the_checks_defaults():
    # Giving the check the spec's defaults explicitly changes nothing; options the spec leaves
    # without a default (the Agent's kubelet settings, /host/proc if present, ...) are the check's to choose.
    empty = model({})
    explicit = {
        name: plain(getattr(empty, name))
        for name in options_read_by_the_check()
        if getattr(empty, name) is not None
    }
    assert model(explicit) == empty
    assert derived(explicit) == derived({})


def test_every_example_in_the_spec_is_accepted():
    examples = {name: option["value"]["example"] for name, option in spec_options().items()}
    accepted = model(examples)
    assert accepted.simulate == examples["simulate"]
    assert derived(examples).hourly_price == examples["hourly_price"]


# --- what the generated files say, and what deployments give ---------------------------


def test_example_lists_the_packages_scenarios():
    example = (generator.EXAMPLE_DIR / "conf.yaml.example").read_text()
    paragraph = example[example.index("@param simulate"):example.index("# simulate:")]
    listed = paragraph.split("the scenarios the package has:")[1].split(".")[0]
    assert sorted(name.strip() for name in listed.replace("##", "").split(",")) == available()


def test_the_agents_own_options_are_not_in_the_example():
    example = (generator.EXAMPLE_DIR / "conf.yaml.example").read_text()
    assert agent_option_names()
    for name in agent_option_names():
        assert f"@param {name} " not in example, name


def test_example_file_is_yaml_the_check_accepts():
    example = yaml.safe_load((generator.EXAMPLE_DIR / "conf.yaml.example").read_text())
    # `init_config:` with every option commented out is null: no shared option set.
    validated_shared(example["init_config"] or {})
    (instance,) = example["instances"]
    assert model(instance).collect_processes is True
    assert derived(instance).disabled_collectors == []


@pytest.mark.parametrize("init_config, instance", list(helm_instances()))
def test_models_accept_the_helm_values_instances(init_config, instance):
    assert HELM_VALUES
    assert validated_shared(init_config or {}).service is None
    validated = model(instance)
    derived(instance)
    for name in instance:
        assert plain(getattr(validated, name)) == instance[name], name


def test_models_fill_in_defaults_and_types():
    empty = model({})
    assert empty.source == "local"
    assert empty.kubernetes == "auto"
    assert empty.xid_ignore == () and empty.disabled_collectors == ()
    assert empty.temperature_margin == 5.0 and isinstance(empty.temperature_margin, float)
    assert empty.max_processes_per_device == 64
    assert empty.kubelet_tls_verify is None and empty.proc_root is None
    assert empty.kernel_log == "auto" and derived({}).kernel_log == "auto"
    assert derived({"kernel_log": "/var/log/kern.log"}).kernel_log == "/var/log/kern.log"
    full = model({"kubernetes": False, "xid_ignore": [13, 43], "disabled_collectors": ["gpm"],
                  "hourly_price": {"NVIDIA H100*": 4.0}, "effective_threshold": 75})
    assert full.kubernetes is False
    assert full.xid_ignore == (13, 43) and full.disabled_collectors == ("gpm",)
    assert dict(full.hourly_price) == {"NVIDIA H100*": 4.0}
    assert full.effective_threshold == 75.0
