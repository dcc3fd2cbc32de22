"""Fabric interfaces: <prefix><digits> only, with an IPv4 address."""

from __future__ import annotations

import pytest

from envlayers.fabric import local_ipv4, matching

IFACES = {"lo": "127.0.0.1", "hsn0": "172.28.86.10", "hsn0.561": "141.142.254.10", "hsn1": "172.28.86.11",
          "hsn2": None, "nmn0": "10.100.0.4", "hsnx": "1.2.3.4"}


@pytest.mark.parametrize("prefix, want", [
    ("hsn", [("hsn0", "172.28.86.10"), ("hsn1", "172.28.86.11")]),
    ("nmn", [("nmn0", "10.100.0.4")]),
    ("ib", []),
    ("hsn1", [("hsn1", "172.28.86.11")]),
], ids=["vlan-child-and-no-address-left-out", "other-prefix", "nothing", "an-interface-name"])
def test_matching(prefix, want):
    assert matching(IFACES, prefix) == want


def test_local_interfaces_include_loopback():
    assert local_ipv4().get("lo") == "127.0.0.1"
