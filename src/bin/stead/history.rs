//! The commands that read the event log (#42): `stead events` and `stead
//! timeline`. They read the configured database; no daemon is needed.

use std::time::Duration;

use stead::core::event_log::{Event, EventFilter, EventKind, LoggedEvent};
use stead::core::types::{InstanceName, Timestamp};
use stead::daemon::event_log::{render_event, render_timeline, EventView};
use stead::daemon::DaemonConfig;
use stead::ports::Store;

use crate::output::{complain, say, CliError, EXIT_OK};

/// How often `--follow` reads the log again.
const FOLLOW_POLL: Duration = Duration::from_secs(1);
/// Most events one `--follow` read prints before reading again.
const FOLLOW_BATCH_MAX: u32 = 1000;

/// What `stead events` asks for.
pub struct EventQuery {
    pub instance: Option<String>,
    pub team: Option<String>,
    pub kind: Option<EventKind>,
    pub since: Option<Duration>,
    pub limit: u32,
}

/// The instant `since` ago, by the database's clock (the clock the events
/// were written by, T2).
async fn since_instant(
    store: &dyn Store,
    since: Option<Duration>,
) -> Result<Option<Timestamp>, CliError> {
    let Some(since) = since else {
        return Ok(None);
    };
    let now = store.database_now().await?;
    let since = jiff::SignedDuration::try_from(since)
        .map_err(|e| CliError::from(format!("--since: {e}")))?;
    Ok(Some(now.checked_sub(since).unwrap_or(Timestamp::MIN)))
}

/// Prints one read's events; the id of the last one, if any.
fn print(rows: &[LoggedEvent], bad: &[stead::ports::StoreError], json: bool) -> Option<i64> {
    for error in bad {
        complain(&format!("skipped a bad row: {error}"));
    }
    for logged in rows {
        if json {
            // Each object on one line, so a reader can stream them.
            match serde_json::to_string(&EventView::from(logged)) {
                Ok(line) => say(line),
                Err(e) => complain(&format!("cannot serialise event {}: {e}", logged.id)),
            }
        } else {
            say(render_event(logged));
        }
    }
    rows.last().map(|l| l.id)
}

pub async fn events(
    config: &DaemonConfig,
    query: EventQuery,
    follow: bool,
    json: bool,
) -> Result<u8, CliError> {
    let store = stead::daemon::open_store(config).await?;
    let mut filter = EventFilter {
        instance: query.instance.as_deref().map(InstanceName::new),
        team: query.team.clone(),
        kind: query.kind,
        since: since_instant(store.as_ref(), query.since).await?,
        after_id: None,
        limit: query.limit,
    };
    let read = store.events(&filter).await?;
    if read.rows.is_empty() && !follow {
        if let Some(name) = &query.instance {
            refuse_unknown(store.as_ref(), name).await?;
        }
    }
    let mut last = print(&read.rows, &read.bad, json);
    if read.rows.is_empty() && !json && !follow {
        say("no events");
    }
    if !follow {
        return Ok(EXIT_OK);
    }
    // Read on after the last event printed; the very first read of an
    // empty log starts from the beginning.
    filter.limit = FOLLOW_BATCH_MAX;
    loop {
        filter.after_id = Some(last.unwrap_or(0));
        tokio::time::sleep(FOLLOW_POLL).await;
        match store.events(&filter).await {
            Ok(read) => {
                if let Some(id) = print(&read.rows, &read.bad, json) {
                    last = Some(id);
                }
            }
            // A database that goes away for a while is read again.
            Err(e) => complain(&format!("reading the event log: {e}; trying again")),
        }
    }
}

pub async fn timeline(
    config: &DaemonConfig,
    name: &str,
    since: Option<Duration>,
    limit: u32,
) -> Result<u8, CliError> {
    let store = stead::daemon::open_store(config).await?;
    let filter = EventFilter {
        instance: Some(InstanceName::new(name)),
        since: since_instant(store.as_ref(), since).await?,
        limit,
        ..Default::default()
    };
    let read = store.events(&filter).await?;
    if read.rows.is_empty() {
        refuse_unknown(store.as_ref(), name).await?;
    }
    for error in &read.bad {
        complain(&format!("skipped a bad row: {error}"));
    }
    say(render_timeline(name, &read.rows));
    Ok(EXIT_OK)
}

/// A name no instance ever had (none of any state, deleted included) is
/// not found (exit 3), as for every command that names an instance; a
/// known one with no events is just quiet.
async fn refuse_unknown(store: &dyn Store, name: &str) -> Result<(), CliError> {
    let instances = store.list_instances().await?;
    if instances.rows.iter().any(|i| i.name.as_str() == name) {
        return Ok(());
    }
    Err(stead::ops::no_such_instance(name).into())
}

/// Records an operator's intervention in the event log (#42), by the
/// database's clock, written by `operator:<user>`. Best-effort: the
/// intervention is done whatever becomes of its record, and a failure to
/// write it is said on standard error.
pub async fn record(store: &dyn Store, events: impl IntoIterator<Item = Event>) {
    use stead::ports::Clock;
    let at = match store.database_now().await {
        Ok(now) => now,
        Err(_) => stead::engine::SystemClock.now(),
    };
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".to_owned());
    let writer: String = format!("operator:{user}").chars().take(128).collect();
    let events: Vec<Event> = events
        .into_iter()
        .map(|mut e| {
            e.at = at;
            e.writer.clone_from(&writer);
            e
        })
        .collect();
    if let Err(e) = store.append_events(&events).await {
        complain(&format!("the event log was not written: {e}"));
    }
}

/// An operator's event: at no time yet ([`record`] stamps it).
pub fn by_operator(kind: EventKind, message: impl Into<String>) -> Event {
    Event::new(kind, Timestamp::UNIX_EPOCH, "operator", message)
}
