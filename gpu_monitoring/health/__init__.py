"""Judging: a GPU's and the node's health, held verdicts, XIDs, service checks."""
