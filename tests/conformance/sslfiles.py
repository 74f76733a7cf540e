"""The certificates and keys of the SSL tests, in the forms librdkafka's cluster tool
trivup makes them (its ``SslApp``), and the SSL_* variables it sets.

trivup makes two CAs (an unused one, to test a PEM file holding several CAs, and the one
everything is signed with) and a client certificate in PEM, DER and PKCS#12; the tests
(0097_ssl_verify) find them through ``SSL_*`` variables and the client's test.conf
(``security.protocol=ssl`` and the ``ssl.*.location`` keys). Here the CA that signs is
the one ``ledgerd local --kafka-tls`` made for its gateway (``<data>/tls/ca.pem`` and
``ca.key``), so the gateway's certificate and the client's chain to the same CA, as
trivup's broker and client certificates do.

The files:

- ``ca.pem``, ``ca.der``: the CA (``SSL_ca_pem``, ``SSL_ca_der``);
- ``unused_ca.pem``, ``unused_ca.der`` (``SSL_unused_ca_*``) and ``all_cas.pem``, the
  unused CA first, then the CA (``SSL_all_cas_pem``);
- ``client-pub.pem``'s subject is trivup's with the OU ``0:client,admin``: the roles
  the gateway authorizes a certificate's requests by;
- ``client-priv.pem``: the client's key, encrypted with the password
  (``SSL_priv_pem``, test.conf's ``ssl.key.location`` and ``ssl.key.password``);
  ``client-priv.der``: the same key, unencrypted, in DER (``SSL_priv_der``);
- ``client-pub.pem``: the client's certificate followed by the CA's (``SSL_pub_pem``,
  ``ssl.certificate.location``); ``client-pub.der``: the certificate alone
  (``SSL_pub_der``);
- ``client.pfx``: PKCS#12 with the key, the certificate and the CA, protected by the
  password (``SSL_pkcs``, ``SSL_password``).

No intermediate CA (trivup's ``ssl_intermediate_ca``, off by default): without
``SSL_intermediate_pub_pem`` the test runs its root-CA-only cases (DER forms) instead.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# trivup's default key password (its ssl_key_pass)
PASSWORD = "12345678"
# A gateway that requires client certificates authorizes by the roles a certificate's
# OU names (docs/kafka.md, "Security"), where Kafka without an authorizer lets every
# authenticated client do anything: the suite's client may, as its tests expect.
CLIENT_ROLES = "0:client,admin"
# librdkafka's default for SSL_client_auth; the SSL cluster requires client certificates
CLIENT_AUTH = "required"

TEST_CONF = """\
# Written by tests/conformance/runner.py for the tests run against the SSL listener of
# `ledgerd local --kafka-tls` (the keys trivup writes for an SSL cluster).
bootstrap.servers={bootstrap}
broker.address.family=v4
test.timeout.multiplier=2
test.topic.random=true
security.protocol=ssl
ssl.ca.location={ca}
ssl.certificate.location={certificate}
ssl.key.location={key}
ssl.key.password={password}
"""


def _name(cn: str, roles: str = "") -> x509.Name:
    # trivup's subjects, /C=NN/ST=ST/L=L/O=O/CN=<cn>, with the gateway's roles as an OU
    return x509.Name([x509.NameAttribute(NameOID.COUNTRY_NAME, "NN"),
                      x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "ST"),
                      x509.NameAttribute(NameOID.LOCALITY_NAME, "L"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "O"),
                      *([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, roles)]
                        if roles else []),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (builder.not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .serial_number(x509.random_serial_number()))


def _unused_ca() -> x509.Certificate:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = _name("SslApp_unused")
    return (_validity(x509.CertificateBuilder()).subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))


def make_ssl_files(where: Path, ca_pem: Path, ca_key: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Write the files under ``where`` with a client certificate signed by the CA of
    ``ca_pem`` and ``ca_key``; returns (the SSL_* variables, the test.conf values
    ``ca``, ``certificate``, ``key`` and ``password``)."""
    where.mkdir(parents=True, exist_ok=True)
    ca = x509.load_pem_x509_certificate(ca_pem.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(signer, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ValueError(f"{ca_key}: not an RSA or EC key")
    unused = _unused_ca()
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (_validity(x509.CertificateBuilder()).subject_name(_name("client", CLIENT_ROLES))
            .issuer_name(ca.subject).public_key(key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True,
                                         content_commitment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                signer.public_key()), critical=False)
            .sign(signer, hashes.SHA256()))
    pem, der = serialization.Encoding.PEM, serialization.Encoding.DER
    password = PASSWORD.encode()
    files = {
        "ca_pem": ("ca.pem", ca.public_bytes(pem)),
        "ca_der": ("ca.der", ca.public_bytes(der)),
        "unused_ca_pem": ("unused_ca.pem", unused.public_bytes(pem)),
        "unused_ca_der": ("unused_ca.der", unused.public_bytes(der)),
        "all_cas_pem": ("all_cas.pem", unused.public_bytes(pem) + ca.public_bytes(pem)),
        "priv_pem": ("client-priv.pem", key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password))),
        "priv_der": ("client-priv.der", key.private_bytes(
            der, serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption())),
        "pub_pem": ("client-pub.pem", cert.public_bytes(pem) + ca.public_bytes(pem)),
        "pub_der": ("client-pub.der", cert.public_bytes(der)),
        "pkcs": ("client.pfx", pkcs12.serialize_key_and_certificates(
            b"client", key, cert, [ca], serialization.BestAvailableEncryption(password))),
    }
    env = {"SSL_password": PASSWORD, "SSL_client_auth": CLIENT_AUTH}
    for var, (name, data) in files.items():
        path = where / name
        path.write_bytes(data)
        if "priv" in var or var == "pkcs":
            path.chmod(0o600)
        env[f"SSL_{var}"] = str(path)
    conf = {"ca": env["SSL_ca_pem"], "certificate": env["SSL_pub_pem"],
            "key": env["SSL_priv_pem"], "password": PASSWORD}
    return env, conf
