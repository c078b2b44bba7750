"""What the client's facades share: attributes read from the object behind them, and
closing on leaving a ``with`` (or ``async with``) block.

``posts_acked = Delegated[int]("core.posts_acked", "Messages of post() stored so far.")`` in
a class body gives its instances a typed, documented attribute that reads
``self.core.posts_acked`` (a dotted path, read with :func:`operator.attrgetter`): the
blocking API's facades and the handles over a transaction's core state what they show in
one line each instead of a property apiece.
"""

from __future__ import annotations

import abc
import operator
from typing import Any, Generic, Self, TypeVar, cast, overload

T = TypeVar("T")


class Delegated(Generic[T]):
    """A read-only attribute reading ``path`` (dotted) from the instance."""

    def __init__(self, path: str, doc: str = ""):
        self.path = path
        self._get = operator.attrgetter(path)
        self.__doc__ = doc

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> Delegated[T]: ...

    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None) -> T: ...

    def __get__(self, obj: object, owner: type[Any] | None = None) -> T | Delegated[T]:
        if obj is None:
            return self
        return cast(T, self._get(obj))

    def __set__(self, obj: object, value: T) -> None:
        raise AttributeError(f"{self.path} is read-only here")


class Closes(abc.ABC):
    """``with obj:`` closes ``obj`` when the block is left."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the object holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncCloses(abc.ABC):
    """``async with obj:`` closes ``obj`` when the block is left."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release what the object holds."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
