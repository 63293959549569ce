"""Tests run against the plugin as INSTALLED into an env that holds a real sglang wheel
(see noxfile.py); refuse to run them against the source tree."""

from helpers import _installed_plugin_path


def pytest_configure(config):
    import pathlib

    origin = pathlib.Path(_installed_plugin_path()).resolve()
    repo = pathlib.Path(__file__).resolve().parent.parent
    assert origin.parent != repo / "sglang_swa_plugin", f"tests must run against the installed plugin, not {origin}"
