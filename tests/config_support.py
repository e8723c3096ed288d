"""An instance validated and derived as the check does it, without a check to construct."""

from typing import Any, Dict

from datadog_checks.base import AgentCheck

from gpu_monitoring.config.settings import CheckSettings, derive
from gpu_monitoring.config_models import InstanceConfig

MODELS = "gpu_monitoring.config_models"


def validated(instance: Dict[str, Any]) -> InstanceConfig:
    """The instance's model, its errors ConfigurationErrors worded as the Agent's base words them."""
    context = {"configured_fields": frozenset(instance)}
    return AgentCheck.load_configuration_model(MODELS, "InstanceConfig", dict(instance), context)


def parse(instance: Dict[str, Any]) -> CheckSettings:
    return derive(validated(instance))
