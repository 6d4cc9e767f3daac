"""Typed queries inside one transaction: devices, leases and slices, tickets, tokens, queues, history.

Rows go in and out as core model objects; the pool decides what to do with them.

`Tx` is made of its parts, one module each: tx_base (meta, devices), tx_leases (leases, slices,
suspensions), tx_tickets (the queue), tx_history (queues, the lease history), tx_tokens.
"""

from __future__ import annotations

from .tx_history import HistoryTx
from .tx_tickets import TicketTx
from .tx_tokens import TokenTx


class Tx(HistoryTx, TicketTx, TokenTx):
    """Queries on a connection that is inside a transaction opened by `Store`."""
