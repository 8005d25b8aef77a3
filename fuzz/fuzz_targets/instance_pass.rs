//! `instance_pass`: an arbitrary instance (up to three services in and out
//! of ACTIVE, markers on predecessors and on ACTIVE's own containers,
//! routes held or not read, running or stopped intent), answers from a
//! steady world or arbitrary ones, abandoned at an arbitrary step or not.
//! `run_pass_and_check` asserts the pass's safety properties (see
//! fuzz/src/pass.rs); a violated property or a panic is a crash.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use stead_fuzz::machine::OutcomeSeed;
use stead_fuzz::pass::{run_pass_and_check, PassSeed, ServiceSeed};

/// Answers beyond this many are cycled (the pass is bounded).
const ANSWERS_MAX: usize = 64;

#[derive(Debug)]
struct Input {
    seed: PassSeed,
    answers: Vec<OutcomeSeed>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let mut services = Vec::new();
        for _ in 0..u.int_in_range(0..=3)? {
            services.push(ServiceSeed {
                in_active: u.ratio(4, 5)?,
                active_binds: u.arbitrary()?,
                active_verified: u.arbitrary()?,
                marker: u.arbitrary()?,
                route: u.arbitrary()?,
                memory_verified: u.arbitrary()?,
            });
        }
        let seed = PassSeed {
            stopped: u.ratio(1, 10)?,
            routes_read: u.arbitrary()?,
            services,
            abandon_after: if u.ratio(1, 4)? { u.arbitrary()? } else { 0 },
            steady: u.arbitrary()?,
        };
        let mut answers = Vec::new();
        while answers.len() < ANSWERS_MAX && !u.is_empty() {
            answers.push(OutcomeSeed {
                choice: u.arbitrary()?,
                status: u.arbitrary()?,
                execution: u.arbitrary()?,
                health: u.arbitrary()?,
                binds: u.arbitrary()?,
                took_ms: 0,
            });
        }
        Ok(Self { seed, answers })
    }
}

fuzz_target!(|input: Input| {
    run_pass_and_check(
        &input.seed.build(),
        &input.answers,
        input.seed.abandon_after,
        input.seed.steady,
    );
});
