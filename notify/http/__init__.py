"""The broker's HTTP face, served on ``dashboardHttpPort`` by the broker's own event loop.

Modules:

* :mod:`~notify.http.application` assembles the aiohttp application and starts it;
* :mod:`~notify.http.server`   the server's lifecycle, auth, errors and request helpers;
* :mod:`~notify.http.host`     :class:`BrokerHost`, what the HTTP layer needs of the broker;
* :mod:`~notify.http.bridge`   runs wire requests through :class:`BrokerService` for HTTP
  callers, so an HTTP put is batched, group-committed and acknowledged like a wire put;
* :mod:`~notify.http.metaq`    MetaQ 1.4's HTTP protocol (``/put``, ``/get``, ``/offset``)
  and ``/stats``;
* :mod:`~notify.http.api`      the JSON REST face (``/api/...``);
* :mod:`~notify.http.views`    read-only JSON views of the broker's state;
* :mod:`~notify.http.metrics`  ``/metrics`` for Prometheus;
* :mod:`~notify.http.openapi`  the OpenAPI 3 document of the REST face;
* ``dashboard/``               the single-page dashboard served at ``/``.
"""

from notify.http.application import start_http
from notify.http.server import HttpServer

__all__ = ["HttpServer", "start_http"]
