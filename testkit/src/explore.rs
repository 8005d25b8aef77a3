//! An exhaustive bounded explorer of the core's machines: every sequence
//! of port answers up to a depth, not a sample of them (issue #44,
//! `docs/simulation.md`, "Exhaustive checking").
//!
//! A stateless model checker in the manner of CHESS or VeriSoft: a run is
//! a closure that drives a machine from scratch and asks a [`Chooser`]
//! whenever the world may go more than one way (which answer a port gives,
//! whether the driver crashes, how much time passes between passes). The
//! explorer enumerates every vector of choices depth-first by re-running
//! the closure with each prefix: after a run it bumps the last choice that
//! has an untried alternative, drops what followed, and runs again. No
//! machine needs to be cloned or rolled back, so the machines are explored
//! exactly as the engine drives them.
//!
//! - **The bound** (the *depth*) is a number of faults: at every choice
//!   point the first alternative is the fault-free one (the answer the
//!   world would truly give, time going on as usual) and every other is a
//!   fault (an error, a crash, a native restart, a lost route, a crash of
//!   the driver, an operator's toggle). A path takes at most `depth`
//!   faults, anywhere along it; once it has, no choice branches any more.
//!   Each harness also bounds a path's length (passes, steps) and then
//!   [hushes](Chooser::hush) the world: every path ends in a stretch with
//!   no faults on offer, where the harnesses check their bounded liveness
//!   properties ("eventually"). Bounding faults rather than choice points
//!   reaches deep into a machine (a fault in the third pass after two
//!   clean ones) at the price of few faults per path, which is where
//!   rule breaks live: each mutant of the exercise needs one or two.
//! - **Setup choices** ([`Chooser::setup`]) branch without counting
//!   against the bound: the initial configurations.
//! - **Safety** is what the harnesses assert after every step (the same
//!   checkers the property tests and the fuzzers use); a panic in a run is
//!   a violation. The explorer catches it, re-runs the same choices with
//!   tracing on, and returns a [`Counterexample`]: a numbered list of the
//!   steps (command, answer, time) that led to it.
//! - **Distinct states**: a harness hands the explorer what it considers
//!   its state ([`Chooser::state`]); the explorer hashes its `Debug`
//!   rendering (every map in the machines and the harness worlds is a
//!   `BTreeMap`, so equal states render equally) and counts the distinct
//!   hashes. They are counted, not used to prune: the checkers' history
//!   (what was withdrawn, probed, recorded) is part of what decides a
//!   violation, so two equal machine states may still differ in what can
//!   be violated next.

pub mod helm_bake;
pub mod pass;
pub mod planners;
pub mod recovery;
pub mod upgrade;

use std::collections::HashSet;
use std::fmt::{self, Debug, Write as _};
use std::hash::{DefaultHasher, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The depth named by `STEAD_EXPLORE_DEPTH`, or `default`: the deeper run.
pub fn depth_from_env(default: usize) -> usize {
    match std::env::var("STEAD_EXPLORE_DEPTH") {
        Ok(value) => value.trim().parse().unwrap_or_else(|_| {
            panic!("STEAD_EXPLORE_DEPTH = {value:?}: not a number of faults per path")
        }),
        Err(_) => default,
    }
}

/// One choice point of a run.
#[derive(Clone, Copy, Debug)]
struct Taken {
    pick: usize,
    arity: usize,
}

/// The source of every nondeterministic decision of one run.
pub struct Chooser {
    forced: Vec<usize>,
    taken: Vec<Taken>,
    depth: usize,
    faults: usize,
    hushed: bool,
    tracing: bool,
    trace: Vec<String>,
    states: HashSet<u64>,
    steps: usize,
}

impl Chooser {
    fn new(forced: Vec<usize>, depth: usize, tracing: bool, states: HashSet<u64>) -> Self {
        Self {
            forced,
            taken: Vec::new(),
            depth,
            faults: 0,
            hushed: false,
            tracing,
            trace: Vec::new(),
            states,
            steps: 0,
        }
    }

    fn take(&mut self, arity: usize, counted: bool) -> usize {
        let i = self.taken.len();
        let pick = self.forced.get(i).copied().unwrap_or(0);
        assert!(pick < arity, "the run is not deterministic: choice {i}");
        self.taken.push(Taken { pick, arity });
        self.faults += usize::from(counted && pick != 0);
        pick
    }

    /// One of `arity` ways for the world to go; 0 is the fault-free one
    /// and any other is a fault. Once the path has taken `depth` faults,
    /// or the harness hushed the world, always 0.
    pub fn choose(&mut self, arity: usize) -> usize {
        if arity <= 1 || self.quiet() {
            return 0;
        }
        self.take(arity, true)
    }

    /// One of `options`, the first being the fault-free one.
    pub fn pick<T: Clone>(&mut self, options: &[T]) -> T {
        options[self.choose(options.len())].clone()
    }

    /// One of `arity` initial configurations: branches without counting
    /// against the depth bound.
    pub fn setup(&mut self, arity: usize) -> usize {
        if arity <= 1 {
            return 0;
        }
        self.take(arity, false)
    }

    /// Whether faults are still on offer: not once the path has taken
    /// `depth` of them or the harness hushed the world.
    pub fn quiet(&self) -> bool {
        self.hushed || self.faults >= self.depth
    }

    /// No more faults on this path: the harness's bound on its length is
    /// reached and what follows is the fault-free stretch its liveness
    /// properties are checked after.
    pub fn hush(&mut self) {
        self.hushed = true;
    }

    /// How many faults the path has taken so far.
    pub fn faults(&self) -> usize {
        self.faults
    }

    /// A line of the counterexample's trace; `line` is only called when a
    /// violation is being replayed.
    pub fn step(&mut self, line: impl FnOnce() -> String) {
        self.steps += 1;
        if self.tracing {
            let n = self.trace.len() + 1;
            self.trace.push(format!("{n:>3}. {}", line()));
        }
    }

    /// Counts `state` (its `Debug` rendering) among the distinct states.
    pub fn state(&mut self, state: &dyn Debug) {
        let mut hasher = HashWriter(DefaultHasher::new());
        write!(hasher, "{state:?}").expect("hashing never fails");
        self.states.insert(hasher.0.finish());
    }

    /// The next prefix to run: the last choice with an untried
    /// alternative, bumped.
    fn next(&self) -> Option<Vec<usize>> {
        let j = self.taken.iter().rposition(|t| t.pick + 1 < t.arity)?;
        let mut prefix: Vec<usize> = self.taken[..j].iter().map(|t| t.pick).collect();
        prefix.push(self.taken[j].pick + 1);
        Some(prefix)
    }
}

/// Feeds a `Debug` rendering into a hasher without allocating it.
struct HashWriter(DefaultHasher);

impl fmt::Write for HashWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

/// What one exploration covered.
#[derive(Clone, Debug)]
pub struct Stats {
    pub name: String,
    pub depth: usize,
    /// Runs, one per leaf of the choice tree.
    pub paths: u64,
    pub states: usize,
    /// The most choice points (branching ones) and steps one path had.
    pub longest_choices: usize,
    pub longest_steps: usize,
    pub elapsed: Duration,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: depth {}, {} paths, {} distinct states, longest path {} choices / {} steps, {:.1?}",
            self.name,
            self.depth,
            self.paths,
            self.states,
            self.longest_choices,
            self.longest_steps,
            self.elapsed
        )
    }
}

