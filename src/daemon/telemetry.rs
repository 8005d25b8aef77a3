//! Traces exported over OTLP/HTTP (#42): the daemon's spans (each tick,
//! each task, and the Docker, Caddy, Helm and store calls under them) go
//! to the collector `telemetry.otlp_endpoint` names, as protobuf, in
//! batches from a thread of the OpenTelemetry SDK's own, so no tick and
//! no task ever waits for the collector. Off unless configured: without an
//! endpoint [`Telemetry::new`] builds nothing.
//!
//! A tick's span is the span its `traceparent` names and a task's span a
//! child of the one stored with the task (`engine::trace`), so a tick and
//! the tasks it enqueued are one trace, whichever process runs them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, IdGenerator, RandomIdGenerator, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tracing::{Level, Metadata, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{filter_fn, Filtered};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::config::daemon::TelemetrySettings;
use crate::engine::trace::Join;

/// The path of OTLP/HTTP's traces signal, added to an endpoint that names
/// none (`http://collector:4318`).
pub const TRACES_PATH: &str = "/v1/traces";

/// The daemon's exporter; `shutdown` it when the daemon stops, so the
/// spans of the last ticks are sent.
pub struct Telemetry {
    provider: SdkTracerProvider,
    endpoint: String,
    /// `telemetry.export_timeout_ms`: also the bound on the last export.
    export_timeout: Duration,
}

/// Why no exporter could be built (the endpoint was accepted by the
/// config's check, so this is rare: a URL `http` refuses).
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint = {endpoint:?}: cannot export traces there: {reason}")]
pub struct TelemetryError {
    endpoint: String,
    reason: String,
}

impl Telemetry {
    /// The exporter `settings` ask for; `None` when they name no endpoint
    /// (nothing is built, nothing is sent). Installs how the engine's
    /// spans join their traces ([`join`]).
    pub fn new(settings: &TelemetrySettings) -> Result<Option<Telemetry>, TelemetryError> {
        let Some(endpoint) = settings.otlp_endpoint.as_deref() else {
            return Ok(None);
        };
        let endpoint = traces_url(endpoint);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .with_timeout(settings.export_timeout)
            .build()
            .map_err(|e| TelemetryError {
                endpoint: endpoint.clone(),
                reason: e.to_string(),
            })?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_resource(
                Resource::builder()
                    .with_service_name(settings.service_name.clone())
                    .build(),
            )
            .with_id_generator(OriginIds::default())
            .build();
        crate::engine::trace::install(join);
        Ok(Some(Telemetry {
            provider,
            endpoint,
            export_timeout: settings.export_timeout,
        }))
    }

    /// The URL spans are posted to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The `tracing` layer that hands spans to the exporter: stead's spans
    /// down to `debug` (the port calls) and its events down to `info` (as
    /// span events), whatever the log filter (`STEAD_LOG`) shows.
    #[allow(clippy::type_complexity)]
    pub fn layer<S>(
        &self,
    ) -> Filtered<
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
        tracing_subscriber::filter::FilterFn<fn(&Metadata<'_>) -> bool>,
        S,
    >
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("stead");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(filter_fn(exported as fn(&Metadata<'_>) -> bool))
    }

    /// Sends what is buffered now; for tests and `stead tick`.
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(endpoint = %self.endpoint, error = %e, "traces not exported");
        }
    }

    /// Sends what is buffered and stops the exporter's thread, bounded by
    /// the export timeout. Call outside the async runtime (it blocks).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(self.export_timeout) {
            tracing::warn!(endpoint = %self.endpoint, error = %e, "the last traces were not exported");
        }
    }
}

/// What the exporter's layer takes: stead's spans down to `debug`, its
/// events down to `info`; nothing of other crates (the SDK's own logs
/// among them, which would otherwise feed themselves).
fn exported(meta: &Metadata<'_>) -> bool {
    let least = if meta.is_span() {
        Level::DEBUG
    } else {
        Level::INFO
    };
    meta.target().starts_with("stead") && *meta.level() <= least
}

/// `endpoint` with OTLP/HTTP's traces path when it names no path.
fn traces_url(endpoint: &str) -> String {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    match rest.find('/') {
        Some(at) if rest[at..] != *"/" => endpoint.to_owned(),
        _ => format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/')),
    }
}

