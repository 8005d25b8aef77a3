//! Webhook delivery (#42) against a real HTTP receiver on loopback and a
//! real SQLite store: signed bodies, retries after a 500, a hang and a
//! closed connection, each event acknowledged once and in order, and a
//! restarted notifier resuming from its durable cursor.
//!
//! The receiver is `support_services::webhook_receiver`, which can also
//! hang after reading a request or close the connection without
//! answering. Waits are generous deadlines over polling, never a fixed
//! sleep.
#![cfg(all(feature = "io", not(madsim)))]

mod support;
mod support_services;

use std::sync::Arc;
use std::time::Duration;

use stead::adapters::webhook::{signature, WebhookTarget};
use stead::core::event_log::{Event, EventKind};
use stead::core::types::{InstanceName, Timestamp};
use stead::core::webhook::WebhookFormat;
use stead::daemon::webhooks::{DeliveryPacing, WebhookNotifier};
use stead::engine::SystemClock;
use stead::ports::Store;
use support_services::webhook_receiver::{Answer, Receiver};
use tokio::sync::watch;

/// Bound on any wait of a test; every wait ends long before on a
/// working build.
const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(10);
const SECRET: &[u8] = b"correct horse battery staple";

/// Pacing fast enough for a test: backoffs of tens of milliseconds.
fn fast() -> DeliveryPacing {
    DeliveryPacing {
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        idle_poll: Duration::from_millis(20),
        gap_grace: Duration::from_secs(1),
    }
}

fn target(name: &str, url: &str, timeout: Duration) -> WebhookTarget {
    WebhookTarget {
        name: name.to_owned(),
        url: url.to_owned(),
        secret: Some(SECRET.to_vec()),
        format: WebhookFormat::Stead,
        timeout,
    }
}

fn notifier(store: &Arc<dyn Store>, target: WebhookTarget) -> WebhookNotifier {
    WebhookNotifier::new(
        store.clone(),
        Arc::new(SystemClock),
        target,
        vec![EventKind::CrashLoopDelay, EventKind::Halt],
        fast(),
    )
    .unwrap()
}

/// A running notifier, stopped and awaited by [`Running::stop`].
struct Running {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn start(notifier: WebhookNotifier) -> Self {
        notifier.start_cursor().await.unwrap();
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(async move { notifier.run(stopped).await });
        Self { stop, task }
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("a notifier stops when told")
            .unwrap();
    }
}

fn event(kind: EventKind, n: i64) -> Event {
    let at = Timestamp::from_second(1_800_000_000 + n).unwrap();
    let mut event = Event::new(kind, at, "R10", format!("{kind} number {n}"))
        .instance(&InstanceName::new("wiki1"));
    event.writer = "host-1#a".into();
    event
}

/// Appends `kinds` as events; returns their ids, in order.
async fn log(store: &Arc<dyn Store>, kinds: &[EventKind]) -> Vec<i64> {
    let before = newest_id(store).await;
    let events: Vec<Event> = kinds
        .iter()
        .enumerate()
        .map(|(n, kind)| event(*kind, n as i64))
        .collect();
    store.append_events(&events).await.unwrap();
    (1..=kinds.len() as i64).map(|n| before + n).collect()
}

