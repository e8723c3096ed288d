"""Options: what the check derives from its validated instance, and the value checks behind the config models."""
