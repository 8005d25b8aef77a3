//! `stead plan` (#55): what reloading the catalog file would do, told
//! before it is loaded. The daemon reads the file as a reload would, judges
//! its hazards as a reload would, and forecasts the rollout with the real
//! version-drift planner over the fleet as it is now
//! ([`crate::core::plan::forecast`]). Nothing is written.

use std::time::Duration;

use crate::core::catalog::reload_hazards;
use crate::core::plan::{forecast, Forecast};
use crate::core::types::{whole_seconds, Timestamp};

use super::admin::CatalogView;
use super::human::{relative, span, table};
use super::Daemon;

/// How far ahead a forecast looks: past a monthly window's next opening.
pub const HORIZON: Duration = Duration::from_secs(35 * 86_400);

/// What `GET /plan` answers.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PlanAnswer {
    /// The catalog running now.
    pub catalog: CatalogView,
    /// Why no plan could be made: the file is refused, or the fleet could
    /// not be read. A reload would be refused too.
    pub error: Option<String>,
    /// What the file changes against the running catalog, one line each.
    pub changes: Vec<String>,
    /// What a reload would refuse (`stead reload --force` applies it
    /// anyway), one line each.
    pub hazards: Vec<String>,
    /// The rollout the file would start; none when `error` says why.
    pub forecast: Option<ForecastView>,
}

