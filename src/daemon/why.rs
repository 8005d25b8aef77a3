//! `stead instance why NAME` (#42): in plain sentences, what each service
//! of an instance is waiting for. Read from the very [`Status`] `stead
//! status` builds (the store, the runtime, the proxy and, from a running
//! daemon, its crash-loop budgets), never from a second reading of them.

use crate::core::types::Timestamp;

use super::human::relative;
use super::status::{Status, StatusRow};

/// What `why` says of `instance`, one sentence a line; `None` when the
/// status knows no such (live) instance.
pub fn explain(status: &Status, instance: &str) -> Option<Vec<String>> {
    let now = status.generated_at.parse::<Timestamp>().ok();
    let rows: Vec<&StatusRow> = status
        .rows
        .iter()
        .filter(|r| r.instance == instance)
        .collect();
    let release = status.releases.iter().find(|r| r.instance == instance);
    if rows.is_empty() && release.is_none() {
        return None;
    }
    let mut said = Vec::new();
    if let Some(release) = release {
        said.push(format!(
            "{instance} is a Helm release in namespace {}, which Kubernetes runs and recovers; \
             Helm says: {}{}",
            release.namespace,
            release.release,
            if release.description.is_empty() {
                String::new()
            } else {
                format!(" ({})", release.description)
            }
        ));
    }
    for row in &rows {
        said.extend(explain_row(row, status.budgets_live, now));
    }
    for service_type in &status.catalog {
        for pending in service_type
            .pending
            .iter()
            .filter(|p| p.instance == instance)
        {
            said.push(format!(
                "its upgrade from {} to {} ({}): {}",
                pending.from, pending.to, service_type.service_type, pending.progress
            ));
        }
    }
    if let Some(expires) = rows.first().and_then(|r| r.expires_at.as_deref()) {
        let at = match (expires.parse::<Timestamp>(), now) {
            (Ok(t), Some(now)) => format!("{expires} ({})", relative(t, now)),
            _ => expires.to_owned(),
        };
        said.push(format!(
            "its TTL ends at {at}; then it is deleted, containers, routes and all (C7)"
        ));
    }
    if !status.budgets_live && rows.iter().any(|r| r.service != "-") {
        said.push(
            "crash-loop budgets live in the running daemon's memory (R17) and none answered; \
             `stead instance why --live` asks it"
                .to_owned(),
        );
    }
    Some(said)
}

