//! The flight recorder's files (`[flight_recorder]`, issue #44): one file
//! of JSON lines per instance, `<dir>/<instance>.jsonl`, a bounded ring.
//! A pass hands its line over a bounded channel and never waits: one
//! thread of its own appends, and when a file holds `passes_per_instance`
//! lines it is rewritten with the newer half. What it cannot take or write
//! is a WARN and `stead_flight_recorder_dropped_total`.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};

use crate::config::daemon::FlightRecorderSettings;
use crate::core::types::InstanceName;
use crate::engine::flight::{FlightRecorder, FlightSink, NotRecorded};

/// Lines waiting for the writer before a pass's is dropped.
const QUEUE_MAX: usize = 4096;

/// Hands lines to the writer thread.
pub struct FlightFiles {
    queue: SyncSender<(InstanceName, String)>,
}

impl FlightSink for FlightFiles {
    fn offer(&self, instance: &InstanceName, line: String) -> Result<(), NotRecorded> {
        match self.queue.try_send((instance.clone(), line)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(NotRecorded::QueueFull(QUEUE_MAX)),
            Err(TrySendError::Disconnected(_)) => Err(NotRecorded::WriterStopped),
        }
    }
}

/// The recorder the daemon registers when `[flight_recorder]` is enabled,
/// its writer thread started on `settings.dir`.
pub fn recorder(settings: &FlightRecorderSettings) -> io::Result<FlightRecorder<FlightFiles>> {
    fs::create_dir_all(&settings.dir)?;
    let (queue, lines) = mpsc::sync_channel(QUEUE_MAX);
    let mut ring = Ring::new(settings.dir.clone(), settings.passes_per_instance);
    std::thread::Builder::new()
        .name("stead-flight".to_owned())
        .spawn(move || write_all(&mut ring, lines))?;
    Ok(FlightRecorder::new(FlightFiles { queue }))
}

fn write_all(ring: &mut Ring, lines: Receiver<(InstanceName, String)>) {
    for (instance, line) in lines {
        if let Err(e) = ring.append(&instance, &line) {
            metrics::counter!("stead_flight_recorder_dropped_total").increment(1);
            tracing::warn!(
                %instance,
                dir = %ring.dir.display(),
                "the flight recorder could not write a pass: {e}"
            );
        }
    }
}

/// The files, and how many lines each holds.
pub struct Ring {
    dir: PathBuf,
    bound: usize,
    lines: HashMap<InstanceName, usize>,
}

impl Ring {
    pub fn new(dir: PathBuf, bound: usize) -> Self {
        Self {
            dir,
            bound: bound.max(2),
            lines: HashMap::new(),
        }
    }

    /// The file of `instance`'s passes.
    pub fn path(&self, instance: &InstanceName) -> PathBuf {
        self.dir.join(format!("{instance}.jsonl"))
    }

    /// Appends one line to `instance`'s file, dropping the older half of
    /// the file first when it is full.
    pub fn append(&mut self, instance: &InstanceName, line: &str) -> io::Result<()> {
        let name = instance.as_str();
        if name.is_empty() || name.starts_with('.') || name.contains(['/', '\0']) {
            return Err(io::Error::other(format!(
                "instance name {name:?} is not a file name"
            )));
        }
        let path = self.path(instance);
        let held = match self.lines.get(instance) {
            Some(n) => *n,
            None => count_lines(&path)?,
        };
        let held = if held >= self.bound {
            keep_newest(&path, self.bound / 2)?
        } else {
            held
        };
        let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
        // One write of the whole line: a reader never sees half of one
        // (but a crash may leave a last line cut short).
        file.write_all(format!("{line}\n").as_bytes())?;
        self.lines.insert(instance.clone(), held + 1);
        Ok(())
    }
}

fn count_lines(path: &Path) -> io::Result<usize> {
    match File::open(path) {
        Ok(file) => Ok(BufReader::new(file).lines().count()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

/// Rewrites `path` with its newest `keep` lines (through a file renamed
/// over it, so a reader sees the old file or the new); how many it kept.
fn keep_newest(path: &Path, keep: usize) -> io::Result<usize> {
    let lines: Vec<String> = BufReader::new(File::open(path)?)
        .lines()
        .collect::<Result<_, _>>()?;
    let kept = &lines[lines.len().saturating_sub(keep)..];
    let temporary = path.with_extension("jsonl.tmp");
    let mut out = File::create(&temporary)?;
    for line in kept {
        writeln!(out, "{line}")?;
    }
    out.sync_all()?;
    fs::rename(&temporary, path)?;
    Ok(kept.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_file_keeps_its_newer_half_and_never_exceeds_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let mut ring = Ring::new(dir.path().to_owned(), 4);
        let acme = InstanceName::new("acme");
        for n in 1..=9 {
            ring.append(&acme, &format!("{{\"n\":{n}}}")).unwrap();
            let text = fs::read_to_string(ring.path(&acme)).unwrap();
            assert!(text.lines().count() <= 4, "pass {n}: {text}");
        }
        let text = fs::read_to_string(ring.path(&acme)).unwrap();
        assert_eq!(text, "{\"n\":7}\n{\"n\":8}\n{\"n\":9}\n");
        // A new writer counts what the file already holds.
        let mut again = Ring::new(dir.path().to_owned(), 4);
        again.append(&acme, "{\"n\":10}").unwrap();
        again.append(&acme, "{\"n\":11}").unwrap();
        let text = fs::read_to_string(ring.path(&acme)).unwrap();
        assert_eq!(text, "{\"n\":9}\n{\"n\":10}\n{\"n\":11}\n");
        assert!(ring.append(&InstanceName::new("../x"), "{}").is_err());
    }
}
