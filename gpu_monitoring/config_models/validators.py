"""Per-option transformers the generated models call for every option an instance sets."""

from . import defaults


def _null_is_default(name: str):
    """An option left empty in YAML (`sidecar_socket:`) means its default, as config.parse reads it;
    the models would otherwise hand the check None where it uses the value."""
    default = getattr(defaults, name)

    def validate(value, **kwargs):
        return default() if value is None else value

    return validate


for _name in dir(defaults):
    if _name.startswith("instance_"):
        globals()[_name] = _null_is_default(_name)
