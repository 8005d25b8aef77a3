//! Every metric stead exports, in one table: its name, kind, help text and
//! the label values it can take. [`handle`] installs the Prometheus
//! recorder once per process, describes every metric (so each series has a
//! `# HELP` line) and registers every counter at zero with each of its
//! label values, so `increase(...) > 0` alerts see the first event too.
//! `docs/operations.md` documents each metric; a test checks the two agree.

use crate::core::errors::PortName;
use std::sync::OnceLock;

use crate::core::plan::Decision;
use crate::core::recovery::{Verdict, Why};
use crate::engine::tick::Check;
use crate::engine::worker::TaskEnd;

/// A counter, gauge, its labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One exported metric.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// The label a counter is split by, if any (gauges set their own).
    pub label: Option<&'static str>,
}

const fn counter(name: &'static str, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Counter,
        help,
        label: None,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Gauge,
        help,
        label: None,
    }
}

const fn labelled(metric: Metric, label: &'static str) -> Metric {
    Metric {
        label: Some(label),
        ..metric
    }
}

/// Every metric, in the order `docs/operations.md` lists them.
pub const METRICS: &[Metric] = &[
    gauge(
        "stead_last_tick_timestamp_seconds",
        "Unix time of the end of the last tick (set even when checks failed).",
    ),
    gauge(
        "stead_tick_duration_seconds",
        "Wall time of the last tick, in seconds.",
    ),
    labelled(
        counter(
            "stead_check_failures_total",
            "Checks of the control loop that failed, by check.",
        ),
        "check",
    ),
    gauge("stead_queue_depth", "Queued tasks."),
    gauge("stead_instances", "Instances by state."),
    gauge(
        "stead_budget_delays_in_force",
        "Generations whose next start is delayed by the crash-loop budget (R10).",
    ),
    labelled(
        gauge(
            "stead_rollout_halted",
            "1 while the service type's rollout is halted (by a failed upgrade, a bake's revert, \
             `stead rollout undo`, an operator's halt or the catalog file), else 0 (#55).",
        ),
        "service_type",
    ),
    gauge(
        "stead_reconciler_lease_held",
        "1 while this process holds the reconciler lease (C2), else 0.",
    ),
    gauge(
        "stead_identity_twin",
        "1 while a live twin (the same identity at another site: a copied state_dir) holds the reconciler lease this standby waits for (T1), else 0.",
    ),
    counter(
        "stead_identity_twins_total",
        "Live twins found holding the reconciler lease: the same identity at another site renewed it after this process started (T1).",
    ),
    gauge(
        "stead_orphan_releases",
        "Live releases no instance owns, at the last drift check (C5); never deleted.",
    ),
    gauge(
        "stead_unknown_type_instances",
        "Ready instances whose service type the catalog does not list, at the last version-drift check (C8); never upgraded.",
    ),
    counter(
        "stead_recoveries_total",
        "Services the recovery pass started or restarted.",
    ),
    counter(
        "stead_recovery_start_races_total",
        "Starts that failed because the runtime's own restart policy brought the container up first: nothing was charged to the budget and no error reported (R11).",
    ),
    counter(
        "stead_starts_total",
        "Starts of a down container by the recovery pass (R9).",
    ),
    counter(
        "stead_restarts_total",
        "Restarts of an unhealthy container by the recovery pass (R12).",
    ),
    counter(
        "stead_dropped_services_retired_total",
        "Services an upgrade retired because the instance's new catalog version no longer lists them (withdrawn, stopped, removed, dropped from ACTIVE; named volumes kept).",
    ),
    counter(
        "stead_withdrawals_total",
        "Withdrawals of a route that the proxy confirmed.",
    ),
    counter(
        "stead_hosts_refused_total",
        "Public host names a publication left out because another live instance holds them (#54).",
    ),
    labelled(
        counter(
            "stead_withdrawal_failures_total",
            "Withdrawals the proxy did not confirm, by why the route was being withdrawn.",
        ),
        "reason",
    ),
    labelled(
        counter(
            "stead_publication_failures_total",
            "Publications the proxy did not confirm, by why the route was being published.",
        ),
        "reason",
    ),
    labelled(
        counter(
            "stead_port_errors_total",
            "Failures the ports reported to the recovery pass and the workers, by port and kind.",
        ),
        "port",
    ),
    labelled(
        counter(
            "stead_recovery_verdicts_total",
            "Services recovered (by a pass or a wake-up), by how their recovery ended.",
        ),
        "verdict",
    ),
    labelled(
        counter(
            "stead_recovery_steps_total",
            "Steps the recovery took for a reason other than observing, by reason.",
        ),
        "reason",
    ),
    labelled(
        counter(
            "stead_recovery_busy_skips_total",
            "Instances a recovery skipped because another process held their lock (R3), by what was recovering: the periodic pass or a wake-up.",
        ),
        "by",
    ),
    labelled(
        counter(
            "stead_decisions_total",
            "Decisions of the control checks carried out, by kind.",
        ),
        "decision",
    ),
    labelled(
        counter(
            "stead_reverts_total",
            "Instances put back on their predecessors (#40): `bake`, a successor failed while \
             baking (the type's rollout halted); `upgrade`, an upgrade failed after switching \
             some services; `undo`, an operator's `stead rollout undo`.",
        ),
        "cause",
    ),
    counter(
        "stead_retirements_total",
        "Superseded containers retired after their successor served (R15).",
    ),
    labelled(
        counter(
            "stead_tasks_total",
            "Tasks run by this process's workers, by kind and outcome.",
        ),
        "kind",
    ),
    counter(
        "stead_provision_versions_recorded_total",
        "Provisions that recorded their worker's catalog version because the instance named another (the catalog moved between its creation and its provisioning).",
    ),
    counter(
        "stead_docker_events_total",
        "Docker events that triggered a targeted recovery pass.",
    ),
    counter(
        "stead_wakeups_dropped_total",
        "Runtime events that found the wake-up queue full (T7); the next pass covers them.",
    ),
    counter(
        "stead_docker_api_calls_total",
        "Docker Engine API requests.",
    ),
    counter(
        "stead_caddy_route_writes_total",
        "Writes of the routes array Caddy accepted; each is one reload of Caddy's config.",
    ),
    labelled(
        counter(
            "stead_clock_jumps_total",
            "Ticks whose reading of the database's clock was more than 5 s from where this process's clocks put it, by cause: stood_still (this host was suspended) or database (its clock stepped) (#41).",
        ),
        "cause",
    ),
    counter(
        "stead_caddy_config_lost_total",
        "Times the watcher between ticks found Caddy without stead's servers (reloaded with another config, restarted without --resume) and woke the reconciler to republish (#43).",
    ),
    counter(
        "stead_traffic_plane_recreated_total",
        "Times the proxy had lost stead's server and routes (restarted without its config) and stead recreated them (T5).",
    ),
    labelled(
        counter("stead_notifications_total", "Notifications sent, by event."),
        "event",
    ),
    labelled(
        counter(
            "stead_catalog_reloads_total",
            "Catalog reloads (SIGHUP, stead reload), by result: ok or refused.",
        ),
        "result",
    ),
    counter(
        "stead_events_written_total",
        "Events written to the event log (#42).",
    ),
    counter(
        "stead_events_dropped_total",
        "Events the event log dropped rather than make a pass wait: its buffer was full, or the store refused a batch every time.",
    ),
    counter(
        "stead_flight_recorder_dropped_total",
        "Instance passes the flight recorder could not record (#44): its queue was full, a line could not be written, or its directory could not be made; the pass itself went on.",
    ),
    counter(
        "stead_events_pruned_total",
        "Events deleted from the event log past events.retention_days.",
    ),
    counter(
        "stead_tasks_pruned_total",
        "Finished tasks deleted from the queue past events.retention_days.",
    ),
    labelled(
        counter(
            "stead_webhook_deliveries_total",
            "Posts of an event to a webhook, by webhook and outcome (delivered: a 2xx answer; failed: any other status, a timeout or a broken connection, posted again after a backoff).",
        ),
        "webhook",
    ),
];

