"""Tests run against the plugin as INSTALLED into an env that holds a real sglang wheel
(see noxfile.py); refuse to run them against the source tree."""

from helpers import _installed_plugin_path


def pytest_configure(config):
    origin = _installed_plugin_path()
    assert "site-packages" in origin, f"tests must run against the installed plugin, got {origin}"
