"""The smoke run of ``make bench-kube`` (tests/bench/kube_features.py): 40 kubelet-shaped Nodes, every
feature set, a two-second window. It checks that each figure is measured and each server did its work
(every Ready group's template learned, the joining node's template learned after it turned Ready),
never how large or fast: benchmark figures decide no test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import kube_features


def test_the_kubernetes_features_benchmark_measures_every_feature_set(tmp_path: Path) -> None:
    args = kube_features.parse_args(
        ["--nodes", "40", "--pools", "10", "--window", "2", "--settle", "0.5", "--out", str(tmp_path)]
    )
    results = kube_features.run(args)
    size = results["nodes_40"]
    assert size["nodes"] == 40 and size["groups"] == 10 and size["groups_at_zero"] == 1
    assert size["node_json_bytes"] > 10_000  # kubelet-shaped: images, conditions, managed fields
    servers = size["runs"]["this"]["servers"]
    assert list(servers) == list(kube_features.FEATURE_SETS)
    for name, server in servers.items():
        learns = "learned_templates" in kube_features.FEATURE_SETS[name]
        assert server["rss_mib"] > 0 and server["peak_rss_mib"] >= server["rss_mib"], name
        assert server["threads"] > 0 and server["startup_s"] > 0 and server["idle_millicores"] >= 0, name
        assert (server["templates_learned_s"] is not None) is learns, name
        assert (server["learn_after_ready_s"] is not None) is learns, name
    over_none = size["runs"]["this"]["over_none"]
    assert set(over_none) == set(kube_features.FEATURE_SETS) - {"none"}
    assert over_none["all four"]["rss_mib"] == pytest.approx(
        servers["all four"]["rss_mib"] - servers["none"]["rss_mib"], abs=0.11
    )
    table = kube_features.markdown(results)
    assert "| all four |" in table and (tmp_path / "bench-kube-results.json").is_file()
    assert "### RSS without features and with all four" in table and "| 40 | 0 | this | " in table
