"""Brokers for tests: in this process for an application's tests (:func:`broker`, the
``notify_broker`` pytest fixture), or as child processes that can be killed and restarted
(:class:`BrokerProcess`, used by notify's own tests, benchmarks and the demo)."""

from .inproc import TestBroker, broker
from .process import DEFAULT_TOPICS, BrokerProcess, free_port, render_ini

__all__ = ["DEFAULT_TOPICS", "BrokerProcess", "TestBroker", "broker", "free_port", "render_ini"]
