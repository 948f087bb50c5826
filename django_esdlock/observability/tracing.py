"""The OpenTelemetry spans of the locks: ``esdlock.acquire``, ``esdlock.hold`` and ``esdlock.reap``.

Only :mod:`django_esdlock.observability` imports this module, and only when
``opentelemetry-api`` is installed and ``ESDLOCK_TRACING`` is not False.
Spans go to whatever tracer provider the application set up (none: the API's
no-op spans). Each is a child of the caller's current span.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import Span, Status, StatusCode

from ..version import VERSION

Attributes = Mapping[str, Any]


class LockTracing:
    """Starts and ends the package's spans on the tracer of ``provider`` (default: the global one, at each span)."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        self._tracer = None if provider is None else provider.get_tracer("django_esdlock", VERSION)
        self._global: tuple[trace.TracerProvider, trace.Tracer] | None = None

    def tracer(self) -> trace.Tracer:
        if self._tracer is not None:
            return self._tracer
        # The global provider's, looked up at each span (an application may set it after the first lock),
        # its tracer made once per provider (the SDK makes a new one at each get_tracer).
        provider = trace.get_tracer_provider()
        known = self._global
        if known is None or known[0] is not provider:
            known = self._global = (provider, provider.get_tracer("django_esdlock", VERSION))
        return known[1]

    def current_context(self) -> context.Context:
        return context.get_current()

    def begin(self, name: str, attributes: Attributes, parent: context.Context | None = None) -> Span:
        """Start span ``name`` as a child of ``parent`` (default: the current span); it is not made current."""
        return self.tracer().start_span(name, context=parent, attributes=attributes)

    def make_current(self, span: Span) -> object:
        """Make ``span`` the current one; return what :meth:`restore` takes."""
        return context.attach(trace.set_span_in_context(span))

    def restore(self, token: object) -> None:
        context.detach(token)  # type: ignore[arg-type]

    def end(self, span: Span, error: BaseException | None = None) -> None:
        """End ``span``, its status an error if ``error`` is given."""
        if error is not None and span.is_recording():
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
        span.end()

    def event(self, span: Span | None, name: str, attributes: Attributes) -> None:
        """Add event ``name`` to ``span`` (default: the current span, if it is one of ours being recorded)."""
        span = trace.get_current_span() if span is None else span
        if span.is_recording():
            span.add_event(name, attributes)
