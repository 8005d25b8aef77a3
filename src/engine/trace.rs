//! Joining the engine's spans to the W3C trace they belong to (#42).
//!
//! A tick makes a `traceparent` and every task it enqueues stores it; the
//! tick's span *is* the span that `traceparent` names, and a task's span
//! is its child, so a tick and the work it asked for are one trace. The
//! engine only says which span plays which part ([`origin`], [`child`]);
//! how that reaches an exporter is the daemon's (`daemon::telemetry`),
//! which installs a [`Joiner`] when traces are exported. Without one
//! (the default, the simulation, the tests of the engine) both calls do
//! nothing, so the engine builds and decides the same with or without
//! OpenTelemetry.

use std::sync::OnceLock;

/// How a span joins a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Join {
    /// The span is the one the `traceparent` names: its trace id and its
    /// span id are the `traceparent`'s (a tick's span).
    Origin,
    /// The span is a child of the one the `traceparent` names (a task's
    /// span, under the tick or operator command that enqueued it).
    Child,
}

/// Joins a span, not yet entered, to the trace of a W3C `traceparent`.
/// Must not fail: a `traceparent` it cannot read leaves the span alone.
pub type Joiner = fn(&tracing::Span, &str, Join);

static JOINER: OnceLock<Joiner> = OnceLock::new();

/// Installs how spans join their traces, once per process; `false` when
/// one was installed before (which then stays).
pub fn install(joiner: Joiner) -> bool {
    JOINER.set(joiner).is_ok()
}

/// `span` is the span `traceparent` names (call before entering it).
pub fn origin(span: &tracing::Span, traceparent: &str) {
    join(span, traceparent, Join::Origin);
}

/// `span` is a child of the span `traceparent` names (call before
/// entering it); nothing without a `traceparent`.
pub fn child(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(traceparent) = traceparent {
        join(span, traceparent, Join::Child);
    }
}

fn join(span: &tracing::Span, traceparent: &str, how: Join) {
    if let Some(joiner) = JOINER.get() {
        joiner(span, traceparent, how);
    }
}
