"""The progress helper draws only for a terminal (or when forced) and counts either way."""

from __future__ import annotations

import io

import pytest

from mqstore.client.progress import Progress, track


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nothing_is_drawn_when_the_stream_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQSTORE_PROGRESS", raising=False)
    stream = io.StringIO()
    with Progress(total=10, desc="send", stream=stream) as bar:
        bar.update(4)
        bar.update(6)
    assert stream.getvalue() == "" and not bar.enabled and bar.count == 10 and bar.rate > 0


def test_a_terminal_gets_a_bar_unless_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MQSTORE_PROGRESS", raising=False)
    terminal = FakeTerminal()
    assert list(track(range(3), total=3, desc="send", stream=terminal)) == [0, 1, 2]
    assert "send" in terminal.getvalue() and "3/3" in terminal.getvalue()
    quiet = FakeTerminal()
    with Progress(total=3, stream=quiet, quiet=True) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_the_environment_forces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MQSTORE_PROGRESS", "1")
    stream = io.StringIO()
    with Progress(total=2, stream=stream) as bar:
        bar.update(2)
    assert "2/2" in stream.getvalue()
    monkeypatch.setenv("MQSTORE_PROGRESS", "0")
    assert not Progress(stream=FakeTerminal()).enabled
