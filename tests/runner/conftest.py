"""Launcher tests: every test's time is bounded, with or without pytest-timeout."""

from __future__ import annotations

import signal
import threading

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): fail a test that runs longer")


@pytest.fixture(autouse=True)
def _timeout_without_plugin(request: pytest.FixtureRequest):
    """Honour @pytest.mark.timeout with SIGALRM when pytest-timeout is not installed."""
    marker = request.node.get_closest_marker("timeout")
    if (marker is None or request.config.pluginmanager.hasplugin("timeout")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    seconds = float(marker.args[0])

    def expire(signum: int, frame: object) -> None:
        pytest.fail(f"test ran longer than its {seconds:g} s timeout", pytrace=False)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
