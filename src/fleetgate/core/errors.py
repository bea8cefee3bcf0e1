"""Error tree. Every error carries its HTTP status and OpenAI error ``type``/``code``.

The gateway turns these into OpenAI-style JSON in exactly one place (gateway/errors.py).
"""

from __future__ import annotations

import errno
from collections.abc import Mapping


class FleetgateError(Exception):
    """Base error: ``status`` is the HTTP status the client sees."""

    status: int = 500
    error_type: str = "server_error"
    code: str | None = None
    #: Admission refused the request for lack of capacity, not for the tenant's own limits: it is demand
    #: the fleet did not serve, and the autoscaler counts it (``core.lifecycle.Lifecycle.shed``).
    offered_demand: bool = False

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers: dict[str, str] = dict(headers or {})

    def to_dict(self) -> dict[str, object]:
        """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class InvalidRequestError(FleetgateError):
    status = 400
    error_type = "invalid_request_error"


class ConflictError(FleetgateError):
    """The request conflicts with the state it would change (e.g. a reservation its GPU pool cannot back);
    ``details`` appear in the error body beside ``message`` (``{"error": {..., "shortfall": {...}}}``)."""

    status = 409
    error_type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        details: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.details: dict[str, object] = dict(details or {})

    def to_dict(self) -> dict[str, object]:
        body = super().to_dict()
        error = body["error"]
        assert isinstance(error, dict)
        error.update(self.details)
        return body


class RequestTimeoutError(InvalidRequestError):
    """The client did not send its request (body) in time."""

    status = 408
    code = "request_timeout"


class AuthenticationError(FleetgateError):
    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(FleetgateError):
    status = 403
    error_type = "permission_error"


class NotFoundError(FleetgateError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class PayloadTooLargeError(FleetgateError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class RateLimitError(FleetgateError):
    """Over a tenant's limit: ``retry_after_s`` becomes the ``Retry-After`` header."""

    status = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float,
        headers: Mapping[str, str] | None = None,
        offered_demand: bool = False,
    ) -> None:
        super().__init__(message, headers=headers)
        self.offered_demand = offered_demand
        self.retry_after_s = retry_after_s


class ServiceUnavailableError(FleetgateError):
    """No capacity or no healthy replica right now; may carry a ``Retry-After``."""

    status = 503
    error_type = "server_error"
    code = "service_unavailable"

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        headers: Mapping[str, str] | None = None,
        offered_demand: bool = False,
    ) -> None:
        super().__init__(message, headers=headers)
        self.offered_demand = offered_demand
        self.retry_after_s = retry_after_s


class UpstreamError(FleetgateError):
    """The engine failed; ``retryable`` when no byte reached the client and another replica may try."""

    status = 502
    error_type = "server_error"
    code = "upstream_error"

    def __init__(self, message: str, *, retryable: bool = True, upstream_status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.upstream_status = upstream_status


class UpstreamTimeoutError(UpstreamError):
    status = 504
    code = "upstream_timeout"


#: errno values that say this process ran out of a local resource (descriptors, buffers, memory), not that
#: the peer misbehaved.
LOCAL_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def is_local_resource_error(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is this process running out of descriptors or memory.

    Such a failure is evidence that the gateway is sick, never evidence against a replica: a probe or a
    request that failed this way must not mark a replica unhealthy or make it be restarted.
    """
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in LOCAL_RESOURCE_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
