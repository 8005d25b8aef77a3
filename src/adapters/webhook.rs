//! Posting one logged event to a webhook (#42): the body in the format the
//! webhook asked for, signed, within a timeout. What to post next and when
//! to try again is decided by `core::webhook`; the loop that reads the log
//! and moves the cursor is `daemon::webhooks`.
//!
//! The body is the exact bytes signed: `X-Stead-Signature: sha256=<hex>`
//! is the HMAC-SHA256 of those bytes under the webhook's secret. Only a
//! 2xx answer acknowledges; any other status, a timeout or a closed
//! connection is a failure, and the event is posted again.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

use crate::core::event_log::LoggedEvent;
use crate::core::webhook::WebhookFormat;
use crate::daemon::event_log::EventView;

/// The header carrying the body's signature.
pub const SIGNATURE_HEADER: &str = "X-Stead-Signature";
/// The header carrying the event's id, for receivers that dedupe before
/// they parse.
pub const EVENT_ID_HEADER: &str = "X-Stead-Event-Id";
/// Most bytes of a failed answer's body quoted in the error.
const ERROR_BODY_LEN_MAX: usize = 200;

/// Where and how one webhook posts.
#[derive(Clone)]
pub struct WebhookTarget {
    pub name: String,
    pub url: String,
    /// The HMAC key; unsigned without.
    pub secret: Option<Vec<u8>>,
    pub format: WebhookFormat,
    /// The bound on one request, connecting included.
    pub timeout: Duration,
}

impl std::fmt::Debug for WebhookTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Neither the secret nor the URL (a token often travels in it).
        f.debug_struct("WebhookTarget")
            .field("name", &self.name)
            .field("signed", &self.secret.is_some())
            .field("format", &self.format)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why a post was not acknowledged. Never quotes the URL.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("no answer within {timeout_ms} ms")]
    Timeout { timeout_ms: u128 },
    #[error("the receiver answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the request failed: {0}")]
    Request(String),
}

/// Posts events to one webhook.
#[derive(Clone, Debug)]
pub struct WebhookClient {
    client: reqwest::Client,
    target: WebhookTarget,
}

impl WebhookClient {
    pub fn new(target: WebhookTarget) -> Result<Self, PostError> {
        let client = reqwest::Client::builder()
            .timeout(target.timeout)
            .connect_timeout(target.timeout)
            // A webhook answers a POST; a redirect would repost the signed
            // body somewhere the operator did not configure.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| PostError::Request(without_url(e)))?;
        Ok(Self { client, target })
    }

    pub fn name(&self) -> &str {
        &self.target.name
    }

