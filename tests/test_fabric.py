"""Fabric interfaces: <prefix><digits> only, with an IPv4 address."""

from __future__ import annotations

import pytest

from envlayers.fabric import choose, local_ipv4, matching

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


@pytest.mark.parametrize("asked, layers, want_lines, derived, error", [
    pytest.param(None, None, ["ENVLAYERS-TOPOLOGY: iface hsn0 172.28.86.10", "ENVLAYERS-TOPOLOGY: iface hsn1 172.28.86.11",
                              "ENVLAYERS-TOPOLOGY: nccl_socket_ifname==hsn0,hsn1 (derived)"], "=hsn0,hsn1", None,
                 id="derived-exact-names"),
    pytest.param(None, "ib0", ["ENVLAYERS-TOPOLOGY: iface hsn0 172.28.86.10", "ENVLAYERS-TOPOLOGY: iface hsn1 172.28.86.11",
                               "ENVLAYERS-TOPOLOGY: nccl_socket_ifname=ib0 (from the layers)"], None, None,
                 id="the-layers-win"),
    pytest.param("ib", None, [], None, "no interface ib<N> with an IPv4 address (have: hsn0, hsn0.561, hsn1, hsnx, nmn0)",
                 id="asked-and-missing-stops"),
])
def test_choose(asked, layers, want_lines, derived, error):
    choice = choose(IFACES, asked, layers)
    assert list(choice.lines) == want_lines and choice.socket_ifname == derived
    assert (error in choice.error) if error else choice.error is None


def test_choose_warns_when_nothing_matches_and_nothing_was_asked():
    choice = choose({"lo": "127.0.0.1", "eth0": "10.0.0.1"}, None, None)
    assert choice.error is None and choice.socket_ifname is None
    assert choice.lines == ("ENVLAYERS-WARN: no hsn<N> interface with an IPv4 address on the head node (have: eth0); "
                            "NCCL picks its interface itself (set ENVLAYERS_HSN_IFACE to require one)",)
