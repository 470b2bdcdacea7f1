"""The front door's certificates when the stack makes its own (frontDoor.certificate.source: stack-ca): a CA of the
stack's own and the server certificate it issues, both made where Pulumi runs (Python's `cryptography`), their keys
kept in Pulumi's state as secrets (components/frontdoor.py runs `python -m planning.tls` as local commands).

Renewal is a calendar, not a clock read at `up`: a server certificate belongs to a period of `validity - renewBefore`
days counted from the Unix epoch (`period`), is valid from its period's start to `validity` days after it, and the
period is the certificate's trigger. So the preview of the first `up` in a new period shows the certificate replaced
(`renewBefore` days before the old one expires; the preview warns) and every other `up` changes nothing.

    python -m planning.tls ca --name sim                              # JSON {cert, key} on stdout
    python -m planning.tls server --name 10.0.0.1 --period 342 ...    # the CA's JSON on stdin; JSON {cert, key, ...}
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import sys
from dataclasses import dataclass

DAY = dt.timedelta(days=1)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
CA_YEARS = 10


@dataclass(frozen=True)
class Schedule:
    """When the stack's server certificate is issued and renewed (pure: today's date in, the period out)."""

    validity_days: int
    renew_before_days: int

    @property
    def period_days(self) -> int:
        return self.validity_days - self.renew_before_days

    def period(self, today: dt.date) -> int:
        return (today - EPOCH.date()).days // self.period_days

    def not_before(self, period: int) -> dt.datetime:
        return EPOCH + period * self.period_days * DAY

    def not_after(self, period: int) -> dt.datetime:
        return self.not_before(period) + self.validity_days * DAY

    def renew_on(self, period: int) -> dt.date:
        """The first day of the next period: the first `up` from then on issues a new certificate."""
        return (self.not_before(period + 1)).date()


def san_entries(names: list[str]):
    """x509 SubjectAlternativeName entries: addresses as IP entries, everything else as DNS names."""
    from cryptography import x509

    out = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem(obj) -> str:
    from cryptography.hazmat.primitives import serialization

    if hasattr(obj, "public_bytes") and not hasattr(obj, "private_bytes"):
        return obj.public_bytes(serialization.Encoding.PEM).decode()
    return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()  # fmt: skip


def make_ca(name: str, now: dt.datetime) -> dict[str, str]:
    """A CA of the stack's own (ECDSA P-256, 10 years, path length 0: it signs server certificates only)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "deepseek-spark"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"deepseek-spark CA of stack {name}")])  # fmt: skip
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - DAY)
            .not_valid_after(now + CA_YEARS * 365 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))  # fmt: skip
    return {"cert": _pem(cert), "key": _pem(key)}


def issue_server(ca: dict[str, str], names: list[str], not_before: dt.datetime, not_after: dt.datetime) -> dict:
    """A server certificate for every name and address in `names` (the first is its common name), signed by `ca`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_cert = x509.load_pem_x509_certificate(ca["cert"].encode())
    ca_key = serialization.load_pem_private_key(ca["key"].encode(), password=None)
    key = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(san_entries(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))  # fmt: skip
    return {"cert": _pem(cert), "key": _pem(key), "chain": _pem(cert) + ca["cert"],
            "not_after": not_after.strftime("%Y-%m-%dT%H:%M:%SZ"), "serial": format(cert.serial_number, "x")}


def describe(cert_pem: str) -> dict:
    """What a certificate names and until when (the `front_door` output, `dspark status`)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for v in san.get_values_for_type(x509.DNSName)] + \
            [str(v) for v in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        names = []
    return {"subject": cert.subject.rfc4514_string(), "issuer": cert.issuer.rfc4514_string(), "names": names,
            "not_after": cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    ca = sub.add_parser("ca", help="a new CA of the stack's own: JSON {cert, key} on stdout")
    ca.add_argument("--name", required=True, help="the stack")
    srv = sub.add_parser("server", help="a server certificate from the CA on stdin (JSON {cert, key})")
    srv.add_argument("--name", action="append", required=True, help="a DNS name or address (repeat; first: CN)")
    srv.add_argument("--period", type=int, required=True)
    srv.add_argument("--validity-days", type=int, required=True)
    srv.add_argument("--renew-before-days", type=int, required=True)
    a = p.parse_args(argv)
    if a.what == "ca":
        out = make_ca(a.name, dt.datetime.now(dt.timezone.utc))
    else:
        sched = Schedule(a.validity_days, a.renew_before_days)
        out = issue_server(json.loads(sys.stdin.read()), a.name, sched.not_before(a.period), sched.not_after(a.period))
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
