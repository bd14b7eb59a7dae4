"""docs/reference/ agrees with the code (tests/support/reference.py; ``make reference`` regenerates it), and
the check itself catches a key, a metric, an option or an alert the code does not describe."""

from __future__ import annotations

import pytest
from prometheus_client import Counter

from providers.config_values import Flag
from server import cli, config, metrics
from tests.support import reference


@pytest.mark.parametrize("page", list(reference.PAGES))
def test_the_reference_page_matches_the_code(page: str) -> None:
    try:
        text = reference.PAGES[page]()
    except reference.Undocumented as err:
        pytest.fail("the code does not describe everything docs/reference/ lists:\n" + "\n".join(err.gaps))
    changed = reference.differences(page, text)
    if changed:
        pytest.fail(
            f"docs/reference/{page} does not match the code; run `{reference.COMMAND}` and commit it. "
            "Page (-) against code (+):\n" + "\n".join(changed)
        )


# ---------------------------------------------------------------------------- the check catches gaps


class _WithAKeyOfNoMeaning(config.ServerConfig):
    surprise: Flag = False


def test_a_config_key_without_a_description_is_named_with_where_to_write_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "ServerConfig", _WithAKeyOfNoMeaning)
    with pytest.raises(reference.Undocumented) as found:
        reference.config_page()
    assert found.value.gaps == (
        "config key surprise has no description: write a docstring under _WithAKeyOfNoMeaning.surprise in "
        "tests/docs/test_reference.py, then run `make reference`",
    )


class _WithAKeyDescribed(config.ServerConfig):
    surprise: Flag = False
    """A key the page does not have yet."""


def test_a_described_key_missing_from_the_page_is_a_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "ServerConfig", _WithAKeyDescribed)
    changed = reference.differences("config.md", reference.config_page())
    assert changed == ["+| `surprise` | true or false | `false` | A key the page does not have yet. |"]


class _MetricsWithASilentOne(metrics.Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.surprise = Counter(metrics.PREFIX + "surprises", "", registry=self.registry)


def test_a_metric_without_help_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "Metrics", _MetricsWithASilentOne)
    with pytest.raises(reference.Undocumented) as found:
        reference.metrics_page()
    assert found.value.gaps == (
        "metric ca_externalgrpc_surprises_total has no help text: give it one where it is declared "
        "(tests/docs/test_reference.py), then run `make reference`",
    )


def test_an_option_without_help_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    build = cli.build_parser

    def with_a_silent_option():  # type: ignore[no-untyped-def]
        parser = build()
        parser.add_argument("--surprise")
        return parser

    monkeypatch.setattr(cli, "build_parser", with_a_silent_option)
    with pytest.raises(reference.Undocumented) as found:
        reference.cli_page()
    assert found.value.gaps == (
        "option `--surprise` of `ca-externalgrpc` has no help: give it one in tests/docs/test_reference.py, "
        "then run `make reference`",
    )


def test_an_alert_without_a_runbook_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rules = tmp_path / "prometheusrule.yaml"
    text = reference.ALERT_RULES.read_text()
    rules.write_text(text.replace("            runbook: >-\n", "            unused: >-\n", 1))
    monkeypatch.setattr(reference, "ALERT_RULES", rules)
    monkeypatch.setattr(reference, "REPO", tmp_path)
    first = reference.alerts()[0].name
    with pytest.raises(reference.Undocumented) as found:
        reference.alerts_page()
    assert found.value.gaps == (
        f"alert {first} in prometheusrule.yaml has no annotations.runbook (what to do): add it, then run "
        "`make reference`",
    )
