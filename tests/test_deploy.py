"""deploy/: the Prometheus scrape config and alert rules (checked and unit-tested by promtool) and the Grafana
dashboard, whose every metric and label must be one a worker exposes.

promtool is found as $PROMTOOL, on PATH, or where `make promtool` (part of `make test`) puts it; a missing
promtool fails these tests, it never skips them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rollout_stream.config import WorkerConfig
from rollout_stream.core.dead_letter_limit import DeadLetterWindow
from rollout_stream.worker import Snapshot, WorkerStats
from rollout_stream.worker.metrics import LoopMetrics, WorkerCollector

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "rollout-stream.json"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

# What the issue asks the rules to watch, by alert name.
REQUIRED_ALERTS = {
    "RolloutStreamDeadLetterRate",  # dead-letter rate by reason
    "RolloutStreamLagGrowing",
    "RolloutStreamNoCommit",  # no commit for N intervals
    "RolloutStreamNotReady",
    "RolloutStreamOpenWindowBytesNearCap",
}
# Labels that come from the scrape or the histogram, not from stream/worker/metrics.py's label names.
TARGET_LABELS = {"job", "instance", "le"}


def promtool() -> str:
    cache = Path(os.environ.get("ROLLOUT_STREAM_CACHE", Path.home() / ".cache" / "rollout-stream"))
    for candidate in (os.environ.get("PROMTOOL"), shutil.which("promtool"), str(cache / "bin" / "promtool")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("promtool not found ($PROMTOOL, PATH, or ~/.cache/rollout-stream/bin): run `make promtool`, "
                "which unpacks it from Debian's prometheus package", pytrace=False)


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120)


def exposed() -> dict[str, set[str]]:
    """Every sample name a worker's /metrics serves, with its label names (rendered by
    stream/worker/metrics.py from a worker-shaped object that has seen a dead-letter and a lagging
    partition, and by stream/worker/progress.py's prompt metrics from a prompt source's fold)."""
    stats = WorkerStats(records_in=10, dead_lettered=Counter({"decode_error": 1}),
                        dead_letter_groups=Counter({"decode_error": 1}))
    config = WorkerConfig()
    snapshot = Snapshot(stats, open_windows=1, open_bytes=100, closed_groups=0, ready=True, lag={0: 5},
                        dead_letter_ratio=DeadLetterWindow(config.dead_letter_limit).ratio,
                        last_tick=time.monotonic())
    worker = SimpleNamespace(config=config, snapshot=snapshot)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(worker))
    LoopMetrics(registry, config.delivery)
    registry.register(_PromptSource())
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


class _PromptSource:
    """The prompt metrics of a worker that folds an admission log with a prompt source in it."""

    def collect(self) -> list:
        from rollout_stream.worker.progress import prompt_metrics
        from tests.core.prompt_world import World

        w = World(prompts=2, groups_per_batch=1)
        w.drain()
        return prompt_metrics(w.fold)


def progress_exposed() -> dict[str, set[str]]:
    """The trainer and producer series a worker serves from the progress topic (stream/worker/progress.py),
    rendered from one trainer group's and one producer's records."""
    from rollout_stream.codec.progress import ProducerProgress, TrainerProgress
    from rollout_stream.worker.progress import ProgressCollector

    now = int(time.time() * 1000)
    trainer = TrainerProgress(group_id="t", weight_version=3, groups_per_batch=2, max_weight_staleness=1,
                              batch=2, batch_version=3, consumed_groups=6, skipped_stale_groups=1,
                              lag_counts={0: 4}, consumed_through={}, updated_ms=now, stale_rollouts=2,
                              stale_tokens=9)
    producer = ProducerProgress(producer_id="p", trainer_group="t", topic="rollouts", newest_weight_version=3,
                                admitted=7, outstanding=1, waiting=False, wait_s=0.5, updated_ms=now)
    collector = ProgressCollector.__new__(ProgressCollector)
    collector.stale_after_s = 60.0
    collector.board = SimpleNamespace(producers=lambda: [producer], trainers=lambda: [trainer])
    collector._admission = lambda: iter(())  # the admission log's series: `exposed` has the prompt ones
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


EXPOSED = exposed()
PROGRESS = progress_exposed()  # served by a worker too; the dashboard shows some of them
METRIC = re.compile(r"\brollout_stream_[a-z0-9_]+")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")


def check_expression(expr: str) -> list[str]:
    """Problems with one PromQL expression: metrics the worker does not expose, grouping labels none of them
    carries."""
    metrics = set(METRIC.findall(expr))
    served = {**EXPOSED, **PROGRESS}
    problems = [f"{m} is not exposed by stream/worker/metrics.py" for m in sorted(metrics - set(served))]
    labels = TARGET_LABELS.union(*(served.get(m, set()) for m in metrics))
    for group in GROUPING.findall(expr):
        for label in filter(None, (part.strip() for part in group.split(","))):
            if label not in labels:
                problems.append(f"label {label!r} is on none of {sorted(metrics)}")
    return problems


def rules() -> list[dict]:
    return [r for g in yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"] for r in g["rules"]]


# ---- promtool -----------------------------------------------------------------------------------------
def test_promtool_accepts_the_scrape_config_and_the_rule_files_it_names():
    result = run_promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: prometheus.yml is valid prometheus config file syntax" in result.stdout
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_promtool_accepts_the_alert_rules():
    result = run_promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_every_alert_passes_its_promtool_unit_tests():
    result = run_promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_unit_tests_make_every_alert_fire_and_keep_every_alert_quiet():
    cases = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    fired, quiet = set(), set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {r["alert"] for r in rules()}
    assert REQUIRED_ALERTS <= names
    assert fired == names, names - fired
    assert quiet == names, names - quiet


# ---- the rules ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_every_rule_reads_metrics_the_worker_exposes_and_says_what_to_do(rule):
    assert check_expression(rule["expr"]) == []
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert "for" in rule, "a single scrape never pages"


def test_the_unit_tests_feed_series_the_worker_exposes():
    cases = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())["tests"]
    for case in cases:
        for series in case["input_series"]:
            name, _, labels = series["series"].partition("{")
            assert name == "up" or name in EXPOSED, name
            label_names = set(re.findall(r"(\w+)=", labels))
            assert label_names - TARGET_LABELS <= EXPOSED.get(name, set()), series["series"]


def test_the_job_the_rules_select_is_the_job_the_config_scrapes():
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    selected = {m for r in rules() for m in re.findall(r'job="([^"]+)"', r["expr"])}
    assert selected and selected <= jobs


# ---- the dashboard ------------------------------------------------------------------------------------
DASH = json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in DASH["panels"] if p["type"] != "row"]


def test_the_dashboard_queries_only_metrics_and_labels_the_worker_exposes():
    problems = {}
    for panel in panels():
        for target in panel["targets"]:
            if found := check_expression(target["expr"]):
                problems[f"{panel['title']}/{target['refId']}"] = found
    assert problems == {}
    used = {m for p in panels() for t in p["targets"] for m in METRIC.findall(t["expr"])}
    # Every counter and gauge family of the worker is on the dashboard (histograms through _bucket).
    families = {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in EXPOSED}
    families.discard("rollout_stream_info")  # the settings, as labels: the variables' source
    shown = {re.sub(r"_(total|bucket|count|sum)$", "", m) for m in used}
    assert families - shown == set()


def test_the_dashboard_is_well_formed_for_grafana():
    assert DASH["uid"] == "rollout-stream" and DASH["title"]
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in DASH["templating"]["list"]}
    assert variables == {"datasource", "job", "instance"}
    source_uid = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]["uid"]
    datasource = next(v for v in DASH["templating"]["list"] if v["name"] == "datasource")
    assert datasource["current"]["value"] == source_uid  # the provisioned source is the default
    occupied: set[tuple[int, int]] = set()
    for panel in DASH["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                 for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["description"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            for variable in re.findall(r"\$(\w+)", target["expr"]):
                assert variable in variables or variable.startswith("__"), (panel["title"], variable)
            assert 'job=~"$job",instance=~"$instance"' in target["expr"], panel["title"]
