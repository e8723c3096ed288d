"""Run Datadog's own offline manifest (v2) validators on manifest.json.

Usage: validate_manifest.py ROOT, where ROOT/gpu_monitoring is this repository (the layout the
tooling expects). The schema validator is left out: it asks Datadog's API.
"""

import json
import sys
from pathlib import Path

from datadog_checks.dev.tooling.constants import set_root
from datadog_checks.dev.tooling.datastructures import JSONDict
from datadog_checks.dev.tooling.manifest_validator.v2.validator import get_v2_validators

CHECK = "gpu_monitoring"


def main(root: str) -> int:
    set_root(root)
    manifest = JSONDict(json.loads((Path(root) / CHECK / "manifest.json").read_text()))
    failed = False
    for validator in get_v2_validators(None, is_extras=True, is_marketplace=False, ignore_schema=True):
        validator.validate(CHECK, manifest, False)
        result = validator.result
        failed |= result.failed
        print(f"{type(validator).__name__}: {'FAILED' if result.failed else 'ok'}")
        for kind in ("failure", "warning"):
            for message in result.messages[kind]:
                print(f"  {kind}: {message.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