/// Why a withdrawal can be asked for: the `reason` values of
/// `stead_withdrawal_failures_total`.
pub const WITHDRAWAL_REASONS: [Why; 7] = [
    Why::Inhibited,
    Why::RetryWithdrawal,
    Why::Gone,
    Why::FailClosed,
    Why::Unhealthy,
    Why::VerificationFailed,
    Why::Stopped,
];

/// Why a publication can be asked for: the `reason` values of
/// `stead_publication_failures_total`.
pub const PUBLICATION_REASONS: [Why; 3] =
    [Why::NewExecution, Why::BindsChanged, Why::RouteUnvouched];

/// Why instances are put back on their predecessors: the `cause` values
/// of `stead_reverts_total`.
pub const REVERT_CAUSES: [&str; 4] = ["bake", "upgrade", "undo", "helm_bake"];

/// Events the notifier sends.
pub const NOTIFICATION_EVENTS: [&str; 1] = ["drift.release_missing"];

/// The process-wide Prometheus recorder, installed once (several daemons
/// in one test process share it), with every metric described and every
/// counter at zero.
pub fn handle() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; then our
            // handle renders nothing, which the metrics tests would show.
            if metrics::set_global_recorder(recorder).is_ok() {
                register();
            }
            handle
        })
        .clone()
}

/// Describes every metric and registers every counter series at zero.
fn register() {
    for metric in METRICS {
        match metric.kind {
            Kind::Counter => metrics::describe_counter!(metric.name, metric.help),
            Kind::Gauge => metrics::describe_gauge!(metric.name, metric.help),
        }
    }
    for metric in METRICS.iter().filter(|m| m.kind == Kind::Counter) {
        for labels in label_sets(metric.name) {
            metrics::counter!(metric.name, &labels).increment(0);
        }
    }
}

