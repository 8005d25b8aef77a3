//! A metrics recorder that keeps every counter the code under test
//! increments on one thread, as series → total: the simulation reads its
//! coverage from it (`sim/src/coverage.rs`), and engine tests read what an
//! operator's dashboard would count.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString,
    Unit,
};

/// Counter series → total, named as Prometheus names them
/// (`name{label="value"}`).
pub type Branches = BTreeMap<String, u64>;

/// A recorder that keeps every counter of one run, and each gauge's last
/// value (the simulation's checker reads what an operator's dashboard
/// would show); histograms are dropped. Clones share the records.
#[derive(Clone, Default)]
pub struct Tally {
    counts: Arc<Mutex<Branches>>,
    gauges: Arc<Mutex<BTreeMap<String, f64>>>,
}

struct GaugeSeries {
    name: String,
    gauges: Arc<Mutex<BTreeMap<String, f64>>>,
}

impl GaugeSeries {
    fn update(&self, f: impl FnOnce(f64) -> f64) {
        let mut gauges = self.gauges.lock().expect("tally poisoned");
        let value = gauges.entry(self.name.clone()).or_default();
        *value = f(*value);
    }
}

impl GaugeFn for GaugeSeries {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

struct Series {
    name: String,
    counts: Arc<Mutex<Branches>>,
}

impl CounterFn for Series {
    fn increment(&self, value: u64) {
        *self
            .counts
            .lock()
            .expect("tally poisoned")
            .entry(self.name.clone())
            .or_default() += value;
    }

    fn absolute(&self, value: u64) {
        let mut counts = self.counts.lock().expect("tally poisoned");
        let total = counts.entry(self.name.clone()).or_default();
        *total = (*total).max(value);
    }
}

/// `name{a="x",b="y"}`, labels in the order given, or `name` alone.
pub fn series_name(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}=\"{}\"", l.key(), l.value()))
        .collect();
    if labels.is_empty() {
        key.name().to_owned()
    } else {
        format!("{}{{{}}}", key.name(), labels.join(","))
    }
}

impl Recorder for Tally {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Series {
            name: series_name(key),
            counts: self.counts.clone(),
        }))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(GaugeSeries {
            name: series_name(key),
            gauges: self.gauges.clone(),
        }))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

impl Tally {
    /// Runs `f` with this tally recording every counter on this thread.
    pub fn around<T>(&self, f: impl FnOnce() -> T) -> T {
        metrics::with_local_recorder(self, f)
    }

    pub fn branches(&self) -> Branches {
        self.counts.lock().expect("tally poisoned").clone()
    }

    /// A gauge's last value, `None` if nothing set it.
    pub fn gauge(&self, series: &str) -> Option<f64> {
        self.gauges
            .lock()
            .expect("tally poisoned")
            .get(series)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_what_the_code_records_on_its_thread() {
        let tally = Tally::default();
        tally.around(|| {
            metrics::counter!("x_total", "why" => "down").increment(2);
            metrics::counter!("x_total", "why" => "down").increment(1);
            metrics::counter!("y_total").increment(1);
        });
        metrics::counter!("y_total").increment(5); // Outside: not counted.
        let b = tally.branches();
        assert_eq!(b.get("x_total{why=\"down\"}"), Some(&3));
        assert_eq!(b.get("y_total"), Some(&1));
    }

    #[test]
    fn a_tally_keeps_each_gauges_last_value() {
        let tally = Tally::default();
        tally.around(|| {
            metrics::gauge!("g").set(4.0);
            metrics::gauge!("g").increment(2.0);
            metrics::gauge!("g").decrement(1.0);
        });
        assert_eq!(tally.gauge("g"), Some(5.0));
        assert_eq!(tally.gauge("unset"), None);
    }
}
