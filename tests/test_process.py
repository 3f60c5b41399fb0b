"""What a run's driver keeps for itself while Ray lives in it (archsearch/execute/process.py):
SIGTERM and SIGHUP end it as Ctrl-C does, with their own exit status, and native code's lines on
file descriptor 2 go to the run's log while Python's stderr stays on the terminal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from archsearch.execute.process import exit_code, interrupt_on_termination, signals_kept


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_terminating_signal_keeps_its_exit_status_even_when_reraised_plain(signum, code):
    """DuckDB turns an interrupt raised inside a query into its own, which reaches the command as a
    plain KeyboardInterrupt: the status is still the signal's (it read 130 after a SIGHUP)."""
    before = signal.getsignal(signum)
    with interrupt_on_termination():
        with pytest.raises(KeyboardInterrupt) as caught:
            try:
                os.kill(os.getpid(), signum)
                time.sleep(5)
            except KeyboardInterrupt:
                raise KeyboardInterrupt from None
    assert exit_code(caught.value) == code
    assert signal.getsignal(signum) == before  # put back as it was


def test_handlers_that_ray_replaces_are_put_back():
    def ray_like(signum, frame):  # what a library's own handler would do
        raise SystemExit(99)

    before = signal.getsignal(signal.SIGTERM)
    with signals_kept():
        signal.signal(signal.SIGTERM, ray_like)
    assert signal.getsignal(signal.SIGTERM) is before


def test_native_lines_go_to_the_log_and_python_lines_to_the_terminal(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from archsearch.execute.process import native_output_to
        with native_output_to(Path({str(tmp_path / 'run.log')!r})):
            os.write(2, b"gcs_client.cc:210: native line\\n")
            print("progress line", file=sys.stderr, flush=True)
        print("after", file=sys.stderr, flush=True)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["progress line", "after"]
    assert "gcs_client.cc:210: native line" in (tmp_path / "run.log").read_text()
