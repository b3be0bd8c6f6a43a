"""A fixture helper for tests that call the plugin's `register()` themselves: start from an
uninstalled plugin in a chosen environment, and leave the process as it was (installed again if it was)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

PLUGIN_VARIABLES = ("SECURESD_VLLM", "SECURESD_VLLM_DEFAULT", "VLLM_USE_V2_MODEL_RUNNER")


@contextmanager
def plugin_environment(**variables: str) -> Iterator[None]:
    """Uninstall the plugin, set exactly `variables` among PLUGIN_VARIABLES (the rest unset), and
    restore both the environment and the plugin's previous state on exit."""
    from hf_securesd import vllm as plugin

    installed_before = bool(plugin._undo)
    saved = {name: os.environ.get(name) for name in PLUGIN_VARIABLES}
    plugin.uninstall(refuse=False)
    for name in PLUGIN_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(variables)
    try:
        yield
    finally:
        plugin.uninstall(refuse=False)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if installed_before:
            plugin.register()