async fn newest_id(store: &Arc<dyn Store>) -> i64 {
    let read = store
        .events(&stead::core::event_log::EventFilter {
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    read.rows.last().map_or(0, |e| e.id)
}

/// Polls `done` until it holds, or fails the test at [`DEADLINE`] with
/// `what`.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(DEADLINE, async {
        while !done() {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "gave up waiting: {what}");
}

/// Waits until the webhook's stored cursor reaches `id`.
async fn wait_for_cursor(store: &Arc<dyn Store>, webhook: &str, id: i64) {
    let waited = tokio::time::timeout(DEADLINE, async {
        while store.webhook_cursor(webhook).await.unwrap() != Some(id) {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the cursor of {webhook} never reached {id}");
}

#[tokio::test]
async fn wanted_events_are_posted_in_order_signed_over_their_exact_bodies() {
    let s = support::sqlite().await;
    let (receiver, url) = Receiver::start(&[]).await;
    let running = Running::start(notifier(&s.store, target("signed", &url, DEADLINE))).await;
    let ids = log(
        &s.store,
        &[
            EventKind::Start,
            EventKind::CrashLoopDelay,
            EventKind::Publish,
            EventKind::Halt,
            EventKind::Stop,
        ],
    )
    .await;
    // The cursor passes over the unwanted events after the last wanted one.
    wait_for_cursor(&s.store, "signed", ids[4]).await;
    running.stop().await;
    assert_eq!(receiver.acknowledged_ids(), [ids[1], ids[3]]);
    for request in &receiver.acknowledged() {
        assert_eq!(
            request.signature.as_deref(),
            Some(signature(SECRET, &request.body).as_str()),
            "the signature is over the exact bytes received"
        );
        let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(body["webhook"], "signed");
        assert_eq!(body["event"]["id"], request.event_id);
        assert_eq!(body["event"]["instance"], "wiki1");
    }
    let kinds: Vec<String> = receiver
        .acknowledged()
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["event"]["kind"]
                .to_string()
        })
        .collect();
    assert_eq!(kinds, ["\"crash_loop_delay\"", "\"halt\""]);
}

#[tokio::test]
async fn a_receiver_that_answers_500_twice_gets_each_event_once_in_order_after_retries() {
    let metrics = stead::daemon::metrics_handle();
    let s = support::sqlite().await;
    let (receiver, url) = Receiver::start(&[Answer::Status500, Answer::Status500]).await;
    let running = Running::start(notifier(&s.store, target("flaky", &url, DEADLINE))).await;
    let ids = log(
        &s.store,
        &[EventKind::Halt, EventKind::CrashLoopDelay, EventKind::Halt],
    )
    .await;
    wait_for_cursor(&s.store, "flaky", ids[2]).await;
    running.stop().await;
    assert_eq!(receiver.acknowledged_ids(), ids, "each once, in order");
    assert_eq!(
        receiver.attempted_ids(),
        [ids[0], ids[0], ids[0], ids[1], ids[2]],
        "later events waited behind the failing one"
    );
    let text = metrics.render();
    for line in [
        "stead_webhook_deliveries_total{webhook=\"flaky\",outcome=\"failed\"} 2",
        "stead_webhook_deliveries_total{webhook=\"flaky\",outcome=\"delivered\"} 3",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[tokio::test]
async fn a_receiver_that_hangs_is_timed_out_and_posted_again() {
    let s = support::sqlite().await;
    let (receiver, url) = Receiver::start(&[Answer::Hang, Answer::Hang]).await;
    let timeout = Duration::from_millis(200);
    let running = Running::start(notifier(&s.store, target("hangs", &url, timeout))).await;
    let ids = log(&s.store, &[EventKind::CrashLoopDelay, EventKind::Halt]).await;
    wait_for_cursor(&s.store, "hangs", ids[1]).await;
    running.stop().await;
    assert_eq!(receiver.acknowledged_ids(), ids);
    assert_eq!(receiver.attempted_ids(), [ids[0], ids[0], ids[0], ids[1]]);
}

#[tokio::test]
async fn a_receiver_that_closes_the_connection_is_posted_again() {
    let s = support::sqlite().await;
    let (receiver, url) = Receiver::start(&[Answer::Close, Answer::Ok, Answer::Close]).await;
    let running = Running::start(notifier(&s.store, target("closes", &url, DEADLINE))).await;
    let ids = log(&s.store, &[EventKind::Halt, EventKind::CrashLoopDelay]).await;
    wait_for_cursor(&s.store, "closes", ids[1]).await;
    running.stop().await;
    assert_eq!(receiver.acknowledged_ids(), ids);
    assert_eq!(receiver.attempted_ids(), [ids[0], ids[0], ids[1], ids[1]]);
}

#[tokio::test]
async fn a_restarted_notifier_resumes_from_its_cursor_and_repeats_nothing_acknowledged() {
    let s = support::sqlite().await;
    let (receiver, url) = Receiver::start(&[]).await;
    let first = Running::start(notifier(&s.store, target("resumes", &url, DEADLINE))).await;
    let before = log(&s.store, &[EventKind::Halt, EventKind::CrashLoopDelay]).await;
    wait_for_cursor(&s.store, "resumes", before[1]).await;
    first.stop().await;
    // Logged while no notifier runs, as while a daemon is down.
    let during = log(&s.store, &[EventKind::CrashLoopDelay, EventKind::Halt]).await;
    // A new process: a new connection to the same database.
    let reopened = s.reopen().await;
    let second = Running::start(notifier(&reopened, target("resumes", &url, DEADLINE))).await;
    wait_for_cursor(&reopened, "resumes", during[1]).await;
    second.stop().await;
    let all: Vec<i64> = before.iter().chain(&during).copied().collect();
    assert_eq!(
        receiver.acknowledged_ids(),
        all,
        "nothing twice, nothing lost"
    );
}

#[tokio::test]
async fn a_notifier_told_to_stop_mid_post_finishes_it_and_its_successor_repeats_nothing() {
    let s = support::sqlite().await;
    let (receiver, url) = Receiver::start(&[Answer::Held]).await;
    let first = Running::start(notifier(&s.store, target("graceful", &url, DEADLINE))).await;
    let ids = log(&s.store, &[EventKind::Halt]).await;
    wait_until("the post is in flight", || {
        receiver.answered().iter().any(|(_, a)| *a == Answer::Held)
    })
    .await;
    // A graceful stop (SIGTERM) while the receiver still holds the post;
    // it answers 200 after.
    first.stop.send(true).unwrap();
    receiver.release();
    tokio::time::timeout(DEADLINE, first.task)
        .await
        .expect("a notifier stops when its post ends")
        .unwrap();
    assert_eq!(
        s.store.webhook_cursor("graceful").await.unwrap(),
        Some(ids[0]),
        "the acknowledged post's cursor is stored before it stops"
    );
    // The next start (a restart) sends it no more.
    let later = log(&s.store, &[EventKind::CrashLoopDelay]).await;
    let second = Running::start(notifier(&s.store, target("graceful", &url, DEADLINE))).await;
    wait_for_cursor(&s.store, "graceful", later[0]).await;
    second.stop().await;
    assert_eq!(receiver.acknowledged_ids(), [ids[0], later[0]], "each once");
}

#[tokio::test]
async fn an_event_acknowledged_but_not_yet_recorded_is_posted_again_after_a_restart() {
    let s = support::sqlite().await;
    let (receiver, url) = Receiver::start(&[]).await;
    let ids = log(&s.store, &[EventKind::Halt]).await;
    // As if a daemon was killed between the receiver's answer and the
    // cursor's write: the cursor still stands before the event.
    assert!(s
        .store
        .advance_webhook_cursor("again", None, ids[0] - 1, Timestamp::UNIX_EPOCH)
        .await
        .unwrap());
    let running = Running::start(notifier(&s.store, target("again", &url, DEADLINE))).await;
    wait_for_cursor(&s.store, "again", ids[0]).await;
    running.stop().await;
    assert_eq!(receiver.acknowledged_ids(), ids);
}

#[tokio::test]
async fn a_new_webhook_is_sent_what_happens_after_its_first_start_not_the_history() {
    let s = support::sqlite().await;
    let (receiver, url) = Receiver::start(&[]).await;
    let history = log(&s.store, &[EventKind::Halt, EventKind::Halt]).await;
    let running = Running::start(notifier(&s.store, target("new", &url, DEADLINE))).await;
    assert_eq!(
        s.store.webhook_cursor("new").await.unwrap(),
        Some(history[1])
    );
    let ids = log(&s.store, &[EventKind::CrashLoopDelay]).await;
    wait_until("the new event is delivered", || {
        receiver.acknowledged_ids() == ids
    })
    .await;
    running.stop().await;
    assert_eq!(receiver.attempted_ids(), ids);
}

/// A daemon config on a fresh state directory under `dir` with one
/// webhook whose key is `dir/webhook.key`. No Docker answers: its socket
/// is a stale one nobody listens on (none is needed to build).
fn daemon_config(dir: &std::path::Path) -> stead::config::daemon::DaemonConfig {
    drop(std::os::unix::net::UnixListener::bind(dir.join("no-docker.sock")).unwrap());
    let catalog = dir.join("catalog.toml");
    std::fs::write(
        &catalog,
        "[types.web]\nversion = \"1\"\n[[types.web.services]]\nname = \"web\"\nimage = \"x:1\"\n",
    )
    .unwrap();
    let doc = format!(
        "state_dir = \"{dir}/state\"\ncatalog = \"{catalog}\"\nadmin_listen = \"\"\n\
         [docker]\nsocket = \"{dir}/no-docker.sock\"\n\
         [[webhooks]]\nname = \"pager\"\nurl = \"http://127.0.0.1:9/hook\"\n\
         secret_file = \"{dir}/webhook.key\"\n",
        dir = dir.display(),
        catalog = catalog.display(),
    );
    stead::config::daemon::parse(&doc, "stead.toml", &[]).unwrap()
}

#[tokio::test]
async fn a_daemon_reads_each_webhooks_key_at_start_and_refuses_a_missing_or_empty_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = daemon_config(dir.path());
    let missing = stead::daemon::Daemon::build(config.clone())
        .await
        .err()
        .expect("a missing key stops the start")
        .to_string();
    assert!(
        missing.starts_with("webhooks[0].secret_file = ") && missing.contains("cannot open"),
        "{missing}"
    );
    std::fs::write(dir.path().join("webhook.key"), "\n").unwrap();
    let empty = stead::daemon::Daemon::build(config.clone())
        .await
        .err()
        .expect("an empty key stops the start")
        .to_string();
    assert!(empty.contains("is empty"), "{empty}");
    std::fs::write(dir.path().join("webhook.key"), "k3y\n").unwrap();
    let daemon = stead::daemon::Daemon::build(config).await.unwrap();
    let names: Vec<&str> = daemon.webhooks.iter().map(|w| w.name()).collect();
    assert_eq!(names, ["pager"]);
}
