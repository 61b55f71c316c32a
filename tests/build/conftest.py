"""Build-check reporting shared by the nvcc and Triton compile tests."""
import pytest


@pytest.fixture(scope="module")
def write_table(request):
    """Write lines past pytest's output capture so a table lands in every CI log, passing or not."""

    def write(lines: list[str]) -> None:
        capman = request.config.pluginmanager.getplugin("capturemanager")
        reporter = request.config.pluginmanager.getplugin("terminalreporter")
        if capman is not None and reporter is not None:
            with capman.global_and_fixture_disabled():
                for line in lines:
                    reporter.write_line(line)
        else:
            print("\n".join(lines))

    return write
