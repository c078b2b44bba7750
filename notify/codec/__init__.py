"""Sans-IO codecs: the record layout and the MetaQ text wire protocol (no sockets, no files)."""