/// A [`Forecast`] for people and scripts: instants as RFC 3339, durations
/// in milliseconds.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ForecastView {
    pub from: Timestamp,
    pub horizon_ms: u64,
    pub in_flight: Vec<String>,
    pub rounds: Vec<RoundView>,
    pub left: Vec<LeftView>,
    pub horizon_reached: bool,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RoundView {
    pub at: Timestamp,
    pub upgrades: Vec<UpgradeView>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct UpgradeView {
    pub instance: String,
    pub service_type: String,
    pub wave: u32,
    pub from: String,
    pub to: String,
    pub reason: String,
    /// The services replaced `stop-first`, each with the longest it is
    /// down (stop grace and readiness probe; pulling the image besides).
    pub stop_first: Vec<OutageView>,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct OutageView {
    pub service: String,
    pub down_at_most_ms: u64,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LeftView {
    pub instance: String,
    pub service_type: String,
    pub why: String,
}

impl ForecastView {
    fn of(forecast: Forecast) -> Self {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self {
            from: forecast.from,
            horizon_ms: millis(HORIZON),
            in_flight: forecast.in_flight.iter().map(ToString::to_string).collect(),
            rounds: forecast
                .rounds
                .into_iter()
                .map(|round| RoundView {
                    at: round.at,
                    upgrades: round
                        .upgrades
                        .into_iter()
                        .map(|u| UpgradeView {
                            instance: u.name.to_string(),
                            service_type: u.service_type,
                            wave: u.wave,
                            from: u.from,
                            to: u.to,
                            reason: u.reason,
                            stop_first: u
                                .outages
                                .into_iter()
                                .map(|o| OutageView {
                                    service: o.service.to_string(),
                                    down_at_most_ms: millis(o.at_most),
                                })
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
            left: forecast
                .left
                .into_iter()
                .map(|l| LeftView {
                    instance: l.name.to_string(),
                    service_type: l.service_type,
                    why: l.why,
                })
                .collect(),
            horizon_reached: forecast.horizon_reached,
        }
    }
}

impl Daemon {
    /// What reloading the catalog file would do; changes nothing.
    pub async fn plan_catalog(&self) -> PlanAnswer {
        let running = self.catalog.current();
        let mut answer = PlanAnswer {
            catalog: CatalogView::of(&self.config.catalog, &running),
            error: None,
            changes: Vec::new(),
            hazards: Vec::new(),
            forecast: None,
        };
        let new = match self.load_for_reload() {
            Ok(new) => new,
            Err(e) => {
                answer.error = Some(e.to_string());
                return answer;
            }
        };
        answer.changes = new
            .changes_from(&running)
            .iter()
            .map(ToString::to_string)
            .collect();
        match self.ports.store.live_service_types().await {
            Ok(live) => {
                answer.hazards = reload_hazards(&running, &new, &live)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
            }
            Err(e) => {
                answer.error = Some(format!(
                    "cannot read which service types have live instances ({e}), so the \
                     reload's hazards are unknown"
                ));
                return answer;
            }
        }
        match self.reconciler.snapshot(&new, String::new()).await {
            Ok((snapshot, _)) if snapshot.baking.is_none() => {
                answer.error = Some(
                    "the upgrade markers could not be read (see the log), so which instances \
                     bake is unknown; retry"
                        .to_owned(),
                );
            }
            Ok((snapshot, _)) => {
                answer.forecast = Some(ForecastView::of(forecast(&snapshot, HORIZON)))
            }
            Err(e) => answer.error = Some(format!("cannot read the fleet: {e}")),
        }
        answer
    }
}

impl PlanAnswer {
    /// Whether a reload of the file would be refused.
    pub fn refused(&self) -> bool {
        self.error.is_some() || !self.hazards.is_empty()
    }

    /// The answer as `stead plan` prints it.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let file = &self.catalog.file;
        if let Some(error) = &self.error {
            out.push_str(&format!("{file}: no plan: {error}\n"));
            return out;
        }
        if self.changes.is_empty() {
            out.push_str(&format!("{file}: no change against the running catalog\n"));
        } else {
            out.push_str(&format!("{file} against the running catalog:\n"));
            for change in &self.changes {
                out.push_str(&format!("  {change}\n"));
            }
        }
        if !self.hazards.is_empty() {
            out.push_str(
                "a reload would be refused: these changes would damage live instances \
                 (`stead reload --force` applies them anyway):\n",
            );
            for hazard in &self.hazards {
                out.push_str(&format!("  {hazard}\n"));
            }
        }
        if let Some(forecast) = &self.forecast {
            out.push_str(&forecast.text());
        }
        out
    }
}

impl ForecastView {
    fn text(&self) -> String {
        let mut out = String::new();
        if !self.in_flight.is_empty() {
            out.push_str(&format!(
                "in flight now (each holds a slot until its bake ends): {}\n",
                self.in_flight.join(", ")
            ));
        }
        if self.rounds.is_empty() {
            out.push_str("no upgrade would start\n");
        } else {
            out.push_str(
                "upgrades, if each succeeds and every bake holds (a failed bake halts its type \
                 at that wave):\n",
            );
            let mut rows = vec![
                ["when", "type", "wave", "instance", "version", "stop-first"]
                    .map(str::to_owned)
                    .to_vec(),
            ];
            for round in &self.rounds {
                for u in &round.upgrades {
                    rows.push(vec![
                        format!(
                            "{} ({})",
                            whole_seconds(round.at),
                            relative(round.at, self.from)
                        ),
                        u.service_type.clone(),
                        u.wave.to_string(),
                        u.instance.clone(),
                        format!("{} -> {}", u.from, u.to),
                        outages_text(&u.stop_first),
                    ]);
                }
            }
            for line in table(&rows).lines() {
                out.push_str(&format!("  {line}\n"));
            }
        }
        for left in &self.left {
            out.push_str(&format!(
                "not upgraded: {} ({}): {}\n",
                left.instance, left.service_type, left.why
            ));
        }
        if self.horizon_reached {
            out.push_str(&format!(
                "the forecast stops {} ahead, with upgrades still to come\n",
                span(self.horizon_ms / 1000)
            ));
        }
        out
    }
}

fn outages_text(outages: &[OutageView]) -> String {
    if outages.is_empty() {
        return "-".to_owned();
    }
    outages
        .iter()
        .map(|o| {
            format!(
                "{} down at most {}",
                o.service,
                span(o.down_at_most_ms.div_ceil(1000))
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
