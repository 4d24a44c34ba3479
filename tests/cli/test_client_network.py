"""`RMQ_TLS` / `RMQ_TLS_CA` (cli/client_network.py): which network the CLI's clients get."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from cli.client_network import network_from_env
from cli.local.certificates import ensure_local_tls
from common.remoting.network import TCP
from common.tls import TlsConfigError, TlsNetwork


def test_plain_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RMQ_TLS", raising=False)
    assert network_from_env() is None
    monkeypatch.setenv("RMQ_TLS", "0")
    assert network_from_env() is None


def test_tls_with_the_given_ca(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = ensure_local_tls(tmp_path).ca_cert
    monkeypatch.setenv("RMQ_TLS", "true")
    monkeypatch.setenv("RMQ_TLS_CA", str(ca))
    net = network_from_env()
    assert isinstance(net, TlsNetwork) and net.inner is TCP
    assert net.context.verify_mode is ssl.CERT_REQUIRED and net.context.check_hostname
    # the CA is loaded (besides nothing else: no system roots when a CA file is given)
    assert len(net.context.get_ca_certs()) == 1


def test_the_default_data_dirs_ca_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    ensure_local_tls(tmp_path / ".rmq")
    monkeypatch.setenv("RMQ_TLS", "1")
    monkeypatch.delenv("RMQ_TLS_CA", raising=False)
    net = network_from_env()
    assert isinstance(net, TlsNetwork)
    [ca] = net.context.get_ca_certs()
    assert "trio-rmq local CA" in str(ca["subject"])


def test_a_missing_ca_file_is_one_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RMQ_TLS", "1")
    monkeypatch.setenv("RMQ_TLS_CA", str(tmp_path / "nope.pem"))
    with pytest.raises(TlsConfigError, match="nope.pem.*No such file"):
        network_from_env()
