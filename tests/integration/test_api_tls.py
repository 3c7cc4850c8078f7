"""TLS between a triggerer and the API server: a real TLS server (uvicorn with a certificate
signed by a CA made in the test), a ``sink = api`` store flushing to it over ``https://``
with ``api_ca_bundle``, and the clients refusing a server they cannot verify: with the
system's CAs only, or with a certificate for another host name."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import uvicorn
from conftest import StoreFactory
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from localstate import Settings, StateStore
from localstate.api import create_app
from localstate.client import AsyncStateClient
from localstate.errors import ConfigError, LocalStateError

TOKEN = "tls-token-0123456789abcdef"


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def make_certificates(folder: Path, hosts: list[str]) -> tuple[Path, Path, Path]:
    """A CA (ca.pem) and a server certificate it signed for `hosts` (server.pem, its key
    server.key): what an operator's private CA gives the API server."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("localstate test CA"))
          .issuer_name(_name("localstate test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, key_cert_sign=True, crl_sign=True,
                                       encipher_only=False, decipher_only=False),
                         critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


@pytest_asyncio.fixture
async def tls_server(open_store: StoreFactory, tmp_path: Path
                     ) -> AsyncIterator[tuple[int, Path]]:
    """The API over a serving store, on https://localhost:<port> (its certificate names
    localhost only), and the CA bundle that verifies it."""
    ca, cert, key = make_certificates(tmp_path, ["localhost"])
    store = await open_store(triggerer_id="tls-api")
    tokens = Settings.resolve({"api_tokens": f"{TOKEN}:read-write:*"}).api_tokens
    config = uvicorn.Config(create_app(store.settings, local=store, tokens=tokens),
                            host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                            ssl_certfile=str(cert), ssl_keyfile=str(key))
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(500):
        if server.started or task.done():
            break
        await asyncio.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield server.servers[0].sockets[0].getsockname()[1], ca
    finally:
        server.should_exit = True
        await task


async def test_a_triggerer_flushes_over_https_with_the_ca_bundle(
        tls_server: tuple[int, Path], tmp_path: Path, central_url: str) -> None:
    port, ca = tls_server
    triggerer = await StateStore.open(
        triggerer_id="tls-triggerer", cache_dir=tmp_path / "cache", sink="api",
        api_url=f"https://localhost:{port}", api_token=TOKEN, api_ca_bundle=str(ca))
    try:
        await triggerer.set("trigger:tls", "watermark", 42, durability="central")
    finally:
        await triggerer.close()
    async with AsyncStateClient(f"https://localhost:{port}", token=TOKEN,
                                ca_bundle=ca) as client:
        assert await client.get("trigger:tls", "watermark") == 42


async def test_a_server_the_client_cannot_verify_is_refused(
        tls_server: tuple[int, Path]) -> None:
    port, ca = tls_server
    # the system's CAs do not know the private CA
    async with AsyncStateClient(f"https://localhost:{port}", token=TOKEN) as client:
        with pytest.raises(LocalStateError, match=r"CERTIFICATE_VERIFY_FAILED.*set api_ca_bundle"):
            await client.get("trigger:tls", "watermark")
    # the certificate names localhost, not 127.0.0.1
    async with AsyncStateClient(f"https://127.0.0.1:{port}", token=TOKEN,
                                ca_bundle=ca) as client:
        with pytest.raises(LocalStateError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get("trigger:tls", "watermark")


def test_an_unreadable_ca_bundle_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"api_ca_bundle .* is not a readable PEM file"):
        AsyncStateClient("https://localhost:1", ca_bundle=tmp_path / "missing.pem")