    /// Posts `logged`; `Ok` only on a 2xx answer.
    pub async fn post(&self, logged: &LoggedEvent) -> Result<(), PostError> {
        let body = render(self.target.format, &self.target.name, logged);
        let mut request = self
            .client
            .post(&self.target.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(EVENT_ID_HEADER, logged.id.to_string());
        if let Some(secret) = &self.target.secret {
            request = request.header(SIGNATURE_HEADER, signature(secret, &body));
        }
        let response = request.body(body).send().await.map_err(|e| {
            if e.is_timeout() {
                PostError::Timeout {
                    timeout_ms: self.target.timeout.as_millis(),
                }
            } else {
                PostError::Request(without_url(e))
            }
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response.text().await.unwrap_or_default();
        Err(PostError::Status {
            status: status.as_u16(),
            body: text.chars().take(ERROR_BODY_LEN_MAX).collect(),
        })
    }
}

/// A reqwest error and its causes, without the URL it names.
fn without_url(error: reqwest::Error) -> String {
    use std::error::Error as _;
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `sha256=<hex>`: the HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let mut out = String::with_capacity(7 + 2 * digest.len());
    out.push_str("sha256=");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The body of `logged` as `format` says, for webhook `webhook`.
pub fn render(format: WebhookFormat, webhook: &str, logged: &LoggedEvent) -> Vec<u8> {
    let body = match format {
        WebhookFormat::Stead => serde_json::to_vec(&SteadBody {
            version: 1,
            webhook,
            event: EventView::from(logged),
        }),
        WebhookFormat::Alertmanager => serde_json::to_vec(&alertmanager(webhook, logged)),
    };
    body.expect("the body is plain data")
}

/// stead's own body: the event as `stead events --json` prints it.
#[derive(Serialize)]
struct SteadBody<'a> {
    version: u32,
    webhook: &'a str,
    event: EventView,
}

/// Alertmanager's webhook body, version 4, with one alert per event.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AlertmanagerBody {
    version: &'static str,
    group_key: String,
    truncated_alerts: u32,
    status: &'static str,
    receiver: String,
    group_labels: Labels,
    common_labels: Labels,
    common_annotations: Labels,
    #[serde(rename = "externalURL")]
    external_url: &'static str,
    alerts: Vec<Alert>,
}

type Labels = std::collections::BTreeMap<&'static str, String>;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Alert {
    status: &'static str,
    labels: Labels,
    annotations: Labels,
    starts_at: String,
    ends_at: String,
    #[serde(rename = "generatorURL")]
    generator_url: &'static str,
    fingerprint: String,
}

/// An event as a firing alert: its kind names it (`SteadCrashLoopDelay`),
/// its subject and id label it (each event is its own alert, so a
/// receiver dedupes by `event_id`), its sentence is the summary. An event
/// has no end: `endsAt` is Go's zero time, as Alertmanager writes for an
/// alert still firing.
fn alertmanager(webhook: &str, logged: &LoggedEvent) -> AlertmanagerBody {
    let e = &logged.event;
    let mut labels = Labels::new();
    labels.insert("alertname", alert_name(e.kind.as_str()));
    labels.insert("kind", e.kind.as_str().to_owned());
    labels.insert("event_id", logged.id.to_string());
    labels.insert("severity", "warning".to_owned());
    if let Some(i) = &e.instance {
        labels.insert("instance", i.to_string());
    }
    if let Some(s) = &e.service {
        labels.insert("service", s.to_string());
    }
    let mut annotations = Labels::new();
    annotations.insert("summary", e.message.clone());
    annotations.insert("rule", e.reason.clone());
    annotations.insert("writer", e.writer.clone());
    if let Some(until) = e.until {
        annotations.insert("until", until.to_string());
    }
    let group_labels: Labels = [("alertname", labels["alertname"].clone())].into();
    AlertmanagerBody {
        version: "4",
        group_key: format!("{{}}:{{event_id=\"{}\"}}", logged.id),
        truncated_alerts: 0,
        status: "firing",
        receiver: webhook.to_owned(),
        common_labels: labels.clone(),
        common_annotations: annotations.clone(),
        group_labels,
        external_url: "",
        alerts: vec![Alert {
            status: "firing",
            labels,
            annotations,
            starts_at: e.at.to_string(),
            ends_at: "0001-01-01T00:00:00Z".to_owned(),
            generator_url: "",
            fingerprint: format!("{:016x}", logged.id),
        }],
    }
}

/// `crash_loop_delay` → `SteadCrashLoopDelay`.
fn alert_name(kind: &str) -> String {
    let mut name = String::from("Stead");
    for word in kind.split('_') {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            name.push(first.to_ascii_uppercase());
            name.push_str(chars.as_str());
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::event_log::{Event, EventKind};
    use crate::core::types::{InstanceName, ServiceName, Timestamp};

    fn logged() -> LoggedEvent {
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        let mut event = Event::new(
            EventKind::CrashLoopDelay,
            at,
            "R10",
            "wiki1/web is held down",
        )
        .instance(&InstanceName::new("wiki1"))
        .service(&ServiceName::new("web"))
        .until(at.checked_add(Duration::from_secs(60)).unwrap());
        event.writer = "host-1#a".into();
        LoggedEvent { id: 42, event }
    }

    #[test]
    fn the_signature_is_rfc_4231s_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn the_stead_body_carries_the_event_as_stead_events_prints_it() {
        let body: serde_json::Value =
            serde_json::from_slice(&render(WebhookFormat::Stead, "ops", &logged())).unwrap();
        assert_eq!(body["version"], 1);
        assert_eq!(body["webhook"], "ops");
        assert_eq!(body["event"]["id"], 42);
        assert_eq!(body["event"]["kind"], "crash_loop_delay");
        assert_eq!(body["event"]["instance"], "wiki1");
        assert_eq!(body["event"]["reason"], "R10");
    }

    #[test]
    fn the_alertmanager_body_is_one_firing_alert_labelled_by_kind_subject_and_id() {
        let body: serde_json::Value =
            serde_json::from_slice(&render(WebhookFormat::Alertmanager, "ops", &logged())).unwrap();
        assert_eq!(body["version"], "4");
        assert_eq!(body["status"], "firing");
        assert_eq!(body["receiver"], "ops");
        let alert = &body["alerts"][0];
        assert_eq!(alert["labels"]["alertname"], "SteadCrashLoopDelay");
        assert_eq!(alert["labels"]["event_id"], "42");
        assert_eq!(alert["labels"]["instance"], "wiki1");
        assert_eq!(alert["labels"]["service"], "web");
        assert_eq!(alert["annotations"]["summary"], "wiki1/web is held down");
        assert_eq!(alert["startsAt"], "2027-01-15T08:00:00Z");
        assert_eq!(body["alerts"].as_array().unwrap().len(), 1);
    }
}
