"""The API server's aggregation layer (front proxy), so extension API servers can be served.

An HPA reads custom and external metrics from `custom.metrics.k8s.io` and
`external.metrics.k8s.io`, which a metrics adapter serves behind the kube-apiserver: the
apiserver proxies those requests to it with a client certificate of its own (the front-proxy
client) and the caller's identity in request headers, and the adapter trusts the headers
because that certificate is signed by the front-proxy CA the apiserver publishes in
kube-system/extension-apiserver-authentication. This makes that CA and client certificate and
returns the apiserver flags, as kubeadm configures them. Nothing changes for other clients.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

CLIENT_NAME = "front-proxy-client"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_front_proxy_pki(pki: Path) -> None:
    """The front-proxy CA and the client certificate the apiserver proxies with (once)."""
    if (pki / "front-proxy-client.crt").exists():
        return
    ca_key, ca_crt = str(pki / "front-proxy-ca.key"), str(pki / "front-proxy-ca.crt")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca_crt,
             "-days", "3650", "-subj", "/CN=boomerang-e2e-front-proxy-ca")  # fmt: skip
    (pki / "front-proxy-client.ext").write_text("extendedKeyUsage=clientAuth\n")
    key, csr = str(pki / "front-proxy-client.key"), str(pki / "front-proxy-client.csr")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", f"/CN={CLIENT_NAME}")  # fmt: skip
    _openssl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
             "-out", str(pki / "front-proxy-client.crt"), "-days", "3650",
             "-extfile", str(pki / "front-proxy-client.ext"))  # fmt: skip


def apiserver_flags(pki: Path) -> list[str]:
    """kube-apiserver flags that enable the aggregation layer's front proxy."""
    make_front_proxy_pki(pki)
    return [
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        f"--requestheader-allowed-names={CLIENT_NAME}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
    ]
