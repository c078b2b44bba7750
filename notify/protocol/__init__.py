"""The wire and file formats of notify, defined once (pure: no sockets, files, asyncio or
scheduler imports).

* :mod:`.frames`      MetaQ's text protocol: requests, the sans-IO parsers, frame encoders
* :mod:`.replies`     typed replies (put/mput acks, redirects, XA failures, stats bodies)
* :mod:`.records`     the message record layout shared by segment files and ``get`` replies
* :mod:`.keys`        transaction key formats (``TX:...``, ``XID:...``)
* :mod:`.logrecords`  bodies of the broker's redo-log records
* :mod:`.xa`          javax.transaction.xa codes
"""
