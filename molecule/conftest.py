"""Shared by the scenarios' testinfra tests: expose each test's result to fixtures; print a failure as it happens."""

import pytest


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
    # A failure's whole message as it happens, not only in the summary at the end: a scenario stopped midway (a CI
    # limit) still shows why a test failed.
    terminal = item.config.pluginmanager.get_plugin("terminalreporter")
    if report.failed and terminal is not None:
        terminal.write_line(f"\n--- {report.nodeid} failed ({report.when}):\n{report.longreprtext}\n")
