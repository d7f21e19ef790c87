import socket

import pytest

from nemo_gym.config import ports
from nemo_gym.errors import NeMoGymConfigError
from nemo_gym.testing.stack import free_port, free_port_block


@pytest.fixture(autouse=True)
def _release():
    yield
    ports.release_all()


def test_two_reservations_never_equal():
    got = [ports.reserve_port("127.0.0.1") for _ in range(20)]
    assert len(set(got)) == 20
    assert all(10001 <= p <= 20000 for p in got)


def test_reserved_port_cannot_be_bound_by_another_socket():
    port = ports.reserve_port("127.0.0.1")
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    other.close()
    # Not even on all interfaces.
    other = socket.socket()
    with pytest.raises(OSError):
        other.bind(("0.0.0.0", port))
    other.close()


def test_reserved_socket_is_listening_and_can_be_taken():
    port = ports.reserve_port("127.0.0.1")
    assert ports.is_reserved("127.0.0.1", port)
    assert ports.reserved_socket_exists("127.0.0.1", port)
    sock = ports.take_reserved_socket("127.0.0.1", port)
    assert sock is not None
    assert not ports.is_reserved("127.0.0.1", port)
    client = socket.create_connection(("127.0.0.1", port), timeout=2)
    conn, _ = sock.accept()
    conn.close()
    client.close()
    sock.close()
    assert ports.take_reserved_socket("127.0.0.1", port) is None


def test_explicit_port_reserved_and_idempotent():
    port = free_port()
    assert ports.reserve_port("127.0.0.1", port=port) == port
    assert ports.reserve_port("127.0.0.1", port=port) == port  # already ours
    assert ("127.0.0.1", port) in ports.reserved_ports()


def test_explicit_busy_port_errors():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        with pytest.raises(NeMoGymConfigError) as info:
            ports.reserve_port("127.0.0.1", port=port)
        assert f"127.0.0.1:{port}" in str(info.value)
        assert "already in use; pick another port or stop the process using it" in str(info.value)
    finally:
        busy.close()


def test_disallowed_ports_avoided():
    low = free_port_block(10)
    allowed = low + 7
    disallowed = [p for p in range(low, low + 10) if p != allowed]
    for _ in range(3):
        port = ports.reserve_port("127.0.0.1", low=low, high=low + 9, disallowed=disallowed)
        assert port == allowed
        ports.release_all()


def test_range_exhausted():
    low = free_port_block(3)
    with pytest.raises(NeMoGymConfigError, match="range is exhausted"):
        ports.reserve_port("127.0.0.1", low=low, high=low + 2, disallowed=[low, low + 1, low + 2])


def test_range_exhausted_by_own_reservations():
    low = free_port_block(2)
    a = ports.reserve_port("127.0.0.1", low=low, high=low + 1)
    b = ports.reserve_port("127.0.0.1", low=low, high=low + 1)
    assert {a, b} == {low, low + 1}
    with pytest.raises(NeMoGymConfigError, match="range is exhausted"):
        ports.reserve_port("127.0.0.1", low=low, high=low + 1)


def test_busy_ports_in_range_are_skipped():
    low = free_port_block(3)
    holders = []
    for p in (low, low + 1):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
            s.listen(1)
            holders.append(s)
        except OSError:
            s.close()
    try:
        port = ports.reserve_port("127.0.0.1", low=low, high=low + 2)
        assert port == low + 2
    finally:
        for s in holders:
            s.close()


def test_hostname_localhost_resolves():
    port = ports.reserve_port("localhost")
    assert ports.is_reserved("localhost", port)


def test_all_interfaces():
    port = ports.reserve_port("0.0.0.0")
    sock = ports.take_reserved_socket("0.0.0.0", port)
    assert sock.getsockname()[1] == port
    sock.close()


def test_ipv6_loopback():
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback")
    port = ports.reserve_port("::1")
    assert ports.take_reserved_socket("::1", port).family == socket.AF_INET6


def test_unresolvable_host():
    with pytest.raises(NeMoGymConfigError, match="Cannot resolve host"):
        ports.reserve_port("no-such-host.invalid")


def test_release_all_frees_ports():
    port = ports.reserve_port("127.0.0.1")
    ports.release_all()
    assert ports.reserved_ports() == []
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.close()


def test_empty_range():
    with pytest.raises(NeMoGymConfigError, match="Empty port range"):
        ports.reserve_port("127.0.0.1", low=20, high=10)
