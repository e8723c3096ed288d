"""Which dashboards and monitors assets/ holds, and that manifest.json registers each by its title."""

import json
import re
import uuid

from .assets_support import DASHBOARD_FILES, MONITOR_FILES, REQUIRED, ROOT, _load


def test_assets_exist():
    assert {p.name for p in DASHBOARD_FILES} == set(REQUIRED)
    assert len(MONITOR_FILES) >= 10


def test_manifest_lists_every_dashboard_and_monitor():
    manifest = json.loads((ROOT / "manifest.json").read_text())["assets"]
    assert sorted(manifest["dashboards"].values()) == sorted(str(p.relative_to(ROOT)) for p in DASHBOARD_FILES)
    assert sorted(manifest["monitors"].values()) == sorted(str(p.relative_to(ROOT)) for p in MONITOR_FILES)
    for title, path in manifest["monitors"].items():
        recommended = _load(ROOT / path)
        assert recommended["title"] == title and recommended["version"] == 2
        assert "{{" not in title and recommended["description"]
    for title, path in manifest["dashboards"].items():
        assert _load(ROOT / path)["title"] == title


CLASSIFIER_PREFIXES = {"Supported OS", "Category", "Offering", "Submitted Data Type", "Queried Data Type"}


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def test_manifest_follows_the_v2_conventions():
    manifest = json.loads((ROOT / "manifest.json").read_text())
    assert manifest["manifest_version"] == "2.0.0"
    assert str(uuid.UUID(manifest["app_uuid"])) == manifest["app_uuid"]
    # Current integrations name the team that owns them next to the app's ID.
    for key in ("app_id", "owner"):
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", manifest[key]), key
    tile = manifest["tile"]
    headings = {_anchor(line.lstrip("#").strip()) for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith("## ")}
    for key in ("overview", "configuration", "support"):
        path, _, anchor = tile[key].partition("#")
        assert path == "README.md" and anchor.lower() in headings, tile[key]
    assert (ROOT / tile["changelog"]).is_file()
    assert all(tag.split("::")[0] in CLASSIFIER_PREFIXES for tag in tile["classifier_tags"])


def test_manifest_points_at_the_checks_own_files():
    integration = json.loads((ROOT / "manifest.json").read_text())["assets"]["integration"]
    for path in (integration["configuration"]["spec"], integration["metrics"]["metadata_path"],
                 integration["service_checks"]["metadata_path"]):
        assert (ROOT / path).is_file(), path
    assert integration["metrics"]["prefix"] == "gpu_monitoring."
    metadata = (ROOT / integration["metrics"]["metadata_path"]).read_text()
    assert f"\n{integration['metrics']['check']}," in metadata
    assert isinstance(integration["source_type_id"], int)
