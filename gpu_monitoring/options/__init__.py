"""What each option accepts: its kind of value, choices and bounds, and the options the spec lists.

The bottom of configuration: the config models validate by these rules, the sidecar checks its flags
by them without the Agent's base or the models, and what the check derives (`config.derived`) reads
the validated models."""
