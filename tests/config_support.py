"""An instance validated and derived as the check does it, without a check to construct."""

from typing import Any, Dict

from datadog_checks.base import AgentCheck

from gpu_monitoring.config.derived import Derived, derive
from gpu_monitoring.config_models import InstanceConfig, SharedConfig

MODELS = "gpu_monitoring.config_models"


def validated(instance: Dict[str, Any]) -> InstanceConfig:
    """The instance's model, its errors ConfigurationErrors worded as the Agent's base words them."""
    context = {"configured_fields": frozenset(instance)}
    return AgentCheck.load_configuration_model(MODELS, "InstanceConfig", dict(instance), context)


def validated_shared(init_config: Dict[str, Any]) -> SharedConfig:
    """init_config's model, validated as the check validates it."""
    context = {"configured_fields": frozenset(init_config)}
    return AgentCheck.load_configuration_model(MODELS, "SharedConfig", dict(init_config), context)


def derived(instance: Dict[str, Any]) -> Derived:
    return derive(validated(instance))
