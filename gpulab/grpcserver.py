"""A gRPC server that answers an undecodable request as grpc-go's server does.

grpc-go ``server.go`` (``processUnaryRPC`` / ``processStreamingRPC``, v1.7x as vendored by
kubelet v1.36.3 and k8s-device-plugin v0.20.0) refuses a request it cannot unmarshal with
``codes.Internal``, "grpc: error unmarshalling request: <the proto error>". grpcio's server
aborts with ``INTERNAL`` "Exception deserializing request!" and logs a traceback, which
reads as a crash. Here each handler gets the raw bytes and decodes them itself, so the
refusal carries grpc-go's text and what the decoder found.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _UnmarshalErrors(grpc.ServerInterceptor):
    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        decode = getattr(handler, "request_deserializer", None)
        if handler is None or decode is None or handler.request_streaming:
            return handler
        kind = "unary_unary" if handler.unary_unary is not None else "unary_stream"
        behavior = getattr(handler, kind)

        def decoded(raw: bytes, context: grpc.ServicerContext) -> Any:
            try:
                request = decode(raw)
            except DecodeError as exc:
                context.abort(grpc.StatusCode.INTERNAL, f"grpc: error unmarshalling request: {exc}")
            return behavior(request, context)

        # the handlers grpcio's generated code makes are namedtuples
        return handler._replace(request_deserializer=None, **{kind: decoded})  # type: ignore[attr-defined]


def new_server(max_workers: int) -> grpc.Server:
    """``grpc.server`` on a thread pool, refusing undecodable requests as grpc-go does."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers), interceptors=[_UnmarshalErrors()]
    )
