//! The status page (#42): a small read-only web page the admin listener
//! serves. `GET /` shows the fleet (each instance's state, version and
//! whether it is served) and the rollouts per service type; `GET
//! /instances/{name}` shows one instance's services with their crash-loop
//! budget, what each waits for (the sentences of `stead instance why`) and
//! its timeline (the text of `stead timeline`).
//!
//! Everything here renders values already read: the [`Status`] `/status`
//! serves, [`why::explain`](super::why::explain) over it, and
//! [`render_timeline`](super::event_log::render_timeline)'s text. Nothing
//! reads the store, the runtime or the proxy a second time.
//!
//! Plain server-rendered HTML: no script, no external asset, one inline
//! style sheet. Markup comes only from string literals ([`Html::raw`] takes
//! `&'static str`); every value read goes through [`escape`], so a name
//! with HTML in it is shown as text.

use super::status::{ReleaseRow, Status, StatusRow, TypeStatus};

/// Most events an instance's timeline shows (the newest): `stead
/// timeline`'s default.
pub const PAGE_TIMELINE_EVENTS_MAX: u32 = 200;
/// Longest unknown name quoted back on a "no such instance" page.
const NOT_FOUND_NAME_LEN_MAX: usize = 64;

/// `text` with every character that means something in HTML (text or a
/// quoted attribute) replaced by its entity: `& < > " '`.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as one URL path segment: every byte but RFC 3986's unreserved
/// ones percent-encoded.
fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A page being written: markup from literals, values escaped.
struct Html(String);

impl Html {
    fn raw(&mut self, markup: &'static str) -> &mut Self {
        self.0.push_str(markup);
        self
    }

    fn text(&mut self, value: &str) -> &mut Self {
        self.0.push_str(&escape(value));
        self
    }

    /// `<td>value</td>`, with a class when the value says how things are.
    fn cell(&mut self, value: &str) -> &mut Self {
        self.raw("<td>").text(value).raw("</td>")
    }

    fn cell_class(&mut self, class: &'static str, value: &str) -> &mut Self {
        self.raw("<td class=\"")
            .raw(class)
            .raw("\">")
            .text(value)
            .raw("</td>")
    }

    /// A link to an instance's page.
    fn instance_link(&mut self, name: &str) -> &mut Self {
        self.raw("<a href=\"/instances/")
            .text(&path_segment(name))
            .raw("\">")
            .text(name)
            .raw("</a>")
    }

