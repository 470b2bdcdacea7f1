"""Guards for the operator CLI's tests: they talk to fakes and loopback only. Any request to another
address (a stack file's real 10.0.0.x hosts, say) or any real ssh fails the test instead of leaving
this machine."""

import urllib.parse
import urllib.request

import pytest

from programs import probe


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    real_urlopen = urllib.request.urlopen

    def urlopen(url, *args, **kwargs):
        target = url.full_url if isinstance(url, urllib.request.Request) else url
        host = urllib.parse.urlsplit(target).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise OSError(f"test guard: no request to {host} (loopback only)")
        return real_urlopen(url, *args, **kwargs)

    def no_ssh(target, port, ssh_opts, remote, timeout=30):
        raise AssertionError(f"test guard: real ssh to {target} attempted; pass a fake runner")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(probe, "on_node", no_ssh)
