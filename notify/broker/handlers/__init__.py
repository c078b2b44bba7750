"""The broker's verb handlers, one module per family of verbs (see
:mod:`notify.broker.service` for the table of who serves what). Each handler class takes the
:class:`~notify.broker.context.BrokerContext` and, where it needs one, another handler; none
imports the service."""
