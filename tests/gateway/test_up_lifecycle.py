"""``mqstore up`` as a newcomer uses it: Ctrl-C (SIGINT) stops every service cleanly, a second start
reuses the data, and the welcome text names the gateway. Every service's /metrics answers."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

from mqstore.v1 import common_pb2, gateway_pb2, query_pb2
from tests.gateway.system_process import start_up


def test_ctrl_c_stops_cleanly_and_a_second_start_reuses_the_data(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = start_up(store)
    try:
        assert f"Gateway: {first.gateway}" in first.logs() and "mqstore send" in first.logs()
        sent = first.stub.Send(gateway_pb2.SendRequest(message=common_pb2.Message(topic="kept", body=b"survives")),
                               timeout=10)
        scraped = urllib.request.urlopen(first.metrics_url("gateway"), timeout=10).read().decode()
        assert "mqstore_gateway_sent_messages_total 1.0" in scraped
        for service in ("commitlog", "indexer", "query"):
            assert urllib.request.urlopen(first.metrics_url(service), timeout=10).status == 200
        first.channel.close()
        first.proc.send_signal(signal.SIGINT)  # what Ctrl-C delivers (the children have their own sessions)
        assert first.proc.wait(90) == 0, first.logs()[-3000:]
    finally:
        first.kill_all()
    logs = first.logs()
    assert [name for name in ("gateway", "query", "indexer", "commitlog") if f"{name} stopped (exit code 0)" in logs] \
        == ["gateway", "query", "indexer", "commitlog"]
    assert logs.index("gateway stopped") < logs.index("query stopped") < logs.index("commitlog stopped")
    assert not (store / "abort").exists() and not (store / "indexer" / "abort").exists()

    second = start_up(store)
    try:
        pulled = second.stub.Pull(query_pb2.PullMessageRequest(topic="kept", queue_id=sent.queue_id,
                                                               queue_offset=sent.queue_offset), timeout=10)
        assert [m.body for m in pulled.messages] == [b"survives"]
        assert pulled.messages[0].uniq_key == sent.msg_id
        assert second.stop() == 0
    finally:
        second.kill_all()
