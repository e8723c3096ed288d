"""Options: the derived settings and the value checks behind the config models."""