    fn head(&mut self, title: &str) -> &mut Self {
        self.raw("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">")
            .raw("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">")
            .raw("<title>")
            .text(title)
            .raw("</title><style>")
            .raw(STYLE)
            .raw("</style></head><body>")
    }

    /// When the view was built and from where.
    fn provenance(&mut self, status: &Status) -> &mut Self {
        self.raw("<p class=\"meta\">As of ")
            .text(&status.generated_at)
            .raw(", from the ")
            .text(&status.source)
            .raw(" (database ")
            .text(&status.database)
            .raw(")");
        if let Some(lease) = &status.reconciler {
            self.raw("; reconciler ")
                .text(&lease.holder)
                .raw(" until ")
                .text(&lease.expires_at);
        }
        self.raw(".</p>")
    }

    /// What could not be read, when anything could not.
    fn errors(&mut self, errors: &[String]) -> &mut Self {
        if errors.is_empty() {
            return self;
        }
        self.raw("<section class=\"errors\"><h2>Could not read everything</h2><ul>");
        for error in errors {
            self.raw("<li>").text(error).raw("</li>");
        }
        self.raw("</ul></section>")
    }

    fn end(&mut self) -> String {
        self.raw("</body></html>\n");
        std::mem::take(&mut self.0)
    }
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:1.5em 2em;color:#1d2327;\
background:#fff}h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.4em 0 .4em}\
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.3em .6em;\
border-bottom:1px solid #dcdcde;vertical-align:top}th{background:#f0f0f1}\
.meta{color:#646970;margin:0}.ok{color:#00732e;font-weight:600}.bad{color:#b32d2e;\
font-weight:600}.warn{color:#996800;font-weight:600}ul{margin:.2em 0;padding-left:1.3em}\
pre{background:#f6f7f7;padding:.8em;overflow-x:auto;font-size:12.5px}\
.errors{border-left:4px solid #b32d2e;padding-left:.8em}a{color:#2271b1}";

/// One instance's rows of the status (contiguous: the status pushes an
/// instance's services together), in the status's order.
fn by_instance(rows: &[StatusRow]) -> Vec<(&str, Vec<&StatusRow>)> {
    let mut groups: Vec<(&str, Vec<&StatusRow>)> = Vec::new();
    for row in rows {
        match groups.last_mut() {
            Some((name, group)) if *name == row.instance => group.push(row),
            _ => groups.push((row.instance.as_str(), vec![row])),
        }
    }
    groups
}

/// Whether an instance is served: every service, some, or none; and the
/// class that colours it.
fn served(rows: &[&StatusRow]) -> (&'static str, String) {
    let services: Vec<&&StatusRow> = rows.iter().filter(|r| r.service != "-").collect();
    let serving = services.iter().filter(|r| r.condition == "serving").count();
    match (serving, services.len()) {
        (_, 0) => (
            "bad",
            format!(
                "no: {}",
                rows.first().map_or("no container yet", |r| &r.condition)
            ),
        ),
        (s, n) if s == n => ("ok", "yes".to_owned()),
        (0, _) => ("bad", "no".to_owned()),
        (s, n) => ("warn", format!("partly: {s} of {n} services")),
    }
}

/// A service's crash-loop budget (R10) in a few words.
fn budget_state(row: &StatusRow) -> String {
    match (&row.next_attempt, row.failures) {
        (Some(next), failures) => format!(
            "delayed: {} failure(s) in a row, backoff until {next}",
            failures.unwrap_or(0)
        ),
        (None, Some(0)) => "clear".to_owned(),
        (None, Some(n)) => format!("{n} failure(s) in a row"),
        (None, None) => "unknown (no daemon's memory)".to_owned(),
    }
}

/// `GET /`: the fleet and the rollouts per service type.
pub fn fleet(status: &Status) -> String {
    let mut page = Html(String::new());
    page.head("stead: fleet").raw("<h1>Fleet</h1>");
    page.provenance(status).errors(&status.errors);
    fleet_table(&mut page, status);
    if !status.releases.is_empty() {
        releases_table(&mut page, &status.releases);
    }
    rollouts_table(&mut page, &status.catalog, &status.halted_rollouts);
    page.end()
}

fn fleet_table(page: &mut Html, status: &Status) {
    let groups = by_instance(&status.rows);
    page.raw("<h2>Instances</h2>");
    if groups.is_empty() {
        page.raw("<p>No instances.</p>");
        return;
    }
    page.raw(
        "<table id=\"instances\"><thead><tr><th>Instance</th><th>State</th><th>Intent</th>\
         <th>Version</th><th>Services</th><th>Served</th></tr></thead><tbody>",
    );
    for (name, rows) in groups {
        let first = rows[0];
        let services: Vec<&str> = rows
            .iter()
            .filter(|r| r.service != "-")
            .map(|r| r.service.as_str())
            .collect();
        let (class, served) = served(&rows);
        page.raw("<tr><td>").instance_link(name).raw("</td>");
        page.cell(&first.state)
            .cell(&first.intent)
            .cell(&first.version)
            .cell(&services.join(", "))
            .cell_class(class, &served)
            .raw("</tr>");
    }
    page.raw("</tbody></table>");
}

fn releases_table(page: &mut Html, releases: &[ReleaseRow]) {
    page.raw(
        "<h2>Helm releases</h2><table id=\"releases\"><thead><tr><th>Instance</th>\
         <th>State</th><th>Version</th><th>Namespace</th><th>Release</th><th>Chart</th>\
         </tr></thead><tbody>",
    );
    for release in releases {
        let class = if release.release == "deployed" {
            "ok"
        } else {
            "warn"
        };
        page.raw("<tr><td>")
            .instance_link(&release.instance)
            .raw("</td>");
        page.cell(&release.state)
            .cell(&release.version)
            .cell(&release.namespace)
            .cell_class(class, &release.release)
            .cell(&release.chart)
            .raw("</tr>");
    }
    page.raw("</tbody></table>");
}

fn rollouts_table(page: &mut Html, types: &[TypeStatus], halted: &[String]) {
    page.raw(
        "<h2>Rollouts</h2><table id=\"rollouts\"><thead><tr><th>Service type</th>\
         <th>Catalog version</th><th>Instances</th><th>Rollout</th><th>Pending upgrades</th>\
         </tr></thead><tbody>",
    );
    for t in types {
        let class = if t.rollout == "active" { "ok" } else { "bad" };
        page.raw("<tr>")
            .cell(&t.service_type)
            .cell(&t.version)
            .cell(&t.instances.to_string())
            .cell_class(class, &t.rollout)
            .raw("<td>");
        if t.pending.is_empty() {
            page.raw("none");
        } else {
            page.raw("<ul>");
            for p in &t.pending {
                page.raw("<li>")
                    .instance_link(&p.instance)
                    .raw(" ")
                    .text(&format!("{} → {}: {}", p.from, p.to, p.progress))
                    .raw("</li>");
            }
            page.raw("</ul>");
        }
        page.raw("</td></tr>");
    }
    page.raw("</tbody></table>");
    // Halted rollouts of types the catalog no longer lists.
    let gone: Vec<&String> = halted
        .iter()
        .filter(|h| {
            !types
                .iter()
                .any(|t| h.starts_with(&format!("{}:", t.service_type)))
        })
        .collect();
    if !gone.is_empty() {
        page.raw("<p>Halted rollouts of types no longer in the catalog:</p><ul>");
        for h in gone {
            page.raw("<li>").text(h).raw("</li>");
        }
        page.raw("</ul>");
    }
}

/// `GET /instances/{name}`: one instance's services with their budgets,
/// `why` (what [`why::explain`](super::why::explain) says of it) and
/// `timeline` (what `stead timeline` prints).
pub fn instance(status: &Status, name: &str, why: &[String], timeline: &str) -> String {
    let mut page = Html(String::new());
    page.head(&format!("stead: {name}"))
        .raw("<p><a href=\"/\">← Fleet</a></p><h1>")
        .text(name)
        .raw("</h1>");
    page.provenance(status).errors(&status.errors);
    let rows: Vec<&StatusRow> = status.rows.iter().filter(|r| r.instance == name).collect();
    if let Some(first) = rows.first() {
        page.raw("<p>")
            .text(&format!(
                "State {}, intent {}, version {}",
                first.state, first.intent, first.version
            ))
            .text(
                &first
                    .expires_at
                    .as_deref()
                    .map(|t| format!(", expires at {t}"))
                    .unwrap_or_default(),
            )
            .raw(".</p>");
        services_table(&mut page, &rows);
    }
    for release in status.releases.iter().filter(|r| r.instance == name) {
        page.raw("<p>")
            .text(&format!(
                "Helm release in namespace {}: {} (chart {}, version {})",
                release.namespace, release.release, release.chart, release.version
            ))
            .raw("</p>");
    }
    page.raw("<h2>What it waits for</h2><ul id=\"why\">");
    for sentence in why {
        page.raw("<li>").text(sentence).raw("</li>");
    }
    page.raw("</ul><h2>Timeline</h2><pre id=\"timeline\">")
        .text(timeline)
        .raw("</pre>");
    page.end()
}

fn services_table(page: &mut Html, rows: &[&StatusRow]) {
    page.raw(
        "<h2>Services</h2><table id=\"services\"><thead><tr><th>Service</th>\
         <th>Container</th><th>Runtime</th><th>Condition</th><th>Crash-loop budget</th>\
         <th>Route</th><th>Binds</th><th>Holds</th></tr></thead><tbody>",
    );
    for row in rows.iter().filter(|r| r.service != "-") {
        let condition_class = if row.condition == "serving" {
            "ok"
        } else if row.condition.starts_with("down") || row.condition.starts_with("failed") {
            "bad"
        } else {
            "warn"
        };
        let budget_class = match (&row.next_attempt, row.failures) {
            (Some(_), _) => "bad",
            (None, Some(0)) => "ok",
            _ => "warn",
        };
        page.raw("<tr>")
            .cell(&row.service)
            .cell(&row.container)
            .cell(&row.runtime)
            .cell_class(condition_class, &row.condition)
            .cell_class(budget_class, &budget_state(row))
            .cell(&row.publication)
            .cell(&row.binds)
            .cell(&row.inhibitions.join(", "))
            .raw("</tr>");
    }
    page.raw("</tbody></table>");
}

/// The page of a name that is no live instance; the name is quoted back
/// (cut to [`NOT_FOUND_NAME_LEN_MAX`] characters) as text.
pub fn not_found(name: &str) -> String {
    let shown: String = name.chars().take(NOT_FOUND_NAME_LEN_MAX).collect();
    let mut page = Html(String::new());
    page.head("stead: no such instance")
        .raw("<p><a href=\"/\">← Fleet</a></p><h1>No such instance</h1><p>No live instance is named <code id=\"name\">")
        .text(&shown)
        .raw("</code>.</p>");
    page.end()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::status::PendingUpgrade;

    const HOSTILE: &str = "<script>alert('x')</script>&\"";

    fn row(instance: &str, service: &str, condition: &str) -> StatusRow {
        StatusRow {
            instance: instance.into(),
            state: "ready".into(),
            intent: "running".into(),
            version: "1".into(),
            service: service.into(),
            container: "c0ffee".into(),
            runtime: "running".into(),
            condition: condition.into(),
            failures: Some(0),
            next_attempt: None,
            exit_code: None,
            exited_at: None,
            last_decision: None,
            last_decision_at: None,
            publication: "published".into(),
            binds: "8080->32768".into(),
            inhibitions: Vec::new(),
            expires_at: None,
            hosts_refused: Vec::new(),
        }
    }

    fn status(rows: Vec<StatusRow>) -> Status {
        Status {
            generated_at: "2027-01-15T08:00:00Z".into(),
            source: "daemon".into(),
            database: "sqlite:///var/lib/stead/stead.db".into(),
            rows,
            budgets_live: true,
            ..Default::default()
        }
    }

    /// Every markup character of a value is escaped; nothing else changes.
    #[test]
    fn escape_replaces_every_markup_character() {
        for (text, expect) in [
            ("wiki1", "wiki1"),
            ("a&b", "a&amp;b"),
            ("<b>", "&lt;b&gt;"),
            ("\"'", "&quot;&#39;"),
            ("&lt;", "&amp;lt;"),
            ("é → ü", "é → ü"),
            ("", ""),
        ] {
            assert_eq!(escape(text), expect, "{text}");
        }
    }

    #[test]
    fn a_link_encodes_the_name_as_a_path_segment() {
        assert_eq!(path_segment("wiki1"), "wiki1");
        assert_eq!(path_segment("a/b c<"), "a%2Fb%20c%3C");
    }

    /// No value can open an element: the only `<` in a page are the
    /// literals' own.
    fn assert_shown_as_text(page: &str) {
        assert!(!page.contains("<script"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"),
            "{page}"
        );
    }

    #[test]
    fn a_name_with_html_in_it_renders_as_text_on_every_page() {
        let mut hostile = row(HOSTILE, HOSTILE, "serving");
        hostile.version = HOSTILE.into();
        hostile.inhibitions = vec![HOSTILE.into()];
        let mut s = status(vec![hostile]);
        s.errors.push(HOSTILE.into());
        s.catalog.push(TypeStatus {
            service_type: HOSTILE.into(),
            version: HOSTILE.into(),
            instances: 1,
            rollout: HOSTILE.into(),
            pending: vec![PendingUpgrade {
                instance: HOSTILE.into(),
                from: "1".into(),
                to: HOSTILE.into(),
                progress: HOSTILE.into(),
            }],
        });
        s.halted_rollouts.push(HOSTILE.into());
        let fleet = fleet(&s);
        assert_shown_as_text(&fleet);
        assert!(
            fleet.contains(
                "href=\"/instances/%3Cscript%3Ealert%28%27x%27%29%3C%2Fscript%3E%26%22\""
            ),
            "{fleet}"
        );
        assert_shown_as_text(&instance(&s, HOSTILE, &[HOSTILE.into()], HOSTILE));
        assert_shown_as_text(&not_found(HOSTILE));
    }

    #[test]
    fn the_fleet_says_which_instances_are_served_and_each_types_rollout() {
        let mut down = row("wiki2", "web", "down (exited)");
        down.failures = Some(3);
        let s = {
            let mut s = status(vec![
                row("wiki1", "web", "serving"),
                row("wiki1", "db", "serving"),
                down,
                row("wiki2", "db", "serving"),
                row("wiki3", "-", "no container yet"),
            ]);
            s.catalog.push(TypeStatus {
                service_type: "wiki".into(),
                version: "2".into(),
                instances: 3,
                rollout: "halted: upgrade of wiki9 failed".into(),
                pending: vec![PendingUpgrade {
                    instance: "wiki1".into(),
                    from: "1".into(),
                    to: "2".into(),
                    progress: "not planned: rollout halted".into(),
                }],
            });
            s
        };
        let page = fleet(&s);
        for expect in [
            "<a href=\"/instances/wiki1\">wiki1</a></td><td>ready</td><td>running</td><td>1</td>\
             <td>web, db</td><td class=\"ok\">yes</td>",
            "<td class=\"warn\">partly: 1 of 2 services</td>",
            "<td class=\"bad\">no: no container yet</td>",
            "<td class=\"bad\">halted: upgrade of wiki9 failed</td>",
            "wiki1</a> 1 → 2: not planned: rollout halted</li>",
        ] {
            assert!(page.contains(expect), "{expect}\n---\n{page}");
        }
        assert_eq!(page.matches("<tr><td><a href").count(), 3, "{page}");
    }

    #[test]
    fn an_instance_page_shows_each_services_budget_why_and_timeline() {
        let mut delayed = row("wiki1", "web", "down (exited)");
        delayed.failures = Some(4);
        delayed.next_attempt = Some("2027-01-15T08:04:00Z".into());
        let s = status(vec![
            delayed,
            row("wiki1", "db", "serving"),
            row("other", "web", "serving"),
        ]);
        let page = instance(
            &s,
            "wiki1",
            &["wiki1/web waits for its crash-loop budget".into()],
            "wiki1: 2 event(s) from a to b\n  +0 ms start",
        );
        for expect in [
            "<td class=\"bad\">delayed: 4 failure(s) in a row, backoff until \
             2027-01-15T08:04:00Z</td>",
            "<td>db</td><td>c0ffee</td><td>running</td><td class=\"ok\">serving</td>\
             <td class=\"ok\">clear</td>",
            "<li>wiki1/web waits for its crash-loop budget</li>",
            "<pre id=\"timeline\">wiki1: 2 event(s) from a to b\n  +0 ms start</pre>",
        ] {
            assert!(page.contains(expect), "{expect}\n---\n{page}");
        }
        assert_eq!(
            page.matches("<tr><td>").count(),
            2,
            "only wiki1's services: {page}"
        );
    }
}