/// What one service (one row of `stead status`) waits for.
fn explain_row(row: &StatusRow, budgets_live: bool, now: Option<Timestamp>) -> Vec<String> {
    let name = &row.instance;
    if row.service == "-" {
        return vec![if row.condition.starts_with("failed") {
            format!("{name} {}", row.condition)
        } else {
            format!(
                "{name} has no container yet: it is {} and its provision has not created one",
                row.state
            )
        }];
    }
    let service = format!("{name}/{}", row.service);
    let mut said = Vec::new();
    for refused in &row.hosts_refused {
        said.push(format!(
            "{service} is not served under {}: the host is reserved for instance {} until \
             that instance is deleted (#54); `stead instance delete {}` frees it",
            refused.host, refused.holder, refused.holder
        ));
    }
    for hold in &row.inhibitions {
        if hold.starts_with("retirement-pending") {
            said.push(format!(
                "{service}: a superseded container waits to be retired once its successor \
                 serves ({hold}, R15)"
            ));
        } else {
            said.push(format!(
                "{service} is held ({hold}): it is never started while the hold stands (R5); \
                 `stead instance release {name} --service {}` lifts it",
                row.service
            ));
        }
    }
    if let Some(next) = &row.next_attempt {
        let when = match (next.parse::<Timestamp>(), now) {
            (Ok(t), Some(now)) => format!("{next} ({})", relative(t, now)),
            _ => next.clone(),
        };
        let failures = match row.failures {
            Some(n) => format!("{n} failure(s) in a row, "),
            None => String::new(),
        };
        said.push(format!(
            "{service} waits for its crash-loop budget: {failures}backoff until {when} (R10)"
        ));
    }
    let condition = row.condition.as_str();
    let why = match condition {
        "serving" => format!("{service} serves: its container runs and its route is published"),
        "stopped" | "stopping" => format!(
            "{service} is {condition}: the instance's intent is stopped (R4); `stead instance \
             start {name}` runs it again"
        ),
        "running, not routed" => format!(
            "{service} runs but is not routed: the next pass publishes it once its readiness \
             probe passes (R13)"
        ),
        "running" => format!(
            "{service} runs (its route could not be read: {})",
            row.publication
        ),
        c if c.starts_with("recovering") => {
            format!("{service} is {c}: the runtime is (re)starting it; the next pass looks again")
        }
        c if c.starts_with("down") && row.next_attempt.is_none() && row.inhibitions.is_empty() => {
            if budgets_live {
                format!("{service} is {c}: the next pass starts it (R9)")
            } else {
                format!(
                    "{service} is {c}: the next pass starts it (R9) unless its crash-loop \
                     budget delays it"
                )
            }
        }
        c => format!("{service} is {c}"),
    };
    said.push(why);
    said
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::status::{PendingUpgrade, TypeStatus};

    fn row(service: &str, condition: &str) -> StatusRow {
        StatusRow {
            instance: "wiki1".into(),
            state: "ready".into(),
            intent: "running".into(),
            version: "1".into(),
            service: service.into(),
            container: "c0ffee".into(),
            runtime: "exited".into(),
            condition: condition.into(),
            failures: None,
            next_attempt: None,
            exit_code: None,
            exited_at: None,
            last_decision: None,
            last_decision_at: None,
            publication: "withdrawn".into(),
            binds: String::new(),
            inhibitions: Vec::new(),
            expires_at: None,
            hosts_refused: Vec::new(),
        }
    }

    fn status(rows: Vec<StatusRow>) -> Status {
        Status {
            generated_at: "2027-01-15T08:00:00Z".into(),
            rows,
            budgets_live: true,
            ..Default::default()
        }
    }

    #[test]
    fn each_service_says_what_it_waits_for() {
        let mut delayed = row("web", "down (exited)");
        delayed.failures = Some(3);
        delayed.next_attempt = Some("2027-01-15T08:01:00Z".into());
        let mut held = row("db", "down (exited)");
        held.inhibitions = vec!["operator-hold:c0ffee".into()];
        let mut s = status(vec![
            delayed,
            held,
            row("api", "running, not routed"),
            row("cache", "serving"),
        ]);
        s.catalog.push(TypeStatus {
            service_type: "wiki".into(),
            version: "2".into(),
            instances: 1,
            rollout: "halted: upgrade of wiki9 failed".into(),
            pending: vec![PendingUpgrade {
                instance: "wiki1".into(),
                from: "1".into(),
                to: "2".into(),
                progress: "not planned: rollout halted: upgrade of wiki9 failed".into(),
            }],
        });
        let said = explain(&s, "wiki1").unwrap().join("\n");
        for expect in [
            "wiki1/web waits for its crash-loop budget: 3 failure(s) in a row, backoff until \
             2027-01-15T08:01:00Z (in 1 min) (R10)",
            "wiki1/db is held (operator-hold:c0ffee)",
            "wiki1/api runs but is not routed",
            "wiki1/cache serves",
            "its upgrade from 1 to 2 (wiki): not planned: rollout halted: upgrade of wiki9 failed",
        ] {
            assert!(said.contains(expect), "{expect}\n---\n{said}");
        }
        assert!(
            !said.contains("the next pass starts it"),
            "a delayed or held service is not promised a start:\n{said}"
        );
    }

    #[test]
    fn without_the_daemons_budgets_a_down_service_is_not_promised_a_start() {
        let mut s = status(vec![row("web", "down (exited)")]);
        s.budgets_live = false;
        let said = explain(&s, "wiki1").unwrap().join("\n");
        assert!(
            said.contains("unless its crash-loop budget delays it"),
            "{said}"
        );
        assert!(said.contains("`stead instance why --live`"), "{said}");
    }

    #[test]
    fn a_service_refused_a_reserved_host_names_the_host_its_holder_and_the_way_to_free_it() {
        let mut refused = row("web", "serving");
        refused.hosts_refused = vec![crate::daemon::reserved_hosts::RefusedHost {
            host: "shop.example.com".into(),
            holder: "shop1".into(),
        }];
        let said = explain(&status(vec![refused]), "wiki1").unwrap().join("\n");
        assert!(
            said.contains(
                "wiki1/web is not served under shop.example.com: the host is reserved for \
                 instance shop1 until that instance is deleted (#54); \
                 `stead instance delete shop1` frees it"
            ),
            "{said}"
        );
    }

    #[test]
    fn an_unknown_instance_is_none() {
        assert_eq!(explain(&status(vec![row("web", "serving")]), "other"), None);
    }
}
