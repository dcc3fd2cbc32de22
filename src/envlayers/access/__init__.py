"""Reaching a live endpoint from elsewhere: what a client needs (``connect``), whether it answers
(``ping``), a reverse SSH tunnel from the API node to a gateway host (``tunnel``), and the ordered
release of route, tunnel, server and allocation (``release``). docs/access.md walks through it.

One module per command, plus ``job`` (the owner's ``envlayers.job.Job`` with its tunnel record) and
``gateway`` (the SSH side: destinations, loopback-only binds, asking the gateway whether a port answers).
"""
