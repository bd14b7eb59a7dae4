"""Which serving engine runs: ``serving.engine: auto`` (the default) takes the native one when its
extension loads and grpcio otherwise, saying so in one log line; ``native`` asked for explicitly
without the extension fails at start with the fix. The extension's absence is played by a ``None``
entry in ``sys.modules`` (an import of it raises ImportError); tests/install runs the real thing, a
virtualenv without it."""

from __future__ import annotations

import logging
import sys

import pytest

from providers.config_errors import ConfigError
from server import app
from server.config import parse

CONFIG = {
    "listen": "127.0.0.1:0",
    "http_listen": None,
    "backends": [{"type": "scaleway", "scaleway": {"cluster_id": "c", "secret_key": "s"}}],
}


@pytest.fixture
def no_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ca_externalgrpc_native", None)


def test_the_default_engine_is_auto() -> None:
    assert parse(CONFIG, env={}).serving.engine == "auto"


def test_auto_takes_the_native_engine_when_its_extension_loads(caplog: pytest.LogCaptureFixture) -> None:
    # make install builds the extension into the virtualenv the tests run in.
    with caplog.at_level(logging.DEBUG, logger="server.app"):
        assert app.choose_engine("auto") == "native"
    assert not caplog.records


@pytest.mark.usefixtures("no_extension")
def test_auto_without_the_extension_serves_on_grpcio_and_says_why_and_how_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="server.app"):
        assert app.choose_engine("auto") == "grpcio"
    (record,) = caplog.records
    line = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in line
    assert line.startswith("serving on the grpcio engine (serving.engine: auto): ")  # which engine
    assert "the native serving engine is not installed" in line  # why
    assert "pip install 'ca-externalgrpc-server[native]'" in line and "make install" in line  # how to get it


@pytest.mark.usefixtures("no_extension")
def test_an_engine_named_explicitly_is_kept_whether_or_not_the_extension_is_there() -> None:
    assert app.choose_engine("grpcio") == "grpcio"
    assert app.choose_engine("native") == "native"


@pytest.mark.usefixtures("no_extension")
def test_native_asked_for_without_the_extension_fails_at_start_naming_the_key_and_the_fix() -> None:
    config = parse({**CONFIG, "serving": {"engine": "native"}}, env={})
    with pytest.raises(ConfigError) as caught:
        app.start(config, backends=[], start_backends=False)
    assert caught.value.keys == ("serving.engine",)
    text = str(caught.value)
    assert "\n" not in text
    assert "not installed" in text and "pip install 'ca-externalgrpc-server[native]'" in text
    assert "serving.engine: auto" in text
