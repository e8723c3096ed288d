"""What the check derives from its validated instance (config_models), and where the host's /proc is."""
