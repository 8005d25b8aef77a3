//! Branch coverage of a run (issue #15): which ways the engine's decisions
//! went, counted from the metrics it exports to operators anyway
//! (`stead_recovery_verdicts_total{verdict=…}`,
//! `stead_recovery_steps_total{reason=…}`, `stead_decisions_total`, …).
//! The engine and the core know nothing of the simulation: a run installs
//! a recorder of its own on the thread madsim runs it on, and reads the
//! counters back when it ends.
//!
//! `sim/coverage.toml` lists the branches the simulation must reach, with
//! the least number of times the CI seeds must reach each: adding a branch
//! to the engine without reaching it in the simulation is then a failure
//! of `cargo sim`, not a silent gap.

use std::collections::BTreeMap;

pub use stead_testkit::metrics::{Branches, Tally};

/// The branches a run of `seeds` seeds must reach, read from
/// `sim/coverage.toml`.
#[derive(Clone, Debug)]
pub struct Required {
    /// The seed count the minimums are stated for (CI's).
    pub seeds: u64,
    /// Branch → the least number of times it must be reached in `seeds`.
    pub minimum: BTreeMap<String, u64>,
}

/// The coverage file, parsed; an error names what is wrong and where.
pub fn required() -> Result<Required, String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("coverage.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_required(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse_required(text: &str) -> Result<Required, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("{e}"))?;
    let seeds = match table.get("seeds") {
        Some(toml::Value::Integer(n)) if *n > 0 => *n as u64,
        other => {
            return Err(format!(
                "`seeds` must be a positive integer, found {other:?}"
            ))
        }
    };
    let Some(toml::Value::Table(branches)) = table.get("minimum") else {
        return Err("a `[minimum]` table of branch = least count is required".to_owned());
    };
    let mut minimum = BTreeMap::new();
    for (branch, value) in branches {
        match value {
            toml::Value::Integer(n) if *n > 0 => {
                minimum.insert(branch.clone(), *n as u64);
            }
            other => {
                return Err(format!(
                    "minimum.{branch:?} must be a positive integer, found {other}"
                ))
            }
        }
    }
    if let Some(unknown) = table.keys().find(|k| *k != "seeds" && *k != "minimum") {
        return Err(format!(
            "unknown key {unknown:?} (expected `seeds` and `[minimum]`)"
        ));
    }
    Ok(Required { seeds, minimum })
}

impl Required {
    /// The minimums in proportion to `seeds` (rounded down, at least one
    /// for a branch that must be reached at all): the mutation judge runs
    /// fewer seeds than CI and holds a mutant to the same coverage, so a
    /// mutant that stops a branch from being taken is caught by the gate
    /// CI would catch it with.
    pub fn scaled_to(&self, seeds: u64) -> Required {
        let minimum = self
            .minimum
            .iter()
            .map(|(branch, &min)| {
                let scaled =
                    (min.saturating_mul(seeds) / self.seeds.max(1)).max(u64::from(min > 0));
                (branch.clone(), scaled)
            })
            .collect();
        Required { seeds, minimum }
    }
}

/// The branches of `required` reached fewer times than stated, as
/// `(branch, reached, minimum)`.
pub fn shortfalls(required: &Required, reached: &Branches) -> Vec<(String, u64, u64)> {
    required
        .minimum
        .iter()
        .filter_map(|(branch, &min)| {
            let got = reached.get(branch).copied().unwrap_or(0);
            (got < min).then(|| (branch.clone(), got, min))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_minimums_are_proportional_and_never_drop_a_branch() {
        let required = Required {
            seeds: 500,
            minimum: [
                ("a".to_owned(), 20),
                ("b".to_owned(), 3),
                ("c".to_owned(), 0),
            ]
            .into_iter()
            .collect(),
        };
        let scaled = required.scaled_to(100);
        assert_eq!(scaled.seeds, 100);
        assert_eq!(scaled.minimum["a"], 4);
        assert_eq!(scaled.minimum["b"], 1, "rounded down, but still required");
        assert_eq!(scaled.minimum["c"], 0);
        assert_eq!(required.scaled_to(500).minimum, required.minimum);
    }

    #[test]
    fn the_coverage_file_parses_and_bad_files_are_named() {
        let ok = parse_required("seeds = 500\n[minimum]\n\"a{b=\\\"c\\\"}\" = 20\n").unwrap();
        assert_eq!(ok.seeds, 500);
        assert_eq!(ok.minimum.get("a{b=\"c\"}"), Some(&20));
        let err = parse_required("seeds = 0\n[minimum]\n").unwrap_err();
        assert!(err.contains("seeds"), "{err}");
        let err = parse_required("seeds = 5\n[minimum]\nx = \"many\"\n").unwrap_err();
        assert!(err.contains("minimum.\"x\""), "{err}");
        let err = parse_required("seeds = 5\n[minimum]\n[extra]\n").unwrap_err();
        assert!(err.contains("extra"), "{err}");
        required().expect("sim/coverage.toml is valid");
    }

    #[test]
    fn a_shortfall_names_the_branch_and_both_counts() {
        let required = parse_required("seeds = 1\n[minimum]\na = 3\nb = 1\n").unwrap();
        let reached: Branches = [("a".to_owned(), 2), ("b".to_owned(), 7)].into();
        assert_eq!(
            shortfalls(&required, &reached),
            vec![("a".to_owned(), 2, 3)]
        );
    }
}
