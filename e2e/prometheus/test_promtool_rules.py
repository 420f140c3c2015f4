"""promtool over the shipped rules file: it parses, and the unit tests in alerts_test.yaml pass
and cover every alert both firing and silent."""

import pathlib
import shutil
import subprocess

import yaml

HERE = pathlib.Path(__file__).resolve().parent
RULES_FILE = HERE.parents[1] / "charts" / "quiver-operator" / "alerts" / "quiver-alerts.rules.yaml"
UNIT_TESTS = HERE / "alerts_test.yaml"


def promtool(*args):
    binary = shutil.which("promtool")
    assert binary, "promtool missing: apt-get install prometheus"
    return subprocess.run([binary, *args], check=False, capture_output=True, text=True, cwd=HERE)


def shipped_alerts():
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"]}


def test_promtool_check_rules_accepts_the_shipped_rules():
    result = promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(shipped_alerts())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_unit_tests_cover_every_alert_firing_and_silent():
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    assert tests["rule_files"] == ["../../charts/quiver-operator/alerts/quiver-alerts.rules.yaml"]
    fires, silent = set(), set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    assert fires == shipped_alerts()
    assert silent == shipped_alerts()


def test_promtool_unit_tests_catch_a_wrong_expectation(tmp_path):
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    tests["rule_files"] = [str(RULES_FILE)]
    first_firing = next(c for c in tests["tests"][0]["alert_rule_test"] if c["exp_alerts"])
    first_firing["exp_alerts"] = []
    broken = tmp_path / "broken_test.yaml"
    broken.write_text(yaml.safe_dump(tests))
    result = promtool("test", "rules", str(broken))
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr
