"""A stand-in Kubernetes API server over TLS, for the submit function's tests.

No cluster can run here, so this serves only what the function calls: RayJobs (create, get, list by label,
delete) and Karpenter NodeClaims (list by label, delete), keeping objects in memory. It is a mock of the
API server, not of the code under test: manifests it receives are checked against the real RayJob CRD schema
by the tests, and the TLS and bearer-token handling on the client side are real.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LOCALHOST = ipaddress.ip_address("127.0.0.1")


def self_signed_cert(directory: Path, common_name: str = "kubernetes") -> tuple[Path, Path, str]:
    """A certificate for 127.0.0.1 (cert file, key file, PEM text), its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(LOCALHOST)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    cert_file, key_file = directory / f"{common_name}.crt", directory / f"{common_name}.key"
    cert_file.write_text(pem)
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file, pem


class FakeKube:
    def __init__(self, directory: Path) -> None:
        cert_file, key_file, self.ca_pem = self_signed_cert(directory)
        self.objects: dict[str, dict[str, Any]] = {}  # collection path + "/" + name -> object
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Authorization header)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                url = urllib.parse.urlparse(self.path)
                fake.requests.append((method, url.path, self.headers.get("Authorization", "")))
                if not self.headers.get("Authorization", "").startswith("Bearer k8s-aws-v1."):
                    self._send(401, {"kind": "Status", "message": "Unauthorized"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                status, reply = fake.handle(method, url.path, urllib.parse.parse_qs(url.query), body)
                self._send(status, reply)

            def do_GET(self) -> None:
                self._route("GET")

            def do_POST(self) -> None:
                self._route("POST")

            def do_DELETE(self) -> None:
                self._route("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]]:
        if method == "POST":
            assert body is not None
            key = f"{path}/{body['metadata']['name']}"
            if key in self.objects:
                return 409, {"kind": "Status", "reason": "AlreadyExists"}
            self.objects[key] = body
            return 201, body
        if method == "DELETE":
            if self.objects.pop(path, None) is None:
                return 404, {"kind": "Status", "reason": "NotFound"}
            return 200, {"kind": "Status", "status": "Success"}
        if path in self.objects:
            return 200, self.objects[path]
        selector = query.get("labelSelector", [""])[0]
        if selector:
            label, _, value = selector.partition("=")
            items = [
                obj
                for key, obj in self.objects.items()
                if key.rsplit("/", 1)[0] == path and obj["metadata"].get("labels", {}).get(label) == value
            ]
            return 200, {"kind": "List", "items": items}
        return 404, {"kind": "Status", "reason": "NotFound"}

    def put(self, collection: str, obj: dict[str, Any]) -> None:
        self.objects[f"{collection}/{obj['metadata']['name']}"] = obj

    def names(self, collection: str) -> list[str]:
        return sorted(key.rsplit("/", 1)[1] for key in self.objects if key.rsplit("/", 1)[0] == collection)
