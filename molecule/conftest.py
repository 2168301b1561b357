"""Shared by the scenarios' testinfra tests: expose each test's result to fixtures."""

import pytest


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


_CONFIG = []


def pytest_configure(config):
    _CONFIG.append(config)


def pytest_runtest_logreport(report):
    """A failure's whole message as it happens, not only in the summary at the end: a scenario stopped midway (a CI
    limit) still shows why a test failed."""
    terminal = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
    if report.failed and terminal is not None:
        terminal.write_line(f"\n--- {report.nodeid} failed ({report.when}):\n{report.longreprtext}\n")
