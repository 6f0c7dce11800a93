"""A throwaway PostgreSQL that speaks TLS only, with a throwaway CA, for TLS tests.

``openssl`` makes a CA, a server certificate for ``localhost`` and
``127.0.0.1`` (not ``127.0.0.2``, which the server also listens on: a host
name mismatch for ``verify-full``), a client certificate whose key is
encrypted with a passphrase (``sslpassword``), and a second CA that signed
nothing. The server runs PostgreSQL's own ``initdb``/``pg_ctl`` as in
support/replica.py (as the ``postgres`` system user when the tests run as
root) on a loopback port of its own: TCP clients must use TLS and a password
(scram-sha-256), plaintext TCP is rejected, the Unix socket is trusted for
setup. Everything lives in one temporary directory, removed on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlencode

import asyncpg

from support.replica import free_port, postgres_bin_dir

#: The address in the server certificate and the one that is not.
CERTIFIED_HOST = "127.0.0.1"
UNCERTIFIED_HOST = "127.0.0.2"
USER = "awa_tls"
#: Characters that must be percent-encoded in a URL, so that both spellings
#: of the secret are checked for in output.
PASSWORD = "tls-pw@42/x"
KEY_PASSPHRASE = "key-pass#7"
DATABASE = "awa"

SERVER_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=serverAuth\n"
    f"subjectAltName=DNS:localhost,IP:{CERTIFIED_HOST}\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid\n"
)
CLIENT_EXTENSIONS = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=clientAuth\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid\n"
)
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


def missing_tools() -> str | None:
    """Why the TLS tests cannot run here, or None."""
    if shutil.which("openssl") is None:
        return "the openssl command is not installed"
    if postgres_bin_dir() is None:
        return "no PostgreSQL server binaries (initdb) installed"
    return None


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, text=True, timeout=60, cwd=cwd)


def _make_ca(certs: Path, name: str) -> Path:
    _openssl(
        "req", "-x509", *EC_KEY, "-nodes", "-days", "2", "-subj", f"/CN=awa_trio test {name}",
        "-keyout", f"{name}.key", "-out", f"{name}.crt",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=certs,
    )
    return certs / f"{name}.crt"


def _sign(certs: Path, name: str, extensions: str, *, ca: str = "ca") -> Path:
    (certs / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=certs,
    )
    return certs / f"{name}.crt"


@dataclasses.dataclass
class Certificates:
    ca: Path
    #: A CA that signed nothing the server presents.
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    #: Encrypted with KEY_PASSPHRASE.
    client_key: Path


def make_certificates(certs: Path) -> Certificates:
    ca = _make_ca(certs, "ca")
    other_ca = _make_ca(certs, "other_ca")
    _openssl("req", "-new", *EC_KEY, "-nodes", "-subj", "/CN=localhost",
             "-keyout", "server.key", "-out", "server.csr", cwd=certs)
    server_cert = _sign(certs, "server", SERVER_EXTENSIONS)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-aes256",
             "-pass", f"pass:{KEY_PASSPHRASE}", "-out", "client.key", cwd=certs)
    _openssl("req", "-new", "-key", "client.key", "-passin", f"pass:{KEY_PASSPHRASE}",
             "-subj", f"/CN={USER}", "-out", "client.csr", cwd=certs)
    client_cert = _sign(certs, "client", CLIENT_EXTENSIONS)
    return Certificates(
        ca=ca, other_ca=other_ca, server_cert=server_cert, server_key=certs / "server.key",
        client_cert=client_cert, client_key=certs / "client.key",
    )


class TlsServer:
    """One TLS-only server; :meth:`url` builds client URLs for it."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="awa_trio_tls_"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        self.server_user = pwd.getpwnam("postgres") if self.as_root else None
        if self.server_user:
            os.chown(self.root, self.server_user.pw_uid, self.server_user.pw_gid)
        self.certs: Certificates | None = None

    def run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(self.bin_dir / program), *args]
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=120, cwd=self.root)

    def create(self) -> None:
        certs_dir = self.root / "certs"
        certs_dir.mkdir(mode=0o755)
        self.certs = make_certificates(certs_dir)
        # PostgreSQL refuses a key others can read; it must be the server's own.
        os.chmod(self.certs.server_key, 0o600)
        if self.server_user:
            os.chown(self.certs.server_key, self.server_user.pw_uid, self.server_user.pw_gid)
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "fsync = off\nsynchronous_commit = off\n"
                "ssl = on\n"
                f"ssl_cert_file = '{self.certs.server_cert}'\n"
                f"ssl_key_file = '{self.certs.server_key}'\n"
                # Clients may present a certificate; one that is presented must be ours.
                f"ssl_ca_file = '{self.certs.ca}'\n"
                "password_encryption = 'scram-sha-256'\n"
            )
        (self.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            f"hostssl all {USER} 127.0.0.0/8 scram-sha-256\n"
            "hostnossl all all 127.0.0.0/8 reject\n"
        )
        self.run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
            "-o", f"-p {self.port} -c listen_addresses='{CERTIFIED_HOST},{UNCERTIFIED_HOST}' "
            f"-c unix_socket_directories='{self.root}'",
            "start",
        )
        asyncio.run(self._create_role_and_database())

    async def _create_role_and_database(self) -> None:
        conn = await asyncpg.connect(self.admin_url("postgres"))
        try:
            # Superuser: awa-pg's migrator reads catalogs (pg_toast) an owner may not.
            await conn.execute(f"CREATE ROLE {USER} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
            await conn.execute(f"CREATE DATABASE {DATABASE} OWNER {USER}")
        finally:
            await conn.close()

    def admin_url(self, database: str = DATABASE) -> str:
        """Superuser over the Unix socket (trusted, no TLS), for setup and inspection."""
        return f"postgresql://postgres@/{database}?host={self.root}&port={self.port}"

    def url(self, host: str = CERTIFIED_HOST, *, with_password: bool = True, **params: str) -> str:
        """A client URL; ``params`` become the query string (sslmode=...)."""
        userinfo = f"{USER}:{quote(PASSWORD, safe='')}" if with_password else USER
        query = f"?{urlencode(params, safe='/')}" if params else ""
        return f"postgresql://{userinfo}@{host}:{self.port}/{DATABASE}{query}"

    def server_log(self) -> str:
        try:
            return (self.root / "server.log").read_text()
        except OSError:
            return ""

    def close(self) -> None:
        # A start that failed half-way may still have left a postmaster running.
        if (self.data / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def tls_server() -> Iterator[TlsServer]:
    """A running TLS-only server; stopped and removed however the block ends."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) installed")
    server = TlsServer(bin_dir)
    try:
        server.create()
        yield server
    finally:
        server.close()