/// Every label set a counter is registered with at start.
fn label_sets(name: &str) -> Vec<Vec<(&'static str, String)>> {
    let one = |label: &'static str, values: Vec<&'static str>| {
        values
            .into_iter()
            .map(|v| vec![(label, v.to_owned())])
            .collect()
    };
    match name {
        "stead_check_failures_total" => one("check", Check::ALL.map(Check::as_str).to_vec()),
        "stead_withdrawal_failures_total" => {
            one("reason", WITHDRAWAL_REASONS.map(Why::label).to_vec())
        }
        "stead_publication_failures_total" => {
            one("reason", PUBLICATION_REASONS.map(Why::label).to_vec())
        }
        "stead_notifications_total" => one("event", NOTIFICATION_EVENTS.to_vec()),
        "stead_recovery_verdicts_total" => one("verdict", Verdict::LABELS.to_vec()),
        "stead_recovery_steps_total" => one(
            "reason",
            Why::ALL
                .into_iter()
                .filter(|w| *w != Why::Observe)
                .map(Why::label)
                .collect(),
        ),
        "stead_decisions_total" => one("decision", Decision::LABELS.to_vec()),
        "stead_reverts_total" => one("cause", REVERT_CAUSES.to_vec()),
        "stead_recovery_busy_skips_total" => one("by", vec!["pass", "wakeup"]),
        "stead_catalog_reloads_total" => one("result", vec!["ok", "refused"]),
        "stead_clock_jumps_total" => one("cause", vec!["stood_still", "database"]),
        "stead_port_errors_total" => PortName::ALL
            .iter()
            .flat_map(|port| {
                port.kinds().iter().map(move |kind| {
                    vec![
                        ("port", port.as_str().to_owned()),
                        ("kind", kind.as_str().to_owned()),
                    ]
                })
            })
            .collect(),
        "stead_tasks_total" => crate::core::fleet::TaskKind::ALL
            .iter()
            .flat_map(|kind| {
                TaskEnd::LABELS.iter().map(move |outcome| {
                    vec![
                        ("kind", kind.as_str().to_owned()),
                        ("outcome", (*outcome).to_owned()),
                    ]
                })
            })
            .collect(),
        _ => vec![Vec::new()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_has_help_and_every_counter_starts_at_zero() {
        let text = handle().render();
        let mut typed = 0;
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = line.split_whitespace().nth(2).expect("a name");
            typed += 1;
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no # HELP:\n{text}"
            );
        }
        assert!(typed > 0, "nothing rendered:\n{text}");
        for metric in METRICS.iter().filter(|m| m.kind == Kind::Counter) {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(metric.name) && !l.starts_with('#')),
                "{} not registered:\n{text}",
                metric.name
            );
        }
        assert!(
            text.contains("stead_tasks_total{kind=\"upgrade\",outcome=\"failed\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("stead_publication_failures_total{reason=\"new_execution\"} 0"),
            "{text}"
        );
    }

    /// A labelled counter is registered with each of its label's values,
    /// never as one series without the label: `increase(...) > 0` on
    /// `{label="value"}` must see the first event too.
    #[test]
    fn every_labelled_counter_starts_at_zero_for_each_label_value() {
        for metric in METRICS.iter().filter(|m| m.kind == Kind::Counter) {
            let Some(label) = metric.label else {
                continue;
            };
            if metric.name == "stead_webhook_deliveries_total" {
                // Its label values are the configured webhooks: the
                // daemon registers each at zero as it starts them
                // (`daemon/webhooks.rs`).
                continue;
            }
            let sets = label_sets(metric.name);
            assert!(
                sets.iter()
                    .all(|set| set.iter().any(|(name, _)| *name == label)),
                "{} is split by {label:?} but registered without it: {sets:?}",
                metric.name
            );
        }
        let text = handle().render();
        for cause in REVERT_CAUSES {
            assert!(
                text.contains(&format!("stead_reverts_total{{cause=\"{cause}\"}} 0")),
                "{cause}: {text}"
            );
        }
    }

    /// Every `metrics::counter!("…")` and `gauge!("…")` in `src/`.
    fn names_used_in(dir: &std::path::Path, out: &mut std::collections::BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                names_used_in(&path, out);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for macro_call in ["counter!(", "gauge!(", "histogram!("] {
                for (i, _) in text.match_indices(macro_call) {
                    let rest = text[i + macro_call.len()..].trim_start();
                    if let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                        if name.starts_with("stead_") {
                            out.insert(name.to_owned());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_metric_the_code_records_is_in_the_table() {
        let mut used = std::collections::BTreeSet::new();
        names_used_in(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut used,
        );
        assert!(used.len() > 10, "{used:?}");
        for name in used {
            assert!(
                METRICS.iter().any(|m| m.name == name),
                "{name} is recorded but not in METRICS (no # HELP, not registered at zero)"
            );
        }
    }

    #[test]
    fn every_metric_is_documented_in_the_operations_guide() {
        let guide = include_str!("../../docs/operations.md");
        for metric in METRICS {
            assert!(
                guide.contains(&format!("| `{}", metric.name)),
                "docs/operations.md lacks {}",
                metric.name
            );
        }
    }
}