/// A violation and the steps that led to it.
#[derive(Clone, Debug)]
pub struct Counterexample {
    pub name: String,
    pub depth: usize,
    pub message: String,
    pub choices: Vec<usize>,
    pub trace: Vec<String>,
}

impl fmt::Display for Counterexample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: violation at depth {}: {}",
            self.name, self.depth, self.message
        )?;
        writeln!(f, "choices: {:?}", self.choices)?;
        for line in &self.trace {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// Runs `run` once per vector of choices with at most `depth` faults,
/// depth-first. The first violation stops the exploration and
/// comes back replayed, with its trace.
// The wall time it took is reported, not decided by: no machine sees it.
#[allow(clippy::disallowed_methods)]
pub fn explore(
    name: &str,
    depth: usize,
    run: impl Fn(&mut Chooser),
) -> Result<Stats, Box<Counterexample>> {
    let started = Instant::now();
    let mut stats = Stats {
        name: name.to_owned(),
        depth,
        paths: 0,
        states: 0,
        longest_choices: 0,
        longest_steps: 0,
        elapsed: Duration::ZERO,
    };
    let mut prefix = Vec::new();
    let mut states = HashSet::new();
    loop {
        let mut chooser = Chooser::new(prefix, depth, false, states);
        let outcome = catch_unwind(AssertUnwindSafe(|| run(&mut chooser)));
        stats.paths += 1;
        stats.longest_choices = stats.longest_choices.max(chooser.taken.len());
        stats.longest_steps = stats.longest_steps.max(chooser.steps);
        if let Err(payload) = outcome {
            let choices: Vec<usize> = chooser.taken.iter().map(|t| t.pick).collect();
            return Err(Box::new(replay(
                name,
                depth,
                &choices,
                panic_message(&*payload),
                &run,
            )));
        }
        let next = chooser.next();
        states = std::mem::take(&mut chooser.states);
        match next {
            Some(p) => prefix = p,
            None => break,
        }
    }
    stats.states = states.len();
    stats.elapsed = started.elapsed();
    Ok(stats)
}

/// Runs `choices` again with tracing on, for the counterexample's steps.
fn replay(
    name: &str,
    depth: usize,
    choices: &[usize],
    message: String,
    run: &impl Fn(&mut Chooser),
) -> Counterexample {
    let mut chooser = Chooser::new(choices.to_vec(), depth, true, HashSet::new());
    let again = catch_unwind(AssertUnwindSafe(|| run(&mut chooser)));
    let message = match again {
        Err(payload) => panic_message(&*payload),
        Ok(()) => format!("{message} (did not happen again on replay: nondeterministic run)"),
    };
    Counterexample {
        name: name.to_owned(),
        depth,
        message,
        choices: choices.to_vec(),
        trace: chooser.trace,
    }
}

/// Explores with depths (fault budgets) 0, 1, … up to `max_depth` and
/// returns the first violation at the smallest depth that shows it, or
/// `None`.
pub fn shallowest(
    name: &str,
    max_depth: usize,
    run: impl Fn(&mut Chooser),
) -> Option<Box<Counterexample>> {
    (0..=max_depth).find_map(|depth| explore(name, depth, &run).err())
}
