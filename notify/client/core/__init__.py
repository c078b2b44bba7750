"""The client's sans-IO core: decisions as functions of state and input, no I/O.

* :mod:`.types` — a global partition, a send's result;
* :mod:`.selectors` — which partition a message goes to;
* :mod:`.wire` — the frames a producer writes and what their replies mean (the one place
  the client reads put/mput/dput acknowledgements and transaction replies);
* :mod:`.states` — the client transaction's states, events and its one transition table;
* :mod:`.transaction` — :class:`~.transaction.TxCore`, one broker transaction: its sends,
  flights, replies, failure and outcome, driven by the asyncio path, the blocking direct
  path, half messages and the XA broker participant.

Sockets live in :mod:`notify.client.transport`; the producers and sessions that own them
drive this core.
"""
