"""`python -m gpu_monitoring.cli`: the same as the `gpu-monitoring` command."""

import sys

from gpu_monitoring.cli.main import main

sys.exit(main())
