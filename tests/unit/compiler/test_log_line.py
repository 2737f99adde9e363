"""hasten's log lines show once: on stderr in a plain script, through the application's logging
once it is set up (a subprocess: pytest gives the root logger handlers of its own)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_line_is_shown_once_before_and_after_the_application_sets_up_logging():
    code = textwrap.dedent(
        """
        import logging, sys
        from hasten.compiler.report import log_line
        log_line("hasten: first")
        logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="ROOT %(message)s")
        log_line("hasten: second")
        logging.getLogger("hasten.keras").info("hasten.keras: third")
        """
    )
    err = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stderr.splitlines()
    assert err == ["hasten: first", "ROOT hasten: second", "ROOT hasten.keras: third"]