/// The trace and span ids a W3C `traceparent` names; `None` when it is
/// not one.
fn ids_of(traceparent: &str) -> Option<opentelemetry::trace::SpanContext> {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let span = cx.span();
    let ids = span.span_context();
    ids.is_valid().then(|| ids.clone())
}

/// [`crate::engine::trace::Joiner`] for the OpenTelemetry layer.
fn join(span: &tracing::Span, traceparent: &str, how: Join) {
    let Some(ids) = ids_of(traceparent) else {
        tracing::debug!(
            traceparent,
            "not a W3C traceparent: the span starts its own trace"
        );
        return;
    };
    match how {
        Join::Child => {
            let parent = opentelemetry::Context::new().with_remote_span_context(ids);
            let _ = span.set_parent(parent);
        }
        Join::Origin => {
            // A root, whatever span it was made under; built now, on this
            // thread, while its ids wait for it in `PENDING`.
            let _ = span.set_parent(opentelemetry::Context::new());
            let offered = PENDING.offer(ids.trace_id(), ids.span_id());
            let _ = span.context();
            drop(offered);
        }
    }
}

/// The ids waiting for the span [`join`] builds as a `traceparent`'s
/// origin, each under the thread that builds it: the span is built on
/// the thread that asks for its context, and any other span built
/// meanwhile on another thread must not take them.
struct Pending {
    /// How many entries `ids` holds: spans are built with none waiting
    /// almost always, and then the lock is not taken.
    count: AtomicUsize,
    ids: Mutex<Vec<Waiting>>,
}

/// A thread's origin ids not yet taken.
type Waiting = (ThreadId, Option<TraceId>, Option<SpanId>);

static PENDING: Pending = Pending {
    count: AtomicUsize::new(0),
    ids: Mutex::new(Vec::new()),
};

impl Pending {
    /// Offers `trace` and `span` to the next span this thread builds,
    /// until the guard is dropped.
    fn offer(&'static self, trace: TraceId, span: SpanId) -> Offered {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.push((std::thread::current().id(), Some(trace), Some(span)));
        self.count.fetch_add(1, Ordering::SeqCst);
        Offered(self)
    }

    /// What this thread's offer still holds, taken by `take`.
    fn take<T>(&self, take: impl FnOnce(&mut Waiting) -> Option<T>) -> Option<T> {
        if self.count.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let me = std::thread::current().id();
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.iter_mut().find(|entry| entry.0 == me).and_then(take)
    }
}

/// This thread's offer, withdrawn when dropped.
struct Offered(&'static Pending);

impl Drop for Offered {
    fn drop(&mut self) {
        let me = std::thread::current().id();
        let mut ids = self.0.ids.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = ids.iter().position(|entry| entry.0 == me) {
            ids.swap_remove(at);
            self.0.count.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// The SDK's random ids, except for a span built by [`join`] as the
/// origin of a `traceparent`: it takes that `traceparent`'s ids.
#[derive(Debug, Default)]
struct OriginIds(RandomIdGenerator);

impl IdGenerator for OriginIds {
    fn new_trace_id(&self) -> TraceId {
        PENDING
            .take(|entry| entry.1.take())
            .unwrap_or_else(|| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        PENDING
            .take(|entry| entry.2.take())
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_without_a_path_gets_the_traces_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/tenant/v1/traces"),
            "https://otel.example/tenant/v1/traces"
        );
    }

    #[test]
    fn an_origins_ids_go_to_the_span_its_thread_builds_and_no_other() {
        let ids = ids_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let generator = OriginIds::default();
        let offered = PENDING.offer(ids.trace_id(), ids.span_id());
        let elsewhere = std::thread::scope(|s| {
            s.spawn(|| (generator.new_span_id(), generator.new_trace_id()))
                .join()
                .unwrap()
        });
        assert_ne!(elsewhere.0, ids.span_id());
        assert_ne!(elsewhere.1, ids.trace_id());
        assert_eq!(generator.new_span_id(), ids.span_id());
        assert_eq!(generator.new_trace_id(), ids.trace_id());
        // Each once: a second span of this thread gets its own.
        assert_ne!(generator.new_span_id(), ids.span_id());
        drop(offered);
        assert_eq!(PENDING.count.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_traceparent_names_its_trace_and_span() {
        let ids = ids_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(
            ids.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(ids.span_id().to_string(), "00f067aa0ba902b7");
        assert!(ids.is_remote() && ids.is_sampled());
        assert!(ids_of("not-a-traceparent").is_none());
        assert!(ids_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
    }
}
