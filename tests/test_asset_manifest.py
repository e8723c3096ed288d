"""Which dashboards and monitors assets/ holds, and that manifest.json registers each by its title."""

import json

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
